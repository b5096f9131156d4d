"""Tests for replax/run/streaming.py, disjoint placement through the stream, by whole
micro runs: the lag bound and what it drops, each token's version, resume with rows in
flight (the stream itself: tests/sampling/test_stream.py)."""

import json
import os

import pytest
from micro_run import read, run_train

from replax.run import metrics

# The sampler's 4 devices hold 4 slots, refilled every 2 decode steps; R = 8 a step.
STREAM = (
    "--config.rollout.placement=disjoint",
    "--config.rollout.stream=True",
    "--config.rollout.slots=4",
    "--config.rollout.refill_every=2",
)
# Scoring that waits 0.1 s a completion (benchmarks/slow_reward.py: a verifier's wait), so
# that the sampler is still scoring the next batch when the trainer checkpoints (with no
# evaluation before it to wait out).
SLOW = dict(
    config="scripts/benchmarks/slow_reward_config.py",
    env={"PYTHONPATH": os.pathsep.join(["scripts", os.environ.get("PYTHONPATH", "")])},
)
SLOW_FLAGS = ("--config.task.reward_s=0.8", "--config.task.completions=8", "--config.eval.every=0")


def without_timing(records):
    return [{k: v for k, v in r.items() if k not in metrics.TIMING_KEYS} for r in records]


@pytest.fixture(scope="module")
def lag2_run(tmp_path_factory):
    """max_policy_lag = 2 (= 2 K + S - 1): a group queued behind the batch that fills."""
    workdir = str(tmp_path_factory.mktemp("stream"))
    proc = run_train(workdir, *STREAM, *SLOW_FLAGS, "--config.rollout.max_policy_lag=2", **SLOW)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read(workdir)


def test_a_stream_keeps_every_group_within_its_lag_and_stamps_each_token(lag2_run):
    records = lag2_run
    assert [r["gen_rollouts"] for r in records] == [8 * (i + 1) for i in range(6)]
    assert all(r["groups_dropped"] == 0 for r in records)
    # Batch 0 was made with the first weights; after it, by V(a) = a // P - 1, groups are
    # one or two steps behind the step that takes them, and never more than the bound.
    assert records[0]["policy_lag_max"] == 0
    assert all(1 <= r["policy_lag_mean"] <= r["policy_lag_max"] <= 2 for r in records[1:])
    # A token is sampled under its group's version or a newer one: its lag is no larger.
    assert all(0 <= r["token_lag_mean"] <= r["policy_lag_mean"] for r in records)
    assert any(r["token_lag_mean"] < r["policy_lag_mean"] for r in records)
    # The store keeps each token's version: the batch trained on at every step reports its
    # tokens' mean age, within its rollouts' ages and below them once versions mix.
    ages = [
        (r["replay_token_age_mean"], r["replay_age_mean"], r["replay_age_max"]) for r in records
    ]
    assert all(0 <= token <= oldest for token, _, oldest in ages), ages
    assert any(token < row for token, row, _ in ages), ages
    assert all(0 < r["useful_row_step_frac"] <= 1 for r in records)


def test_groups_past_the_lag_are_dropped_and_counted(tmp_path):
    # At the least lag allowed (K + S - 1 = 1) the generation queued behind the one
    # filling a batch completes a batch later, one step too old: dropped, not trained on.
    proc = run_train(str(tmp_path), *STREAM, "--config.rollout.max_policy_lag=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read(str(tmp_path))
    assert all(r["policy_lag_max"] <= 1 for r in records)
    dropped = [r["groups_dropped"] for r in records]
    assert dropped == sorted(dropped) and dropped[-1] > 0
    # Every step still takes R = 8 rollouts that kept within the bound.
    assert records[-1]["gen_rollouts"] == 6 * 8


def test_resume_with_rows_in_flight_is_exact(tmp_path, lag2_run):
    # Killed while writing checkpoint 6: checkpoint 3 holds the stream with rows queued
    # and decoding, taken once the sampler (slower than the trainer: its scoring waits)
    # needed weights not handed over yet, V(a) = a // 2 - 1 >= 3; the resumed run ends
    # where the uninterrupted one does.
    workdir = str(tmp_path)
    flags = (*STREAM, *SLOW_FLAGS, "--config.rollout.max_policy_lag=2")
    crash = {"env": {**SLOW["env"], "REPLAX_CRASH_AT": "write:6"}}
    proc = run_train(workdir, *flags, **{**SLOW, **crash})
    assert proc.returncode != 0
    with open(os.path.join(workdir, "checkpoints", "3", "loop_state", "metadata")) as f:
        pending = json.load(f)["pending"]
    assert pending["stream"] == 1 and pending["queued"] + pending["decoding"] > 0, pending
    assert pending["accepted"] // 2 - 1 >= 3, pending
    proc = run_train(workdir, *flags, **SLOW)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from step 3" in proc.stdout + proc.stderr
    assert without_timing(read(workdir)) == without_timing(lag2_run)
