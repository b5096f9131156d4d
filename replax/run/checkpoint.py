"""One orbax checkpoint per saved step: train state (params, optimizer state), replay
store, loop state (step, compute account, schedule), and the grain iterator.

Saving is asynchronous (orbax CheckpointManager): the loop goes on while arrays are
written. Restoring places every array with the sharding of a freshly initialised peer,
so a run resumes on the same mesh layout it would have started with.

A checkpoint counts only once it is sealed: STEP/checksums.json holds the SHA-256 of
every file of it. The seal is part of orbax's commit. Orbax runs
`AsyncOptions.post_finalization_callback` on process 0 once every process has written
its files and before it commits the step, and that is where the seal is written, into
the step's directory while it is still uncommitted. The commit then publishes data and
seal together:
- on a local or network disk, by renaming STEP.orbax-checkpoint-tmp to STEP, atomic;
- on an object store such as gs://, which has no atomic rename, orbax writes the step in
  place and commits it with a last file, commit_success.txt, after the seal. A step
  without that file is not listed by orbax at all. checksums.json itself is one object,
  and an object store publishes an object whole or not at all; where a store might not
  (the local stand-in the tests use), a seal cut short does not parse and counts as no
  seal.
So a kill at any point either leaves no committed step or a committed, sealed one.
Orbax's own bookkeeping files written at the commit (_CHECKPOINT_METADATA's commit time,
commit_success.txt) are not in the seal; every file of the arrays, the loop state and
the data iterator is. A synchronous save (tests) seals right after its commit.

`restore_latest` restores only sealed checkpoints whose files match their checksums. A
step without a readable seal (a workdir from before sealing, or a store that listed a
step whose seal was cut short), a file that changed or went missing, or one that orbax
cannot read: reported in one line, moved to checkpoints_corrupt/STEP, and the previous
one is used; with none left, the run starts again, and says so.

Fault injection for tests: REPLAX_CRASH_AT=POINT:STEP kills the process (SIGKILL) at
POINT of step STEP's save: `write` (the arrays' asynchronous write under way), `seal`
(half of checksums.json written).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint.path import atomicity

from replax.core import processes
from replax.core.config_utils import ConfigError
from replax.core.sharding import abstract_like

CHECKSUMS = "checksums.json"
# Written by orbax at the commit, after the seal: its bookkeeping, not the checkpoint's data.
COMMIT_FILES = ("_CHECKPOINT_METADATA", atomicity.COMMIT_SUCCESS_FILE)
NEVER_SEALED = "was never sealed (the process stopped while saving it)"


def _crash_point(point: str, step: int) -> None:
    """Fault injection for tests (REPLAX_CRASH_AT=POINT:STEP): SIGKILL here."""
    if os.environ.get("REPLAX_CRASH_AT") == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def _files(step_dir: epath.Path) -> list[str]:
    out = []
    for root, _, names in step_dir.walk():
        out += [str((root / n).relative_to(step_dir)) for n in names]
    return sorted(n for n in out if n != CHECKSUMS and n not in COMMIT_FILES)


def _sha256(path: epath.Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_checksums(step_dir, step: int = -1) -> None:
    """Seals step_dir: the SHA-256 of each of its files, in one write of checksums.json
    (written in place: the step is sealed before it is committed, see the module doc)."""
    step_dir = epath.Path(step_dir)
    digests = {name: _sha256(step_dir / name) for name in _files(step_dir)}
    text = json.dumps(digests, indent=0, sort_keys=True)
    if os.environ.get("REPLAX_CRASH_AT") == f"seal:{step}":
        (step_dir / CHECKSUMS).write_text(text[: len(text) // 2])
        _crash_point("seal", step)
    (step_dir / CHECKSUMS).write_text(text)


def verify_checksums(step_dir) -> str | None:
    """What is wrong with a checkpoint's files, or None when it is sealed and its files
    match their checksums."""
    path = epath.Path(step_dir) / CHECKSUMS
    problem = _seal_problem(path)
    if problem is not None:
        return problem
    for name, digest in json.loads(path.read_text()).items():
        file = path.parent / name
        if not file.exists():
            return f"{name} is missing"
        if _sha256(file) != digest:
            return f"{name} does not match its checksum"
    return None


def _seal_problem(path: epath.Path) -> str | None:
    """What is wrong with a seal file itself (not the files it lists), or None."""
    if not path.exists():
        return NEVER_SEALED
    try:
        digests = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"{NEVER_SEALED}: its {CHECKSUMS} is cut short or unreadable"
    if not isinstance(digests, dict) or not digests:
        return f"{NEVER_SEALED}: its {CHECKSUMS} lists no files"
    return None


def last_sealed_step(directory) -> int | None:
    """The newest committed step under directory whose seal is readable, from a plain
    listing (no orbax manager): the step a stopped run will resume from, unless its files
    turn out not to match their seal."""
    directory = epath.Path(directory)
    if not directory.exists():
        return None
    steps = sorted((int(p.name) for p in directory.iterdir() if p.name.isdigit()), reverse=True)
    return next((s for s in steps if _seal_problem(directory / str(s) / CHECKSUMS) is None), None)


def _absolute(directory) -> epath.Path:
    """A local directory made absolute; a URL (gs://...) as it is."""
    path = epath.Path(directory)
    return path if "://" in str(directory) else path.absolute()


ARRAY_ITEMS = ("train_state", "replay_state", "pending")
RESTORE_CONCURRENT_BYTES = 96 * 10**9  # the standard handler's restore limit


class _OneCommitHandler(ocp.StandardCheckpointHandler):
    """orbax's standard array-tree handler, writing each tree in one OCDBT commit.

    With its in-flight byte limit set (the standard handler always sets one) orbax
    commits each array by itself, and OCDBT's append-only tree rewrites its root node at
    every commit, with every value under 1 KiB inlined in it: a tree of many small
    arrays (LoRA adapters, their Adam state) left a copy of itself per commit, a number
    that follows thread timing. Without the limit orbax writes the whole tree in one
    atomic transaction: one version, the same bytes on every run. The host already
    holds the tree's local shards at that point, so the limit bought little."""

    def __init__(self):
        super().__init__()
        self._impl = ocp.PyTreeCheckpointHandler(
            handler_impl=ocp.BasePyTreeCheckpointHandler(
                save_concurrent_bytes=None,
                restore_concurrent_bytes=RESTORE_CONCURRENT_BYTES,
            )
        )


def _handler_registry() -> ocp.handlers.DefaultCheckpointHandlerRegistry:
    """The array items saved and restored by `_OneCommitHandler`; the loop state and the
    data iterator fall back to the handlers orbax registers for their arguments."""
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    for name in ARRAY_ITEMS:
        handler = _OneCommitHandler()
        registry.add(name, ocp.args.StandardSave, handler)
        registry.add(name, ocp.args.StandardRestore, handler)
    return registry


class Checkpointer:
    """Steps saved under `directory`/<step> (a local path or a gs:// URL), the newest
    `max_to_keep` kept. With several processes every process takes part in each save and
    restore, as orbax requires; process 0 alone seals, checks and sets aside.

    temporary_path_class: orbax's commit protocol; None picks it from the path (atomic
    rename locally, a commit file on gs://). Tests pass orbax's CommitFileTemporaryPath
    to run the object-store protocol on a local disk."""

    def __init__(
        self,
        directory,
        *,
        max_to_keep: int = 2,
        asynchronous: bool = True,
        temporary_path_class=None,
    ):
        self.directory = _absolute(directory)
        self._asynchronous = asynchronous
        self._saving: int | None = None  # the step being saved, until its seal is written
        self._save_started = 0.0
        # Seconds from each save's start to its seal, by step (how long it was unsealed).
        self.unsealed_s: dict[int, float] = {}
        self.manager = ocp.CheckpointManager(
            self.directory,
            handler_registry=_handler_registry(),
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                enable_async_checkpointing=asynchronous,
                create=True,
                temporary_path_class=temporary_path_class,
                async_options=(
                    ocp.AsyncOptions(post_finalization_callback=self._seal_uncommitted)
                    if asynchronous
                    else None
                ),
            ),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def sealed_steps(self) -> list[int]:
        """The steps whose seal is readable, oldest first (their files not yet checked
        against it: `pick_sealed` does)."""
        sealed = []
        for step in sorted(self.manager.all_steps()):
            problem = _seal_problem(self.directory / str(step) / CHECKSUMS)
            if problem is None:
                sealed.append(step)
        return sealed

    def pick_sealed(self, step: int | None = None, log: Callable = print) -> int:
        """The step to read without resuming (evaluation, export): `step` when it is a
        sealed checkpoint whose files match their checksums, else (step None) the newest
        such one, each one passed over reported to `log` in one line. Raises ConfigError,
        one line naming the sealed steps, when there is none. Moves nothing: a reader
        leaves the run's directory as it found it."""
        if step is not None:
            if step not in self.manager.all_steps():
                raise ConfigError(
                    f"--step={step} is not a checkpoint of {self.directory}: the sealed ones "
                    f"are {self.sealed_steps()}"
                )
            problem = verify_checksums(self.directory / str(step))
            if problem is not None:
                raise ConfigError(
                    f"--step={step}: checkpoint {step} {problem}; the sealed checkpoints of "
                    f"{self.directory} are {[s for s in self.sealed_steps() if s != step]}"
                )
            return step
        steps = sorted(self.manager.all_steps())
        for candidate in reversed(steps):
            problem = verify_checksums(self.directory / str(candidate))
            if problem is None:
                return candidate
            log(f"checkpoint {candidate} {problem}; trying the one before")
        raise ConfigError(
            f"{self.directory} has no sealed checkpoint whose files match their checksums "
            f"(its steps: {steps})"
        )

    def save(
        self,
        step: int,
        *,
        train_state,
        replay_state,
        loop_state: dict[str, Any],
        data_iterator=None,
        pending=None,
        force: bool = False,
    ) -> None:
        """pending: host arrays of work in flight (disjoint placement's generation), saved
        as the item `pending` when given."""
        args = {
            "train_state": ocp.args.StandardSave(train_state),
            "replay_state": ocp.args.StandardSave(replay_state),
            "loop_state": ocp.args.JsonSave(loop_state),
        }
        if pending is not None:
            args["pending"] = ocp.args.StandardSave(pending)
        if data_iterator is not None:
            args["data_iterator"] = grain.checkpoint.CheckpointSave(data_iterator)
        # The previous save seals itself before this one starts (orbax waits for it too).
        self.manager.wait_until_finished()
        self._saving, self._save_started = step, time.time()
        self.manager.save(step, args=ocp.args.Composite(**args), force=force)
        _crash_point("write", step)
        if not self._asynchronous:  # committed already: seal it now
            self._seal(self.directory / str(step), step)

    def _seal_uncommitted(self) -> None:
        """orbax's post-finalization callback (process 0, every process's files written,
        the step not yet committed): seals the step where it is being written."""
        step = self._saving
        pending = sorted(self.directory.glob(f"{step}{atomicity.TMP_DIR_SUFFIX}*"))
        self._seal(pending[-1] if pending else self.directory / str(step), step)

    def _seal(self, step_dir: epath.Path, step: int) -> None:
        if jax.process_index() == 0:
            write_checksums(step_dir, step)
            self.unsealed_s[step] = time.time() - self._save_started
        self._saving = None

    def restore_latest(
        self, *, train_state, replay_state, data_iterator=None, log: Callable = print
    ):
        """The newest sealed checkpoint that verifies and restores, as `restore` returns
        it, or None when there is none. Each bad one on the way is reported in one line
        (naming the step it resumes from) and moved to DIR_corrupt/STEP, so that the run does
        not meet it again. Every process restores the step process 0 picks, and a step
        unreadable on any process is bad."""
        rejected: list[tuple[int, str, epath.Path]] = []
        restored = None
        while restored is None:
            # Process 0 picks the newest step left and checks its files; all restore it.
            step, problem = max(self.manager.all_steps(), default=-1), None
            if jax.process_index() == 0 and step >= 0:
                problem = verify_checksums(self.directory / str(step))
            picked = np.array([step, problem is not None], np.int32)
            step, bad = (int(v) for v in processes.from_process_zero(picked))
            if step < 0:
                break
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
                if processes.any_process(restored is None):
                    restored = None
            if restored is None:
                problem = problem or "cannot be restored on another process"
                rejected.append((step, problem, self._set_aside(step)))
        using = (
            f"resuming from step {step}"
            if restored is not None
            else "no sealed checkpoint is left: the run starts again from step 0"
        )
        for bad_step, problem, aside in rejected:
            log(f"checkpoint {bad_step} {problem}; moved to {aside}; {using}")
        return restored

    def _set_aside(self, step: int) -> epath.Path:
        aside = epath.Path(str(self.directory) + "_corrupt") / str(step)
        if jax.process_index() == 0:
            aside.parent.mkdir(parents=True, exist_ok=True)
            if aside.exists():
                aside.rmtree()
            (self.directory / str(step)).rename(aside)
        processes.barrier(f"replax checkpoint {step} set aside")
        self.manager.reload()
        return aside

    def restore(self, step: int, *, train_state, replay_state, data_iterator=None):
        """Restores into the structure and shardings of the given (fresh) peers.

        Returns (train_state, replay_state, loop_state); the data iterator is restored
        in place, and the `pending` item, when the step has one, is loop_state's
        "pending_arrays" (host arrays).
        """
        args = {
            "train_state": ocp.args.StandardRestore(abstract_like(train_state)),
            "replay_state": ocp.args.StandardRestore(abstract_like(replay_state)),
            "loop_state": ocp.args.JsonRestore(),
        }
        if data_iterator is not None:
            args["data_iterator"] = grain.checkpoint.CheckpointRestore(data_iterator)
        if (self.directory / str(step) / "pending").exists():
            args["pending"] = ocp.args.StandardRestore()
        restored = self.manager.restore(step, args=ocp.args.Composite(**args))
        loop_state = restored["loop_state"]
        if "pending" in args:
            loop_state = {**loop_state, "pending_arrays": restored["pending"]}
        return restored["train_state"], restored["replay_state"], loop_state

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
        self.manager.wait_until_finished()  # the last save, sealed
        self.manager.close()
