"""GSM8K-style word problems generated from templates, with answers exact by construction.

A problem is one or two arithmetic steps told in plain English about a person and some
things, e.g. "Maria has 7 apples. She buys 5 more. How many apples does Maria have now?"
(answer 12), or "Omar buys 4 boxes of pencils with 6 pencils in each box. He gives away 9
of the pencils. How many pencils does Omar have left?" (answer 15). Each template draws
its numbers so that every intermediate and final value is a non-negative integer (a
division always comes out even), and computes the answer from the same numbers it writes
into the text.

The policy sees the problem through the tokenizer's chat template ("instruct", as GSM8K's
prompts do) or alone ("plain"), followed by the instruction; the reward is GSM8K's: the
completion's answer after its last "####", else its last \\boxed{}, else its last number,
equal to the reference. Train and test are disjoint: a problem is in the test split iff a
hash of its text falls below `test_fraction`.

The task exists because a small instruct model (SmolLM2-135M-Instruct) solves almost no
real GSM8K problem, so RL on GSM8K has nothing to reinforce; on one- and two-step problems
in the same language its greedy accuracy sits between the extremes, where RL can learn.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Callable

from replax.tasks.base import Example, Task, draw_split
from replax.tasks.math import gsm8k_reward

PROMPT_FORMATS = ("instruct", "plain")
# Direct: SmolLM2-135M-Instruct then writes a short worked answer, often ending in "#### N";
# asked to think step by step it writes plans past 64 tokens and scores a fifth as often.
INSTRUCTION = "Answer with a single number."

_NAMES = (
    ("Maria", "she"),
    ("Omar", "he"),
    ("Lena", "she"),
    ("Tom", "he"),
    ("Aisha", "she"),
    ("Ken", "he"),
    ("Sofia", "she"),
    ("Ravi", "he"),
    ("Emma", "she"),
    ("Jack", "he"),
)
# (thing, container) pairs: "boxes of pencils", "bags of apples".
_THINGS = (
    ("apples", "bag"),
    ("pencils", "box"),
    ("stickers", "pack"),
    ("marbles", "jar"),
    ("cookies", "tray"),
    ("books", "shelf"),
    ("stamps", "album"),
    ("eggs", "carton"),
    ("cards", "deck"),
    ("flowers", "vase"),
)
_PLURAL = {"box": "boxes", "shelf": "shelves", "bag": "bags"}


def _plural(word: str) -> str:
    return _PLURAL.get(word, word + "s")


@dataclasses.dataclass(frozen=True)
class _Draw:
    """What a template is told: the person, the things and a number source."""

    name: str
    pronoun: str
    thing: str
    container: str
    rng: random.Random
    max_number: int

    def number(self, low: int = 2, high: int | None = None) -> int:
        return self.rng.randint(low, max(low, self.max_number if high is None else high))


# A template returns (question, answer). One-step templates:


def _add(d: _Draw) -> tuple[str, int]:
    a, b = d.number(), d.number()
    he = d.pronoun.capitalize()
    return (
        f"{d.name} has {a} {d.thing}. {he} buys {b} more. How many {d.thing} does {d.name} "
        "have now?",
        a + b,
    )


def _subtract(d: _Draw) -> tuple[str, int]:
    b = d.number(1)
    a = b + d.number(1)
    return (
        f"{d.name} has {a} {d.thing} and gives {b} of them to a friend. How many {d.thing} "
        f"does {d.name} have left?",
        a - b,
    )


def _multiply(d: _Draw) -> tuple[str, int]:
    a, b = d.number(2, 9), d.number(2, 9)
    return (
        f"{d.name} buys {a} {_plural(d.container)} of {d.thing} with {b} {d.thing} in each "
        f"{d.container}. How many {d.thing} does {d.name} buy?",
        a * b,
    )


def _divide(d: _Draw) -> tuple[str, int]:
    per, groups = d.number(2, 9), d.number(2, 9)
    return (
        f"{d.name} puts {per * groups} {d.thing} into {groups} {_plural(d.container)}, the "
        f"same number in each {d.container}. How many {d.thing} are in each {d.container}?",
        per,
    )


# Two-step templates:


def _add_subtract(d: _Draw) -> tuple[str, int]:
    a, b = d.number(), d.number()
    c = d.number(1, a + b - 1)
    he = d.pronoun.capitalize()
    return (
        f"{d.name} has {a} {d.thing}. {he} buys {b} more and then gives {c} to a friend. "
        f"How many {d.thing} does {d.name} have now?",
        a + b - c,
    )


def _multiply_subtract(d: _Draw) -> tuple[str, int]:
    a, b = d.number(2, 9), d.number(2, 9)
    c = d.number(1, a * b - 1)
    he = d.pronoun.capitalize()
    return (
        f"{d.name} buys {a} {_plural(d.container)} of {d.thing} with {b} {d.thing} in each "
        f"{d.container}. {he} gives away {c} of the {d.thing}. How many {d.thing} does "
        f"{d.name} have left?",
        a * b - c,
    )


def _multiply_add(d: _Draw) -> tuple[str, int]:
    a, b, c = d.number(2, 9), d.number(2, 9), d.number()
    he = d.pronoun.capitalize()
    return (
        f"{d.name} has {c} {d.thing}. {he} buys {a} {_plural(d.container)} with {b} "
        f"{d.thing} in each {d.container}. How many {d.thing} does {d.name} have now?",
        c + a * b,
    )


def _two_people(d: _Draw) -> tuple[str, int]:
    a, more = d.number(), d.number(1)
    return (
        f"{d.name} has {a} {d.thing}. A friend has {more} more {d.thing} than {d.name}. How "
        f"many {d.thing} do they have together?",
        a + (a + more),
    )


Template = Callable[[_Draw], tuple[str, int]]
TEMPLATES: dict[int, tuple[Template, ...]] = {
    1: (_add, _subtract, _multiply, _divide),
    2: (_add_subtract, _multiply_subtract, _multiply_add, _two_people),
}


def split_of(question: str, test_fraction: float) -> str:
    """ "test" or "train", a fixed function of the question text."""
    digest = hashlib.blake2b(question.encode(), digest_size=8).digest()
    return "test" if int.from_bytes(digest, "big") / 2**64 < test_fraction else "train"


def sample_problem(rng: random.Random, steps: tuple[int, ...], max_number: int) -> tuple[str, int]:
    """One (question, answer): a template of a step count drawn from `steps`."""
    template = rng.choice(TEMPLATES[rng.choice(steps)])
    name, pronoun = rng.choice(_NAMES)
    thing, container = rng.choice(_THINGS)
    return template(_Draw(name, pronoun, thing, container, rng, max_number))


class WordProblemTask(Task):
    """Template word problems; see the module docstring.

    steps: the step counts drawn from (1, 2 or both, each equally likely, then a template
    of that count uniformly). max_number: the largest number a problem states for a sum or
    a difference (factors and divisors stay within 2-9). prompt_format: "instruct" (the
    chat template of `tokenizer`, needed) or "plain". system_prompt: the chat's system turn
    (None: the template's default). instruction: appended to the problem on a new line.
    """

    def __init__(
        self,
        *,
        steps: tuple[int, ...] = (1, 2),
        max_number: int = 20,
        test_fraction: float = 0.1,
        prompt_format: str = "instruct",
        tokenizer=None,
        system_prompt: str | None = None,
        instruction: str | None = None,
    ):
        steps = tuple(int(s) for s in steps)
        if not steps or not set(steps) <= set(TEMPLATES):
            raise ValueError(f"task.steps={steps}: allowed are non-empty subsets of (1, 2)")
        if max_number < 3:
            raise ValueError(f"task.max_number={max_number}: allowed is >= 3")
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"task.test_fraction={test_fraction}: allowed is 0 < f < 1")
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(
                f"task.prompt_format={prompt_format!r}: allowed are {list(PROMPT_FORMATS)}"
            )
        if prompt_format == "instruct" and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "task.prompt_format='instruct' needs a tokenizer with a chat template "
                f"(got {tokenizer!r}): use prompt_format 'plain'"
            )
        self.name = "word_problems"
        self.steps, self.max_number, self.test_fraction = steps, max_number, test_fraction
        self.prompt_format, self.tokenizer = prompt_format, tokenizer
        self.system_prompt = system_prompt
        self.instruction = INSTRUCTION if instruction is None else instruction

    def format_prompt(self, question: str) -> str:
        text = f"{question}\n{self.instruction}" if self.instruction else question
        if self.prompt_format == "plain":
            return text
        from replax.text import tokenizer as tokenizer_lib

        return tokenizer_lib.format_prompt(
            self.tokenizer, text, style="chat", system=self.system_prompt
        )

    def problems(self, split: str, num: int, seed: int = 0) -> list[tuple[str, int]]:
        """`num` (question, answer) pairs of `split`: test ones distinct, train i.i.d."""

        def sample(rng):
            question, answer = sample_problem(rng, self.steps, self.max_number)
            return question, (question, answer)

        return draw_split(
            f"replax-word-problems:{split}:{seed}",
            split,
            num,
            sample,
            lambda text: split_of(text, self.test_fraction),
            "problems",
            hint=" (or raise task.max_number)",
        )

    def examples(self, split: str, num: int, seed: int = 0) -> list[Example]:
        return [Example(self.format_prompt(q), str(a)) for q, a in self.problems(split, num, seed)]

    def reward(self, completion: str, answer: str) -> float:
        return gsm8k_reward(completion, answer)

    def demonstration(self, example: Example) -> str:
        return f"{example.prompt}#### {example.answer}"

    def max_prompt_chars(self) -> int:
        # The longest template's text with the longest names and numbers, plus the chat
        # template's turns: an upper bound for the config checks, not a tight one.
        return 600 + len(self.instruction) + len(self.system_prompt or "") + 200

    def max_answer_chars(self) -> int:
        # The largest answers: c + a * b (c + 81) and a + (a + more) (3 * max_number).
        return len(str(max(self.max_number + 81, 3 * self.max_number)))

    def data_key(self) -> str:
        template = getattr(self.tokenizer, "chat_template", None) or ""
        return repr(self) + hashlib.sha256(template.encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        return (
            f"WordProblemTask(steps={self.steps}, max_number={self.max_number}, "
            f"test_fraction={self.test_fraction}, prompt_format={self.prompt_format!r}, "
            f"system_prompt={self.system_prompt!r}, instruction={self.instruction!r}, "
            f"tokenizer={self.tokenizer!r})"
        )
