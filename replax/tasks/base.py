"""What a task is: examples, deterministic train / test splits, the `Task` interface."""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import importlib
import importlib.util
import os
import random
import sys
from collections.abc import Callable
from typing import TypeVar

SPLITS = ("train", "test")
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class Example:
    """One prompt and its reference answer, both plain text."""

    prompt: str
    answer: str


def draw_split(
    name: str,
    split: str,
    num: int,
    sample: Callable[[random.Random], tuple[str, _T]],
    split_of: Callable[[str], str],
    what: str,
    hint: str = "",
) -> list[_T]:
    """`num` items of a generated task's `split`: `sample(rng)` gives (text, item), and
    `split_of(text)` the split the text belongs to, so train and test never share a
    problem; test items are distinct, train ones i.i.d. Deterministic in `name` (e.g.
    "replax-arith:test:0"). Raises ValueError, naming `what` ran short (and `hint`, how
    to get more), when fewer than `num` distinct ones turn up in 100 draws per item (plus
    10,000)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    # A string seed is hashed with SHA-512 by `random`: stable across versions.
    rng = random.Random(name)
    out, seen = [], set()
    max_draws = 100 * num + 10_000
    for _ in range(max_draws):
        if len(out) == num:
            break
        text, item = sample(rng)
        if split_of(text) != split:
            continue
        if split == "test":
            if text in seen:
                continue
            seen.add(text)
        out.append(item)
    if len(out) < num:
        raise ValueError(
            f"found only {len(out)} distinct {split} {what} in {max_draws} draws; "
            f"ask for fewer than {num}{hint}"
        )
    return out


class Task(abc.ABC):
    """A source of examples and their reward function."""

    name: str

    @abc.abstractmethod
    def examples(self, split: str, num: int, seed: int = 0) -> list[Example]:
        """`num` examples of `split` ("train" or "test"), deterministic in seed."""

    @abc.abstractmethod
    def reward(self, completion: str, answer: str) -> float:
        """1.0 if `completion` states `answer`, else 0.0. Never raises."""

    def score(self, prompt: str, completion: str, answer: str) -> float:
        """The reward of `completion` to `prompt`: `reward(completion, answer)` unless the
        task's reward reads the prompt too (a reward function by config, task.reward)."""
        del prompt
        return self.reward(completion, answer)

    def demonstration(self, example: Example) -> str:
        """Prompt followed by the target completion, for supervised warm-start.

        The tokenizer adds BOS in front and the trainer appends EOS after it.
        """
        return example.prompt + example.answer

    def max_prompt_chars(self) -> int | None:
        """An upper bound on a prompt's length in characters, if the task knows one:
        configuration checks compare it with rollout.max_prompt_len before any compute."""
        return None

    def max_answer_chars(self) -> int | None:
        """An upper bound on a correct answer's length in characters, if known."""
        return None

    def data_key(self) -> str:
        """What determines `examples(...)`: datasets built from the task are cached
        under a digest of it, so a changed task never reads stale data."""
        return repr(self)


def load_file(path: str, setting: str):
    """The Python module of the file `path` (relative to the working directory), loaded
    once per file: no PYTHONPATH needed. Raises ValueError naming `setting` when the file
    is missing or fails to import."""
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise ValueError(f"{setting}: no such file {path!r} (a path relative to {os.getcwd()})")
    # One module per file, under a name of its own, so that its classes pickle and a
    # second reference to the file finds the same module.
    digest = hashlib.sha1(full.encode()).hexdigest()[:8]
    module_name = f"replax_user_{os.path.splitext(os.path.basename(full))[0]}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, full)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file may raise anything
        del sys.modules[module_name]
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(
            f"{setting}: importing {path} raised {type(e).__name__}: {first}"
        ) from None
    return module
