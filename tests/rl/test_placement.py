"""Tests for replax/rl/placement.py: the fixed schedule of disjoint placement, by hand and
against its bounds, and the sampler's device count (the sampler's thread, through whole
runs: tests/run/test_disjoint.py)."""

import pytest

from replax.rl import placement


@pytest.mark.parametrize("k, lag, sync", [(1, 1, 1), (1, 0, 1), (2, 1, 1), (3, 2, 2), (4, 9, 3)])
def test_plan_keeps_the_lag_bound_and_one_generation_in_flight(k, lag, sync):
    plan = placement.Plan(steps_per_generation=k, max_policy_lag=lag, sync_every=sync)
    for g in range(1, 40):
        t, v = plan.added_at(g), plan.started_at(g)
        assert t == g * k
        assert t - v <= lag  # the fresh rollouts' policy lag
        assert v >= plan.added_at(g - 1)  # after the previous generation was consumed
        assert v % sync == 0 or v == t  # weights move at sync points (or when due)
        assert plan.consumed_at(t) == g
        for step in range(v + 1, t + 1):  # checkpoints after v hold g as pending
            assert plan.in_flight_after(step) == g


def test_plan_by_hand():
    one_off = placement.Plan(steps_per_generation=1, max_policy_lag=1, sync_every=1)
    assert [one_off.started_at(g) for g in range(4)] == [0, 0, 1, 2]
    assert [one_off.in_flight_after(s) for s in range(1, 4)] == [1, 2, 3]
    synchronous = placement.Plan(steps_per_generation=1, max_policy_lag=0, sync_every=1)
    assert [synchronous.started_at(g) for g in range(4)] == [0, 1, 2, 3]
    assert synchronous.in_flight_after(3) is None
    # K = 4, L = 3, S = 2: generation 1 (added at 4) may start at 1, the weights move at 2.
    sparse = placement.Plan(steps_per_generation=4, max_policy_lag=3, sync_every=2)
    assert [sparse.started_at(g) for g in range(3)] == [0, 2, 6]
    assert [sparse.consumed_at(s) for s in range(6)] == [0, None, None, None, 1, None]


def test_sampler_device_count_by_hand():
    # Colocated takes no devices of its own; disjoint takes rollout.num_devices, or half.
    assert placement.sampler_device_count("colocated", 0, 8) == 0
    assert placement.sampler_device_count("disjoint", 0, 8) == 4
    assert placement.sampler_device_count("disjoint", 3, 8) == 3
    assert placement.sampler_device_count("disjoint", 0, 5) == 2
