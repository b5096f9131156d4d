"""Procedurally generated integer arithmetic with exact answers.

A prompt is an expression followed by "=", e.g. "37+48*3-19=", and the answer is
its value in decimal, e.g. "162" (Python precedence: * before + and -). The policy
should complete the prompt with the answer and then EOS.

Train and test are disjoint by construction: an expression belongs to the test
split iff a hash of its string falls below `test_fraction`, so no test expression
ever appears in train, under any seed or difficulty.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re

from replax.tasks.base import Example, Task, draw_split

_OPS = frozenset("+-*")
_INTEGER = re.compile(r"-?[0-9]+")
_MAX_ANSWER_CHARS = 64  # longer completions are garbage, not integers worth parsing


@dataclasses.dataclass(frozen=True)
class ArithDifficulty:
    """Distribution of expressions.

    An expression has between min_terms and max_terms terms joined by operators
    drawn uniformly from `ops`. A term that is an operand of "*" is drawn from
    [1, max_mul_operand]; any other term first draws a digit count uniformly from
    [min_digits, max_digits], then a value uniformly among numbers with that many
    digits (one digit: 0-9). With zero_pad, those terms are written with max_digits
    digits ("007"), which keeps prompt lengths constant.
    """

    name: str = "custom"
    min_terms: int = 2
    max_terms: int = 3
    min_digits: int = 1
    max_digits: int = 2
    ops: str = "+-"
    max_mul_operand: int = 9
    zero_pad: bool = False

    def __post_init__(self):
        # The fields are the arith task's task.* keys (replax.tasks.make_arith_task).
        if not 2 <= self.min_terms <= self.max_terms:
            raise ValueError(
                f"task.min_terms={self.min_terms}, task.max_terms={self.max_terms}: need "
                "2 <= task.min_terms <= task.max_terms"
            )
        if not 1 <= self.min_digits <= self.max_digits <= 18:
            raise ValueError(
                f"task.min_digits={self.min_digits}, task.max_digits={self.max_digits}: need "
                "1 <= task.min_digits <= task.max_digits <= 18"
            )
        if not self.ops or not set(self.ops) <= _OPS:
            raise ValueError(
                f"task.ops={self.ops!r}: allowed is a non-empty subset of '+-*' (e.g. '+-')"
            )
        if self.max_mul_operand < 1:
            raise ValueError(f"task.max_mul_operand={self.max_mul_operand}: must be >= 1")

    def max_prompt_chars(self) -> int:
        """Upper bound on len(prompt), for choosing a max prompt length."""
        term = max(self.max_digits, len(str(self.max_mul_operand)))
        return self.max_terms * (term + 1)

    def max_answer_chars(self) -> int:
        """Upper bound on the length of an answer (its sign included)."""
        largest = 10**self.max_digits - 1
        if "*" in self.ops:
            largest = max(largest, self.max_mul_operand) * self.max_mul_operand ** (
                self.max_terms - 1
            )
        return len(str(self.max_terms * largest)) + ("-" in self.ops)


# Warm-start (SFT) distribution: one operation on one- or two-digit numbers.
EASY = ArithDifficulty(name="easy", min_terms=2, max_terms=2, min_digits=1, max_digits=2, ops="+-")
# RL distribution: two or three terms, up to three digits, with small multiplications.
HARD = ArithDifficulty(
    name="hard", min_terms=2, max_terms=3, min_digits=1, max_digits=3, ops="+-*", max_mul_operand=9
)
DIFFICULTIES = {"easy": EASY, "hard": HARD}


def split_of(expression: str, test_fraction: float = 0.1) -> str:
    """ "test" or "train", a fixed function of the expression string."""
    digest = hashlib.blake2b(expression.encode(), digest_size=8).digest()
    return (
        "test" if int.from_bytes(digest, "big") % 1_000_000 < test_fraction * 1_000_000 else "train"
    )


def sample_expression(rng: random.Random, difficulty: ArithDifficulty) -> str:
    """One expression string without "=", e.g. "37+48*3-19"."""
    d = difficulty
    num_terms = rng.randint(d.min_terms, d.max_terms)
    ops = [rng.choice(d.ops) for _ in range(num_terms - 1)]
    parts = []
    for i in range(num_terms):
        next_to_mul = (i > 0 and ops[i - 1] == "*") or (i < num_terms - 1 and ops[i] == "*")
        if next_to_mul:
            parts.append(str(rng.randint(1, d.max_mul_operand)))
        else:
            digits = rng.randint(d.min_digits, d.max_digits)
            low = 0 if digits == 1 else 10 ** (digits - 1)
            value = rng.randint(low, 10**digits - 1)
            parts.append(str(value).zfill(d.max_digits) if d.zero_pad else str(value))
        if i < num_terms - 1:
            parts.append(ops[i])
    return "".join(parts)


def evaluate(expression: str) -> int:
    """Value of an expression of non-negative integers, +, - and * (usual precedence)."""
    total = 0
    for sign, product in re.findall(r"([+-]?)([0-9*]+)", expression):
        value = 1
        for factor in product.split("*"):
            value *= int(factor)
        total += -value if sign == "-" else value
    return total


def check_answer(completion: str, answer: str) -> float:
    """1.0 iff the completion, stripped of whitespace, is the integer `answer`."""
    try:
        text = completion.strip()
        if len(text) > _MAX_ANSWER_CHARS or not _INTEGER.fullmatch(text):
            return 0.0
        return 1.0 if int(text) == int(answer.strip()) else 0.0
    except Exception:  # noqa: BLE001 - a reward must never take the trainer down
        return 0.0


class ArithTask(Task):
    """Integer arithmetic at a given difficulty; see the module docstring."""

    def __init__(self, difficulty: ArithDifficulty = HARD, *, test_fraction: float = 0.1):
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        self.difficulty = difficulty
        self.test_fraction = test_fraction
        self.name = f"arith_{difficulty.name}"

    def examples(self, split: str, num: int, seed: int = 0) -> list[Example]:
        """`num` examples of `split`; test examples are distinct, train ones i.i.d."""

        def sample(rng):
            expression = sample_expression(rng, self.difficulty)
            return expression, Example(prompt=expression + "=", answer=str(evaluate(expression)))

        return draw_split(
            f"replax-arith:{split}:{seed}",
            split,
            num,
            sample,
            lambda text: split_of(text, self.test_fraction),
            f"expressions of {self.difficulty}",
        )

    def reward(self, completion: str, answer: str) -> float:
        return check_answer(completion, answer)

    def max_prompt_chars(self) -> int:
        return self.difficulty.max_prompt_chars()

    def max_answer_chars(self) -> int:
        return self.difficulty.max_answer_chars()

    def __repr__(self) -> str:
        return f"ArithTask({self.difficulty}, test_fraction={self.test_fraction})"


def make_arith_task(
    *,
    min_terms: int = 2,
    max_terms: int = 3,
    min_digits: int = 1,
    max_digits: int = 2,
    ops: str = "+-",
    max_mul_operand: int = 9,
    test_fraction: float = 0.1,
) -> ArithTask:
    """The registered task `arith`: config keys task.min_terms ... task.max_mul_operand."""
    difficulty = ArithDifficulty(
        name="rl",
        min_terms=min_terms,
        max_terms=max_terms,
        min_digits=min_digits,
        max_digits=max_digits,
        ops=ops,
        max_mul_operand=max_mul_operand,
    )
    return ArithTask(difficulty, test_fraction=test_fraction)
