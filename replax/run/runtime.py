"""What keeps a run safe on a shared, preemptible machine.

- `check_workdir`: the workdir can be a run's directory (not a file, writable), before
  anything is written.
- `WorkdirLock`: one run per workdir; a second one is refused with the holder's
  process id, and a lock whose holder died is taken over (the kernel drops an flock with
  its process). A run of several processes is one run: process 0 holds the lock.
- `check_resume_config`: a workdir that holds a checkpoint belongs to one configuration;
  resuming it with settings that change what the checkpoint means is refused, naming
  the keys. Settings of how long and how often (total_steps, eval, logging) may change.
- `StopRequest`: SIGTERM and SIGINT ask the loop to stop after the current step; the
  loop writes a checkpoint and exits with status `EXIT_PREEMPTED`. A second signal
  stops at once. The warm start polls it between SFT steps and stops the same way,
  caching nothing.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import tempfile
from typing import Any

import jax
import numpy as np

from replax.config.migration import migrate, without_inert
from replax.core import config_utils, processes
from replax.core.config_utils import ConfigError

# Exit status of a run stopped by SIGTERM / SIGINT after it checkpointed: run the same
# command again to continue.
EXIT_PREEMPTED = 3
RUN_CONFIG_FILE = "config.json"
# Keys a resumed run may change: they say how long to run and how often to evaluate,
# log and save, not what the saved state is.
RESUMABLE_KEYS = (
    "total_steps",
    "total_rollouts",
    "eval.",
    "log.",
    "log_every",
    "checkpoint_every",
    "checkpoint_keep",
    "task.data_dir",
    "warmstart.cache_dir",
)


def check_workdir(workdir: str) -> None:
    """Raises ConfigError (one line) when workdir cannot hold a run; writes nothing."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ConfigError(f"--workdir={workdir} is a file: it must be a directory")
    existing = os.path.abspath(workdir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    # A probe file, not os.access: permission bits do not bind root, read-only mounts do.
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".replax_probe_")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        # Permission bits or a read-only mount say "not writable"; anything else (e.g.
        # /proc, where a directory exists but no file can be made) is said as it is.
        denied = e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        what = "is not writable" if denied else "cannot hold new files"
        if existing == os.path.abspath(workdir):
            raise ConfigError(f"--workdir={workdir} {what} ({e.strerror})") from None
        raise ConfigError(
            f"--workdir={workdir} cannot be created: {existing} {what} ({e.strerror})"
        ) from None


class WorkdirLock:
    """An exclusive lock on workdir/.lock for the life of a run, held by process 0 (with
    several processes the others stop with it when it is refused)."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, ".lock")
        self._file = None

    def acquire(self) -> WorkdirLock:
        refused = None
        if jax.process_index() == 0:
            try:
                self._acquire()
            except Exception as e:  # noqa: BLE001 - re-raised once every process knows
                refused = e
        if processes.from_process_zero(np.int32(refused is not None)) and refused is None:
            raise ConfigError(f"--workdir={os.path.dirname(self.path)}: process 0 stopped")
        if refused is not None:
            raise refused
        return self

    def _acquire(self) -> None:
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise ConfigError(
                f"--workdir={os.path.dirname(self.path)} is in use by process {holder}: "
                "one run per workdir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _resumable(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESUMABLE_KEYS)


def check_resume_config(workdir: str, config: dict[str, Any], has_checkpoint: bool) -> None:
    """Compares config with the one workdir's run started with (workdir/config.json) when
    the workdir holds a checkpoint; raises ConfigError naming the keys that differ. Writes
    nothing: `record_run_config` does, once the run is under way."""
    path = os.path.join(workdir, RUN_CONFIG_FILE)
    if not has_checkpoint or not os.path.exists(path):
        return
    try:
        with open(path) as f:
            stored = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is unreadable ({e}): move it away to resume") from None
    current = config_utils.flatten(json.loads(json.dumps(config, default=list)))
    # A config.json from before a setting existed resumes under the setting's old value
    # (replax.config.migration); a setting the current config does not have either is no
    # change, nor is one that does nothing in either run (migration.INERT_UNLESS).
    written = config_utils.flatten(stored)
    saved = {
        k: v
        for k, v in config_utils.flatten(migrate(stored)).items()
        if k in written or k in current
    }
    saved, current = without_inert(saved), without_inert(current)
    changed = sorted(
        key
        for key in set(saved) | set(current)
        if not _resumable(key) and saved.get(key, "<absent>") != current.get(key, "<absent>")
    )
    if changed:
        detail = ", ".join(
            f"{k} {saved.get(k, '<absent>')!r} -> {current.get(k, '<absent>')!r}"
            for k in changed[:4]
        )
        more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
        raise ConfigError(
            f"--workdir={workdir} holds a checkpoint of another config: {detail}{more}; "
            "use a new workdir (total_steps, eval.*, log_every, checkpoint_every may change)"
        )


def record_run_config(workdir: str, config: dict[str, Any]) -> None:
    """Writes workdir/config.json (atomically, on process 0): the config the run's
    checkpoints mean."""
    if jax.process_index() != 0:
        return
    path = os.path.join(workdir, RUN_CONFIG_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(config, f, indent=1, sort_keys=True, default=list)
    os.replace(tmp, path)


class StopRequest:
    """Turns SIGTERM and SIGINT into a request the loop polls between steps; the previous
    handlers come back on `restore()` or at the second signal (which then acts at once)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> StopRequest:
        try:
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: signals stay as they are
            self._previous.clear()
        return self

    def _handle(self, signum, frame) -> None:
        del frame
        self.signal_name = signal.Signals(signum).name
        self.restore()  # a second signal is not caught

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @property
    def requested(self) -> bool:
        return self.signal_name is not None


class Preempted(Exception):
    """The run stopped on a signal after writing the checkpoint of `step`."""

    def __init__(self, signal_name: str, step: int, message: str | None = None):
        super().__init__(
            message
            or f"stopped by {signal_name} after step {step}, checkpoint written: run the same "
            "command to continue"
        )
        self.step = step
