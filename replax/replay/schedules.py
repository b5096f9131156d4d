"""When a step generates fresh rollouts, and how old a replayed rollout may be.

The RL loop asks its schedule three things per step, `should_generate(step)`,
`should_train(step)` and `max_age()` (and, when `varies_training`, `draw_once`: whether
the batch is fresh rollouts each drawn once), and tells it what happened (`observe`).
`EveryStep` is fixed mode: generate and train on every step, with the buffer's configured
age limit. Auto mode's schedule is
`replax.replay.auto.AutoReplayController`, which plans both online. Either way the loop
and the compiled add-and-sample are the same: a step without generation stores nothing.
"""

from __future__ import annotations

from typing import Any, Protocol

# The age limit that limits nothing (int32, so that it can be a traced argument).
NO_AGE_LIMIT = 2**30


class Schedule(Protocol):
    # Whether the train step must report the fresh / stale half-batch statistics.
    half_batch_stats: bool
    # Whether some steps do not train, or draw each item once (auto mode below B / R).
    varies_training: bool
    draw_once: bool

    def should_generate(self, step: int) -> bool: ...

    def should_train(self, step: int) -> bool: ...

    def max_age(self) -> int: ...

    def observe(self, *, gen_s=None, train_s=None, stats=None, kept=None) -> None: ...

    def metrics(self) -> dict[str, Any]: ...

    def state_dict(self) -> dict[str, Any] | None: ...


class EveryStep:
    """Fixed mode: R fresh rollouts every step; max_age steps (None: no limit)."""

    half_batch_stats = False
    varies_training = False
    draw_once = False

    def __init__(self, max_age: int | None = None):
        self._max_age = NO_AGE_LIMIT if max_age is None else int(max_age)

    def should_generate(self, step: int) -> bool:
        del step
        return True

    def should_train(self, step: int) -> bool:
        del step
        return True

    def max_age(self) -> int:
        return self._max_age

    def observe(self, *, gen_s=None, train_s=None, stats=None, kept=None) -> None:
        del gen_s, train_s, stats, kept

    def metrics(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> None:
        return None
