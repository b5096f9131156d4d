"""Tests for replax/runtime.py: preemption, one run per workdir, a workdir bound to its
config, workdirs that cannot hold a run."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from test_trainer import MICRO, ROOT, read, run_train, strip_timing

from replax import runtime
from replax.config_utils import ConfigError


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The micro run, uninterrupted."""
    workdir = tmp_path_factory.mktemp("reference")
    proc = run_train(str(workdir))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return workdir


def start_and_wait(workdir, lines: int, *extra):
    """train.py started in the background, returned once metrics.jsonl has `lines`."""
    cmd = [
        sys.executable,
        "scripts/train.py",
        "--config=configs/arith.py",
        f"--workdir={workdir}",
        *MICRO,
        *extra,
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    metrics = workdir / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= lines:
            break
        time.sleep(0.02)
    return proc


def test_sigterm_checkpoints_the_step_and_the_rerun_continues_exactly(tmp_path, reference):
    workdir = tmp_path / "preempted"
    # Only the stop and the end save.
    proc = start_and_wait(workdir, 2, "--config.checkpoint_every=100")
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert time.time() - sent < 30
    assert proc.returncode == runtime.EXIT_PREEMPTED, stderr[-2000:]
    lines = [line for line in stderr.splitlines() if "SIGTERM" in line]
    assert len(lines) == 1 and "checkpoint written" in lines[0]
    stopped_at = len(read(str(workdir)))
    assert 2 <= stopped_at < 6
    assert os.listdir(workdir / "checkpoints") == [str(stopped_at)]
    resumed = run_train(str(workdir), "--config.checkpoint_every=100")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert strip_timing(read(str(workdir))) == strip_timing(read(str(reference)))


@pytest.mark.parametrize("seed", [0, 1])
def test_kill_9_at_a_random_point_then_the_rerun_continues_exactly(tmp_path, reference, seed):
    """SIGKILL anywhere (during a step, an evaluation or an asynchronous checkpoint
    write): the rerun resumes from the last complete checkpoint and ends as the
    uninterrupted run did."""
    rng = random.Random(seed)
    workdir = tmp_path / "killed"
    proc = start_and_wait(workdir, rng.randint(1, 5))
    time.sleep(rng.uniform(0.0, 0.5))
    proc.kill()
    proc.wait()
    resumed = run_train(str(workdir))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert strip_timing(read(str(workdir))) == strip_timing(read(str(reference)))


def test_an_overflowing_rate_skips_every_step_and_keeps_the_checkpoints_finite(tmp_path):
    workdir = tmp_path / "run"
    # The micro policy solves nothing (zero advantages): an entropy bonus gives it a
    # gradient, which the rate turns into an update that overflows.
    proc = run_train(
        str(workdir),
        "--config.optimizer.learning_rate=1e38",
        "--config.loss.entropy_coef=0.01",
        "--config.replay.drop_zero_advantage=False",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = read(str(workdir))
    assert [r["skipped_steps"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert all(r["grad_norm"] is not None for r in records)
    # Nothing moved: held-out accuracy is the base's at every evaluation.
    assert len({r["eval_accuracy"] for r in records if "eval_accuracy" in r}) == 1
    assert sorted(os.listdir(workdir / "checkpoints")) == ["3", "6"]


def test_a_second_process_on_the_workdir_exits_2_naming_the_holder(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    with runtime.WorkdirLock(str(workdir)):
        proc = run_train(str(workdir))
    assert proc.returncode == 2
    (line,) = [line for line in proc.stderr.splitlines() if line.strip()]
    assert f"in use by process {os.getpid()}" in line
    assert sorted(os.listdir(workdir)) == [".lock"]
    # Released (or its holder gone): the next run takes the lock.
    with runtime.WorkdirLock(str(workdir)):
        pass


def test_resuming_with_another_config_exits_2_naming_the_keys(tmp_path):
    workdir = tmp_path / "run"
    first = run_train(str(workdir), "--config.total_steps=3")
    assert first.returncode == 0, first.stderr[-2000:]
    before = sorted(os.listdir(workdir / "checkpoints"))
    proc = run_train(str(workdir), "--config.model.d_model=64", "--config.replay.capacity=64")
    assert proc.returncode == 2
    (line,) = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "model.d_model 32 -> 64" in line and "replay.capacity 32 -> 64" in line
    assert sorted(os.listdir(workdir / "checkpoints")) == before
    # How long to run and how often to evaluate may change.
    longer = run_train(str(workdir), "--config.total_steps=4", "--config.eval.every=2")
    assert longer.returncode == 0, longer.stderr[-2000:]
    assert [r["step"] for r in read(str(workdir))] == [1, 2, 3, 4]


def test_check_workdir(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        runtime.check_workdir(str(tmp_path / "file"))
    # A directory no one can write in, root included.
    with pytest.raises(ConfigError, match="not writable"):
        runtime.check_workdir("/proc/self/replax_run")
    runtime.check_workdir(str(tmp_path / "new" / "run"))  # created later, by the run


def test_check_resume_config_ignores_resumable_keys(tmp_path):
    config = {"total_steps": 10, "eval": {"every": 5}, "model": {"d_model": 32}}
    runtime.record_run_config(str(tmp_path), config)
    changed = {"total_steps": 20, "eval": {"every": 2}, "model": {"d_model": 32}}
    runtime.check_resume_config(str(tmp_path), changed, has_checkpoint=True)
    other = {**config, "model": {"d_model": 64}}
    with pytest.raises(ConfigError, match=r"model\.d_model 32 -> 64"):
        runtime.check_resume_config(str(tmp_path), other, has_checkpoint=True)
    # No checkpoint yet: nothing to protect.
    runtime.check_resume_config(str(tmp_path), other, has_checkpoint=False)
    assert json.loads((tmp_path / "config.json").read_text()) == config


def test_a_run_from_before_a_setting_existed_resumes_under_its_old_value(tmp_path):
    runtime.record_run_config(str(tmp_path), {"model": {"d_model": 32}})
    same = {"model": {"d_model": 32, "scan_layers": False}, "train": {"num_microbatches": 1}}
    runtime.check_resume_config(str(tmp_path), same, has_checkpoint=True)
    # Scanned layers store the params in another layout: that checkpoint cannot resume.
    scanned = {"model": {"d_model": 32, "scan_layers": True}}
    with pytest.raises(ConfigError, match=r"model\.scan_layers False -> True"):
        runtime.check_resume_config(str(tmp_path), scanned, has_checkpoint=True)
