"""Tests for replax/run/disjoint.py, the sampler's thread of disjoint placement, through
whole runs: a disjoint run against a colocated one, through the rollout engine, the
policy-lag bookkeeping, steps per generation, resume with a generation in flight, a bad
placement, and generation beside training (the schedule itself: tests/rl/test_placement.py)."""

import json
import os

import numpy as np
import pytest
import xla_flags
from micro_run import read, run_train

from replax.rl import rollouts
from replax.run import disjoint, metrics

TIMING = metrics.TIMING_KEYS
PLACEMENT_KEYS = (
    "policy_lag_mean",
    "policy_lag_max",
    "sampler_busy_frac",
    "trainer_busy_frac",
    "sync_s",
    "sync_bytes",
    "wait_s",
    "replay_ratio_realised",
)
DISJOINT = ("--config.rollout.placement=disjoint",)


def without(records, keys):
    return [{k: v for k, v in r.items() if k not in keys} for r in records]


def test_a_pending_generation_goes_to_the_host_and_back_unchanged():
    # What a checkpoint stores of a generation in flight (R = 2 rows, prompts of 3 tokens,
    # completions of 2) and what a resumed run rebuilds from it.
    fresh = rollouts.Fresh(
        prompt_ids=np.array([[1, 2, 3], [4, 5, 6]], np.int32),
        prompt_mask=np.ones((2, 3), bool),
        completion={"tokens": np.array([[7, 8], [9, 0]], np.int32), "mask": np.eye(2, dtype=bool)},
        rewards=np.array([1.0, 0.0], np.float32),
        reward_mean=0.5,
        reward_errors=1,
        lengths=np.array([2, 1]),
        diagnostics={"completion_len_mean": np.float32(1.5), "reward_std": None},
        decoded_row_steps=4,
    )
    pending = disjoint._fresh_to_host(fresh, generation=3, version=2)
    assert (pending["generation"], pending["version"]) == (3, 2)
    assert pending["diagnostics"] == {"completion_len_mean": 1.5, "reward_std": None}
    json.dumps({k: v for k, v in pending.items() if k != "arrays"})  # the loop state's part
    back = disjoint._fresh_from_host(pending)
    for name in ("prompt_ids", "prompt_mask", "rewards", "lengths"):
        np.testing.assert_array_equal(getattr(back, name), getattr(fresh, name))
    assert back.completion.keys() == fresh.completion.keys()
    for k, v in fresh.completion.items():
        np.testing.assert_array_equal(back.completion[k], v)
    assert (back.reward_mean, back.reward_errors, back.decoded_row_steps) == (0.5, 1, 4)
    assert back.diagnostics == pending["diagnostics"]


