"""Tests for replax/replay/schedules.py: the fixed-mode schedule (auto mode's controller is
tests/replay/test_auto.py's)."""

from replax.replay.schedules import NO_AGE_LIMIT, EveryStep, Schedule


def test_every_step_generates_each_step_with_a_fixed_age_limit():
    schedule = EveryStep(max_age=3)
    assert isinstance(schedule.half_batch_stats, bool) and not schedule.half_batch_stats
    assert all(schedule.should_generate(step) for step in range(5))
    assert all(schedule.should_train(step) for step in range(5))
    assert not schedule.varies_training and not schedule.draw_once
    schedule.observe(gen_s=1.0, train_s=2.0, stats={"loss": 0.0}, kept=4)
    assert schedule.max_age() == 3
    assert schedule.metrics() == {} and schedule.state_dict() is None


def test_no_age_limit_fits_an_int32_and_limits_nothing():
    assert EveryStep().max_age() == NO_AGE_LIMIT == 2**30 < 2**31 - 1


def test_every_step_has_the_schedule_interface():
    names = ("should_generate", "should_train", "max_age", "observe", "metrics", "state_dict")
    for name in names:
        assert callable(getattr(EveryStep(), name)), name
    assert set(Schedule.__annotations__) == {"half_batch_stats", "varies_training", "draw_once"}
