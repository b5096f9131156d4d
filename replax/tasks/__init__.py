"""Tasks with verifiable rewards: a prompt, a reference answer, an exact check.

A task's reward takes the completion text (up to EOS, see
`replax.tokenizer.decode_completion`) and the reference answer, returns 1.0 or 0.0,
and never raises, whatever the policy wrote.
"""

from __future__ import annotations

import abc
import dataclasses


@dataclasses.dataclass(frozen=True)
class Example:
    """One prompt and its reference answer, both plain text."""

    prompt: str
    answer: str


class Task(abc.ABC):
    """A source of examples and their reward function."""

    name: str

    @abc.abstractmethod
    def examples(self, split: str, num: int, seed: int = 0) -> list[Example]:
        """`num` examples of `split` ("train" or "test"), deterministic in seed."""

    @abc.abstractmethod
    def reward(self, completion: str, answer: str) -> float:
        """1.0 if `completion` states `answer`, else 0.0. Never raises."""

    def demonstration(self, example: Example) -> str:
        """Prompt followed by the target completion, for supervised warm-start.

        The tokenizer adds BOS in front and the trainer appends EOS after it.
        """
        return example.prompt + example.answer


def make_task(name: str, **kwargs) -> Task:
    """Task by name: "arith_easy", "arith_hard", "arith" (= hard), "gsm8k", "math"."""
    from replax.tasks import arith, math

    if name in ("arith", "arith_hard"):
        return arith.ArithTask(arith.HARD, **kwargs)
    if name == "arith_easy":
        return arith.ArithTask(arith.EASY, **kwargs)
    if name in ("gsm8k", "math"):
        return math.MathTask(name=name, **kwargs)
    raise ValueError(f"unknown task {name!r}; known: arith, arith_easy, arith_hard, gsm8k, math")


__all__ = ["Example", "Task", "make_task"]
