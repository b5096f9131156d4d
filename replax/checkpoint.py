"""One orbax checkpoint per saved step: train state (params, optimizer state), replay
store, loop state (step, RNG, compute account, controller), and the grain iterator.

Saving is asynchronous (orbax CheckpointManager): the loop goes on while arrays are
written. Restoring places every array with the sharding of a freshly initialised peer,
so a run resumes on the same mesh layout it would have started with.
"""

from __future__ import annotations

import os
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp

from replax.sharding import abstract_like


class Checkpointer:
    """Steps saved under `directory`/<step>, the newest `max_to_keep` kept."""

    def __init__(self, directory: str, *, max_to_keep: int = 2, asynchronous: bool = True):
        self.directory = os.path.abspath(directory)
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
        self.manager.save(step, args=ocp.args.Composite(**args), force=force)

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
        self.manager.wait_until_finished()
        self.manager.close()
