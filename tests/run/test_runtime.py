"""Tests for replax/run/runtime.py: preemption, one run per workdir, a workdir bound to its
config, workdirs that cannot hold a run."""

import collections
import hashlib
import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from micro_run import MICRO, ROOT, read, run_train, strip_timing

from replax.core.config_utils import ConfigError
from replax.run import checkpoint, runtime


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


def test_a_rerun_past_a_damaged_checkpoint_says_so_in_one_line(tmp_path, reference):
    """The rerun's stderr is its progress lines and one line naming the damaged step and
    the step it resumes from: no traceback, nothing from libtpu. JAX chooses its platforms
    as it would for a user (no JAX_PLATFORMS), and libtpu's machine-wide lock is lifted,
    since another process holding it makes libtpu fail without a word."""
    workdir = tmp_path / "damaged"
    shutil.copytree(reference, workdir)
    _overwrite_largest_file(workdir / "checkpoints" / "6", random.Random(0))
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    proc = subprocess.run(
        [sys.executable, "scripts/train.py", "--config=configs/arith.py"]
        + [f"--workdir={workdir}", *MICRO],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if not line.startswith("step ")]
    assert len(said) == 1, proc.stderr
    assert re.fullmatch(
        r"checkpoint 6 .* does not match its checksum; .*; resuming from step 3", said[0]
    ), said
    assert strip_timing(read(str(workdir))) == strip_timing(read(str(reference)))


# The kill-and-damage matrix: checkpoints at every step, three kept.
EVERY_STEP = ("--config.checkpoint_every=1", "--config.checkpoint_keep=3")
KILL_POINTS = 22


def _committed_steps(workdir) -> list[int]:
    ckpts = workdir / "checkpoints"
    return sorted(int(n) for n in os.listdir(ckpts) if n.isdigit()) if ckpts.is_dir() else []


def _overwrite_largest_file(step_dir, rng) -> tuple[pathlib.Path, str]:
    """16 bytes of the largest file the checkpoint's seal lists (an array's data, not
    orbax's bookkeeping) overwritten with other bytes: a disk or object-store fault.
    Returns the file (relative to step_dir) and the SHA-256 of its new bytes."""
    sealed = step_dir / checkpoint.CHECKSUMS
    names = json.loads(sealed.read_text()) if sealed.exists() else []
    files = [step_dir / n for n in names] or [p for p in step_dir.rglob("*") if p.is_file()]
    target = max(files, key=lambda p: p.stat().st_size)
    raw = bytearray(target.read_bytes())
    at = rng.randrange(max(len(raw) - 16, 1))
    raw[at : at + 16] = bytes((b + 1) % 256 for b in raw[at : at + 16])
    target.write_bytes(bytes(raw))
    return target.relative_to(step_dir), hashlib.sha256(raw).hexdigest()


def _set_aside_unreported(workdir, damaged) -> None:
    """Drops from `damaged` the steps whose changed bytes lie in checkpoints_corrupt/STEP:
    a run set them aside and was killed before it printed so (the report names the step
    it resumes from, known only once that one is restored)."""
    for step, (name, digest) in list(damaged.items()):
        aside = workdir / "checkpoints_corrupt" / str(step) / name
        if aside.is_file() and hashlib.sha256(aside.read_bytes()).hexdigest() == digest:
            del damaged[step]


