"""Tests for replax/run/steps.py: a step's cost in the compute account, what the schedule
is told, the step's record, and disjoint placement's lag (the loop itself runs end to end
in tests/run/test_trainer.py and tests/run/test_disjoint.py)."""

import functools
import types

import numpy as np
import pytest
from conftest import TINY

from replax.model import flops as flops_lib
from replax.rl import rollouts
from replax.run import metrics as metrics_lib
from replax.run import steps
from replax.run.disjoint import DisjointRollouts


def _run():
    spec = types.SimpleNamespace(
        rollout=types.SimpleNamespace(max_prompt_len=6, max_new_tokens=10, stream=False),
        train=types.SimpleNamespace(batch_size=8),
    )
    return types.SimpleNamespace(
        spec=spec, rollouts_per_step=4, model_config=TINY, seq_len=16, mesh=None, rules=None
    )


class _Schedule:
    def __init__(self):
        self.seen = []

    def observe(self, **kwargs):
        self.seen.append(kwargs)

    def metrics(self):
        return {"schedule_metric": 1}


def _loop():
    return types.SimpleNamespace(
        account=metrics_lib.ComputeAccount(),
        schedule=_Schedule(),
        reward_errors=0,
        skipped_steps=0,
    )


def _fresh(lengths):
    made = rollouts.nothing_generated(4, 6, 10)
    made.lengths, made.reward_mean = np.asarray(lengths), 0.5
    return steps.StepRollouts(made, generated=True, gen_s=2.0)


def test_a_generating_step_counts_its_tokens_flops_and_seconds():
    run, account = _run(), metrics_lib.ComputeAccount()
    steps.account_step(account, run, np.array([3, 10, 5, 7]), 2.0, 0.5)
    steps.account_step(account, run, None, 0.0, 0.5)  # a step that generated nothing
    assert (account.gen_tokens, account.gen_rollouts, account.train_rollouts) == (25, 4, 16)
    want = flops_lib.generate_flops(TINY, 4, 6, 10, 16)
    assert account.gen_flops == want and account.steps == 2
    assert account.train_flops == 2 * flops_lib.train_flops(TINY, 8, 16)
    assert account.train_cost == 16.0
    assert account.mu_measured() == (2.0 / 4) / (1.0 / 16)


def test_a_step_with_more_passes_costs_more():
    """A step that also ran a whole forward (a KL reference's) and a forward and backward
    of a quarter of the batch counts their FLOPs, and its 8 rollouts cost 8 x (2.25 + 2.5)
    / 3 = 12.67 rollouts trained in a plain step."""
    run, account = _run(), metrics_lib.ComputeAccount()
    passes = flops_lib.TrainPasses(forward=2.25, backward=1.25)
    steps.account_step(account, run, None, 0.0, 0.5, passes=passes)
    assert account.train_flops == pytest.approx(4.75 / 3 * flops_lib.train_flops(TINY, 8, 16))
    assert account.train_cost == pytest.approx(8 * 4.75 / 3) and account.train_rollouts == 8


def test_a_step_on_another_batch_counts_the_rollouts_it_trained_on():
    """Auto mode's on-policy step trains on its own batch (here 24, not train.batch_size
    8): its rollouts, FLOPs and cost are the batch's, and it is one update."""
    run, account = _run(), metrics_lib.ComputeAccount()
    steps.account_step(account, run, None, 0.0, 0.5, batch_size=24)
    steps.account_step(account, run, None, 0.0, 0.5)
    assert (account.train_rollouts, account.updates, account.train_cost) == (32, 2, 32.0)
    assert account.train_flops == pytest.approx(
        flops_lib.train_flops(TINY, 24, 16) + flops_lib.train_flops(TINY, 8, 16)
    )
    steps.account_step(account, run, None, 0.0, 0.0, trained=False)
    assert (account.train_rollouts, account.updates, account.steps) == (32, 2, 3)


def test_the_record_tells_the_schedule_what_the_step_took():
    run, loop = _run(), _loop()
    stats = {"rollouts_kept": 3, "rollout_entropy": np.float32(0.75)}
    step_metrics = {"loss": 0.1, "forward_passes": 2.0, "backward_passes": 1.0}
    record = steps.step_record(run, loop, _fresh([1, 2, 3, 4]), stats, step_metrics, 0.5, 0.0)
    assert loop.schedule.seen == [{"gen_s": 2.0, "train_s": 0.5, "stats": step_metrics, "kept": 3}]
    # The step's passes, from its metrics: a forward more than a plain step's.
    assert loop.account.train_cost == pytest.approx(8 * 4 / 3)
    assert record["gen_tokens_per_s"] == 10 / 2.0 and record["rollout_entropy"] == 0.75
    assert record["reward_mean"] == 0.5 and record["schedule_metric"] == 1
    idle = steps.StepRollouts(steps.nothing_generated(run), generated=False, gen_s=0.0)
    step_metrics = {"loss": 0.2, "forward_passes": 1.0, "backward_passes": 1.0}
    record = steps.step_record(run, loop, idle, stats, step_metrics, 0.5, 0.0)
    assert loop.schedule.seen[-1]["gen_s"] is None and loop.schedule.seen[-1]["kept"] is None
    assert record["gen_tokens_per_s"] is None and record["rollout_entropy"] is None


def test_a_step_without_generation_takes_the_idle_rollouts():
    run = _run()
    idle = steps.nothing_generated(run)
    fresh = steps.fresh_rollouts(run, None, 3, None, iter(()), None, False, idle)
    assert fresh.rollouts is idle and not fresh.generated and fresh.gen_s == 0.0
    assert idle.prompt_ids.shape == (4, 6) and idle.completion["tokens"].shape == (4, 10)


def test_disjoint_lag_counts_steps_behind_the_generating_policy():
    loop = _loop()
    loop.account.train_s, loop.account.gen_rollouts, loop.account.train_rollouts = 1.0, 8, 24
    disjoint = types.SimpleNamespace(
        spans={5: (10.0, 11.0)}, consumed=5, busy_s=2.0, sync_s=0.1, sync_bytes=64, wait_s=0.3
    )
    disjoint.policy_lag = functools.partial(DisjointRollouts.policy_lag, disjoint)
    fresh = steps.StepRollouts(None, generated=True, gen_s=1.0, version=7, disjoint=True)
    record = steps.placement_record(disjoint, loop, 9, fresh, t_start=9.0)
    assert record["policy_lag_mean"] == record["policy_lag_max"] == 2
    assert (record["gen_start_s"], record["gen_end_s"]) == (1.0, 2.0)
    assert record["replay_ratio_realised"] == 3.0 and record["sync_bytes"] == 64
    assert not disjoint.spans  # the span is reported once
