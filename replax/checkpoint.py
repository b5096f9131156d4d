"""One orbax checkpoint per saved step: train state (params, optimizer state), replay
store, loop state (step, compute account, schedule), and the grain iterator.

Saving is asynchronous (orbax CheckpointManager): the loop goes on while arrays are
written. Once a save has finished (checked at the next save and at close) the SHA-256 of
each of its files goes into STEP/checksums.json. `restore_latest` verifies them: a
checkpoint whose files changed, went missing or cannot be restored is reported in one
line, moved to checkpoints_corrupt/, and the previous one is used. Restoring places every
array with the sharding of a freshly initialised peer, so a run resumes on the same mesh
layout it would have started with.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from replax import sharding
from replax.sharding import abstract_like

CHECKSUMS = "checksums.json"


def _files(step_dir: epath.Path) -> list[str]:
    out = []
    for root, _, names in step_dir.walk():
        out += [str((root / n).relative_to(step_dir)) for n in names]
    return sorted(name for name in out if name != CHECKSUMS)


def _sha256(path: epath.Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_checksums(step_dir) -> None:
    step_dir = epath.Path(step_dir)
    digests = {name: _sha256(step_dir / name) for name in _files(step_dir)}
    tmp = step_dir / (CHECKSUMS + ".tmp")
    tmp.write_text(json.dumps(digests, indent=0, sort_keys=True))
    tmp.rename(step_dir / CHECKSUMS)


def verify_checksums(step_dir) -> str | None:
    """What is wrong with a checkpoint's files, or None when they match their checksums
    (or when it has none yet: a save the process did not live to seal)."""
    path = epath.Path(step_dir) / CHECKSUMS
    if not path.exists():
        return None
    try:
        digests = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"{CHECKSUMS} is unreadable"
    for name, digest in digests.items():
        file = path.parent / name
        if not file.exists():
            return f"{name} is missing"
        if _sha256(file) != digest:
            return f"{name} does not match its checksum"
    return None


def _absolute(directory) -> epath.Path:
    """A local directory made absolute; a URL (gs://...) as it is."""
    path = epath.Path(directory)
    return path if "://" in str(directory) else path.absolute()


class Checkpointer:
    """Steps saved under `directory`/<step> (a local path or a gs:// URL), the newest
    `max_to_keep` kept. With several processes every process takes part in each save and
    restore, as orbax requires; process 0 alone seals, checks and sets aside."""

    def __init__(self, directory, *, max_to_keep: int = 2, asynchronous: bool = True):
        self.directory = _absolute(directory)
        self._unsealed: int | None = None  # the step saved last, not checksummed yet
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                enable_async_checkpointing=asynchronous,
                create=True,
            ),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(
        self,
        step: int,
        *,
        train_state,
        replay_state,
        loop_state: dict[str, Any],
        data_iterator=None,
        force: bool = False,
    ) -> None:
        args = {
            "train_state": ocp.args.StandardSave(train_state),
            "replay_state": ocp.args.StandardSave(replay_state),
            "loop_state": ocp.args.JsonSave(loop_state),
        }
        if data_iterator is not None:
            args["data_iterator"] = grain.checkpoint.CheckpointSave(data_iterator)
        self._seal()
        self.manager.save(step, args=ocp.args.Composite(**args), force=force)
        self._unsealed = step

    def _seal(self) -> None:
        """Waits for the last save and writes its checksums (process 0 only)."""
        if self._unsealed is None:
            return
        self.manager.wait_until_finished()
        step_dir = self.directory / str(self._unsealed)
        if jax.process_index() == 0 and step_dir.is_dir():
            write_checksums(step_dir)
        self._unsealed = None

    def restore_latest(
        self, *, train_state, replay_state, data_iterator=None, log: Callable = print
    ):
        """The newest checkpoint that verifies and restores, as `restore` returns it, or
        None when there is none. Each bad one on the way is reported in one line and moved
        to DIR_corrupt/STEP, so that the run does not meet it again. Every process
        restores the step process 0 picks, and a step unreadable on any process is bad."""
        while True:
            # Process 0 picks the newest step left and checks its files; all restore it.
            step, problem = max(self.manager.all_steps(), default=-1), None
            if jax.process_index() == 0 and step >= 0:
                problem = verify_checksums(self.directory / str(step))
            picked = np.array([step, problem is not None], np.int32)
            step, bad = (int(v) for v in sharding.from_process_zero(picked))
            if step < 0:
                return None
            if not bad:
                try:
                    restored = self.restore(
                        step,
                        train_state=train_state,
                        replay_state=replay_state,
                        data_iterator=data_iterator,
                    )
                except Exception as e:  # noqa: BLE001 - any unreadable part: fall back
                    first = (str(e).strip().splitlines() or [""])[0][:200]
                    problem, restored = f"cannot be restored ({type(e).__name__}: {first})", None
                if not sharding.any_process(restored is None):
                    return restored
            aside = self._set_aside(step)
            problem = problem or "cannot be restored on another process"
            log(f"checkpoint {step} {problem}: moved to {aside}, using an earlier one")

    def _set_aside(self, step: int) -> epath.Path:
        aside = epath.Path(str(self.directory) + "_corrupt") / str(step)
        if jax.process_index() == 0:
            aside.parent.mkdir(parents=True, exist_ok=True)
            if aside.exists():
                aside.rmtree()
            (self.directory / str(step)).rename(aside)
        sharding.barrier(f"replax checkpoint {step} set aside")
        self.manager.reload()
        return aside

    def restore(self, step: int, *, train_state, replay_state, data_iterator=None):
        """Restores into the structure and shardings of the given (fresh) peers.

        Returns (train_state, replay_state, loop_state); the data iterator is restored
        in place.
        """
        args = {
            "train_state": ocp.args.StandardRestore(abstract_like(train_state)),
            "replay_state": ocp.args.StandardRestore(abstract_like(replay_state)),
            "loop_state": ocp.args.JsonRestore(),
        }
        if data_iterator is not None:
            args["data_iterator"] = grain.checkpoint.CheckpointRestore(data_iterator)
        restored = self.manager.restore(step, args=ocp.args.Composite(**args))
        return restored["train_state"], restored["replay_state"], restored["loop_state"]

    def restore_train_state(self, step: int, *, train_state):
        """Restores the train state alone (params and optimizer state), into the structure
        and shardings of `train_state`: what evaluation needs, and readable whatever the
        replay store's layout was when the checkpoint was written."""
        args = ocp.args.Composite(train_state=ocp.args.StandardRestore(abstract_like(train_state)))
        return self.manager.restore(step, args=args)["train_state"]

    def reached_preemption(self, step: int) -> bool:
        """Whether JAX's preemption notice (multi-host: every process agrees on the step)
        asks to save at this step; always False in a single process."""
        return jax.process_count() > 1 and self.manager.reached_preemption(step)

    def close(self) -> None:
        self._seal()
        self.manager.wait_until_finished()
        self.manager.close()