@pytest.fixture(scope="module")
def disjoint_run(tmp_path_factory):
    """A disjoint run with a lag of 1 (4 sampler and 4 trainer devices), uninterrupted."""
    workdir = str(tmp_path_factory.mktemp("disjoint"))
    proc = run_train(workdir, *DISJOINT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read(workdir)


def test_disjoint_without_lag_trains_exactly_as_colocated(tmp_path):
    # The sampler's 4 devices and the trainer's 4 against one process of 4 devices doing
    # both: with max_policy_lag = 0 the same programs see the same inputs.
    disjoint, colocated = str(tmp_path / "disjoint"), str(tmp_path / "colocated")
    proc = run_train(disjoint, *DISJOINT, "--config.rollout.max_policy_lag=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    four = {"XLA_FLAGS": xla_flags.with_devices(4)}
    proc = run_train(colocated, env=four)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = read(disjoint)
    assert [r["policy_lag_max"] for r in got] == [0] * len(got)
    assert without(got, TIMING + PLACEMENT_KEYS) == without(read(colocated), TIMING)


def test_a_run_through_the_rollout_engine_does_not_depend_on_its_slots(tmp_path):
    """rollout.slots > 0 generates through the engine. Colocated on 4 devices with 4
    slots refilled every step, and disjoint without lag on 4 sampler devices with 8 slots
    refilled every 3 steps, decode each step's 8 rollouts in other slots and orders: the
    same run (every value but timing, placement, and the row-steps the slots cost)."""
    disjoint, colocated = str(tmp_path / "disjoint"), str(tmp_path / "colocated")
    engine = lambda slots, k: (
        f"--config.rollout.slots={slots}",
        f"--config.rollout.refill_every={k}",
    )
    proc = run_train(disjoint, *DISJOINT, "--config.rollout.max_policy_lag=0", *engine(8, 3))
    assert proc.returncode == 0, proc.stderr[-3000:]
    four = {"XLA_FLAGS": xla_flags.with_devices(4)}
    proc = run_train(colocated, *engine(4, 1), env=four)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The behaviour log-probs agree to float32 rounding (sums in another order at another
    # batch shape), so their mean, rollout_entropy, is compared to 1e-6.
    cost = ("gen_flops", "useful_row_step_frac", "mu_measured", "rollout_entropy")
    got, want = read(disjoint), read(colocated)
    assert without(got, TIMING + PLACEMENT_KEYS + cost) == without(want, TIMING + cost)
    for a, b in zip(got, want):
        assert a["rollout_entropy"] == pytest.approx(b["rollout_entropy"], rel=1e-6)
    assert all(0 < r["useful_row_step_frac"] <= 1 for r in got + want)


def test_disjoint_rollouts_are_one_step_behind_and_age_from_their_policy(disjoint_run):
    records = disjoint_run
    assert [r["policy_lag_mean"] for r in records] == [0] + [1] * (len(records) - 1)
    assert all(r["policy_lag_max"] == r["policy_lag_mean"] for r in records)
    # R = 8 fresh rollouts a step, B = 16 trained on: each is trained on twice.
    assert all(r["replay_ratio_realised"] == 2.0 for r in records)
    for r in records:
        assert 0 <= r["sampler_busy_frac"] <= 1 and 0 < r["trainer_busy_frac"] <= 1
    # A batch drawn at step s holds rollouts of policies up to s - 1: the youngest is 1.
    assert all(r["replay_age_mean"] >= 1 for r in records[1:])


def test_disjoint_steps_per_generation(tmp_path):
    proc = run_train(str(tmp_path), *DISJOINT, "--config.train.max_steps_per_generation=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read(str(tmp_path))
    # Generations enter at steps 0, 2, 4 (records are numbered after their step).
    generated = [r["step"] - 1 for r in records if r["reward_mean"] is not None]
    assert generated == [0, 2, 4]
    assert records[-1]["gen_rollouts"] == 3 * 8
    assert records[-1]["replay_ratio_realised"] == 6 * 16 / 24


def test_resume_with_a_generation_in_flight_is_exact(tmp_path, disjoint_run):
    # Killed while writing checkpoint 6: checkpoint 3 holds generation 3 (started at step
    # 2, added at 3) as `pending`, and the resumed run adds it as the uninterrupted one did.
    workdir = str(tmp_path)
    proc = run_train(workdir, *DISJOINT, env={"REPLAX_CRASH_AT": "write:6"})
    assert proc.returncode != 0
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "3", "pending"))
    with open(os.path.join(workdir, "checkpoints", "3", "loop_state", "metadata")) as f:
        assert json.load(f)["pending"]["generation"] == 3
    proc = run_train(workdir, *DISJOINT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from step 3" in proc.stdout + proc.stderr
    assert without(read(workdir), TIMING) == without(disjoint_run, TIMING)


def test_a_bad_placement_exits_2_before_anything_is_written(tmp_path):
    # Every bad placement setting is a row of tests/config/test_build.py's BAD_SETTINGS
    # (and of docs/bad_input.md, each run as this one); here the whole script, once.
    workdir = str(tmp_path / "run")
    proc = run_train(workdir, *DISJOINT, "--config.rollout.num_devices=8")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "rollout.num_devices=8 of 8 devices" in lines[0], proc.stderr
    assert not os.path.exists(workdir)


def test_the_sampler_generates_while_the_trainer_trains(tmp_path):
    # K = 4 train steps per generation, lag 4: generation g + 1 is handed to the sampler at
    # step t_g = 4g and decodes while the trainer takes steps 4g .. 4g + 3. Scoring sleeps
    # 0.4 s a generation (benchmarks/slow_reward.py: a verifier's wait, which frees the
    # cores), so each side has real work to hide behind the other's on 2 loaded cores.
    k = 4
    proc = run_train(
        str(tmp_path),
        *DISJOINT,
        f"--config.train.max_steps_per_generation={k}",
        f"--config.rollout.max_policy_lag={k}",
        "--config.task.reward_s=0.4",
        "--config.task.completions=8",
        "--config.eval.every=0",
        "--config.total_steps=24",
        "--config.checkpoint_every=24",
        config="scripts/benchmarks/slow_reward_config.py",
        env={"PYTHONPATH": os.pathsep.join(["scripts", os.environ.get("PYTHONPATH", "")])},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read(str(tmp_path))
    train = {r["step"] - 1: (r["train_start_s"], r["train_end_s"]) for r in records}
    gen = {
        (r["step"] - 1) // k: (r["gen_start_s"], r["gen_end_s"])
        for r in records
        if r["gen_start_s"] is not None
    }
    assert sorted(gen) == list(range(6))
    # The window after compilation: steps 8 .. 19, during which generations 3 .. 5 run.
    steps, generations = range(8, 20), range(3, 6)
    overlap = lambda a, b: max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    for g in generations:
        window = [train[t] for t in range(k * (g - 1), k * g)]  # the steps it runs beside
        # It starts before those train steps end, and is busy for at least half of their
        # train seconds (a trainer that waited for it would overlap none of them).
        assert gen[g][0] < window[-1][1], (g, gen[g], window)
        busy_beside = sum(overlap(gen[g], span) for span in window)
        assert busy_beside >= 0.5 * sum(end - start for start, end in window), (g, gen[g], window)
    # A trainer that waited for each generation right after handing it over would need at
    # least the sum of both sides' busy seconds; overlapped, at least half of the smaller
    # side's seconds are hidden behind the other's.
    gen_busy = sum(gen[g][1] - gen[g][0] for g in generations)
    train_busy = sum(train[t][1] - train[t][0] for t in steps)
    wall = max(train[steps[-1]][1], gen[generations[-1]][1]) - min(
        train[steps[0]][0], gen[generations[0]][0]
    )
    hidden = gen_busy + train_busy - wall
    assert hidden >= 0.5 * min(gen_busy, train_busy), (wall, gen_busy, train_busy)
