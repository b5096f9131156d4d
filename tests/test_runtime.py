"""Tests for replax/runtime.py: preemption, one run per workdir, a workdir bound to its
config, workdirs that cannot hold a run."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from test_trainer import MICRO, ROOT, read, run_train, strip_timing

from replax import runtime
from replax.config_utils import ConfigError


def test_sigterm_checkpoints_the_step_and_the_rerun_continues_exactly(tmp_path):
    reference = tmp_path / "reference"
    assert run_train(str(reference)).returncode == 0
    workdir = tmp_path / "preempted"
    cmd = [
        sys.executable,
        "scripts/train.py",
        "--config=configs/arith.py",
        f"--workdir={workdir}",
        *MICRO,
        "--config.checkpoint_every=100",  # only the stop and the end save
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    metrics = workdir / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
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