def test_kill_9_at_22_points_then_damage_never_restores_changed_bytes(tmp_path, reference):
    """SIGKILL at 22 seeded points of one run (at random times, inside a checkpoint's
    asynchronous write, inside its seal), each followed by overwriting bytes of the newest
    checkpoint's largest file. Each rerun reports the damaged checkpoint in one line and
    resumes from the newest intact one (or starts again); none restores a damaged one;
    the run ends exactly as the uninterrupted one did."""
    rng = random.Random(0)
    workdir = tmp_path / "matrix"
    # Steps whose bytes were changed and not yet set aside: (file, digest of its bytes).
    damaged: dict[int, tuple[pathlib.Path, str]] = {}
    endings = collections.Counter()
    for point in range(KILL_POINTS + 1):
        _set_aside_unreported(workdir, damaged)
        committed = _committed_steps(workdir)
        intact = [s for s in committed if s not in damaged]
        resume_at = max(intact, default=0)
        kind, env = ("write", "seal", "time")[point % 3], {}
        if point == KILL_POINTS:
            kind = "none"  # the last run goes to the end
        elif kind != "time":
            env = {"REPLAX_CRASH_AT": f"{kind}:{rng.randint(resume_at + 1, 6)}"}
        proc = subprocess.Popen(
            [
                sys.executable,
                "scripts/train.py",
                "--config=configs/arith.py",
                f"--workdir={workdir}",
                *MICRO,
                *EVERY_STEP,
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if kind == "time":
            try:
                proc.wait(timeout=rng.uniform(1.0, 12.0))
            except subprocess.TimeoutExpired:
                proc.kill()
        stdout, stderr = proc.communicate(timeout=600)
        lines = stdout.splitlines() + stderr.splitlines()
        # What the run said about its checkpoints.
        resumed = [int(line.split()[-1]) for line in lines if line.startswith("resumed from step")]
        reports = [line for line in lines if line.startswith("checkpoint ")]
        for line in reports:
            step = int(line.split()[1])
            assert step in damaged, f"point {point}: an intact checkpoint was set aside: {line}"
            del damaged[step]
            expected = (
                f"resuming from step {resume_at}"
                if resume_at
                else "the run starts again from step 0"
            )
            assert line.endswith(expected), (point, line, resume_at)
        assert not (set(resumed) & set(damaged) | set(resumed) - {resume_at}), (
            point,
            resumed,
            lines,
        )
        if kind == "none":
            assert proc.returncode == 0, stderr[-3000:]
            break
        assert proc.returncode == -signal.SIGKILL or kind == "time", (point, stderr[-3000:])
        # How this run began (after the previous point's damage), and how it ended.
        if reports:
            endings[
                "began: reported the damaged checkpoint, "
                + ("resumed from the one before" if resume_at else "started again")
            ] += 1
        elif resumed:
            endings["began: resumed (nothing damaged was left)"] += 1
        else:
            endings["began: killed before it restored"] += 1
        ended = "killed" if proc.returncode == -signal.SIGKILL else "finished first"
        endings[f"ended: {kind} kill, {ended}"] += 1
        committed = _committed_steps(workdir)
        if committed:
            step_dir = workdir / "checkpoints" / str(committed[-1])
            damaged[committed[-1]] = _overwrite_largest_file(step_dir, rng)
    _set_aside_unreported(workdir, damaged)
    assert not damaged
    assert strip_timing(read(str(workdir))) == strip_timing(read(str(reference)))
    print("\n".join(f"{n:3d}  {ending}" for ending, n in sorted(endings.items())))


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
    # A directory no one can make files in, root included: what is wrong is said as it
    # is (the folder exists; no file can be made in it), not as a permission.
    with pytest.raises(
        ConfigError,
        match=r"^--workdir=/proc/self/replax_run cannot be created: /proc/self cannot hold "
        r"new files \(No such file or directory\)$",
    ):
        runtime.check_workdir("/proc/self/replax_run")
    with pytest.raises(ConfigError, match=r"^--workdir=/proc/self cannot hold new files"):
        runtime.check_workdir("/proc/self")
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


def test_a_setting_that_does_nothing_in_either_run_is_no_change(tmp_path):
    """Auto mode's keys, added with defaults other than their old values, do nothing in a
    fixed-mode run: one from before they existed resumes under today's defaults. In auto
    mode the same change parts the runs and is refused."""
    old = {"replay": {"mode": "fixed", "capacity": 64}}
    (tmp_path / "fixed").mkdir(), (tmp_path / "auto").mkdir()
    today = {"replay": {**old["replay"], "auto_min_y": 1.0, "auto_onpolicy_batches": 2}}
    runtime.record_run_config(str(tmp_path / "fixed"), old)
    runtime.check_resume_config(str(tmp_path / "fixed"), today, has_checkpoint=True)
    runtime.record_run_config(str(tmp_path / "auto"), {"replay": {**old["replay"], "mode": "auto"}})
    auto_today = {"replay": {**today["replay"], "mode": "auto"}}
    with pytest.raises(ConfigError, match=r"replay\.auto_onpolicy_batches 1 -> 2"):
        runtime.check_resume_config(str(tmp_path / "auto"), auto_today, has_checkpoint=True)
