"""A task from a JSONL file of {"prompt", "answer"} records, scored by a reward function
named in the config.

`task.name=jsonl`, `task.data_path=FILE.jsonl`: one JSON object a line, each with a
string `prompt` and an `answer` (a string, or a number written as one). The held-out
split is `task.test_fraction` of the records, chosen by a hash of the prompt, so a
record stays in its split whatever else the file holds.

`task.reward=MODULE:FN` or `path/to/file.py:FN` names FN(prompt, completion, answer) ->
float, called on the host for every completion as the built-in rewards are; an exception
scores 0 and is counted in metrics.jsonl's `reward_errors`. Without it (empty), the
reward is 1.0 when the stripped completion equals the answer or its final answer (the
last \\boxed{}, what follows ####, else the last number) matches it
(`replax.tasks.answers.answers_match`), else 0.0.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import pathlib
from collections.abc import Callable

from replax.tasks.answers import answers_match, extract_answer
from replax.tasks.base import Example, Task, load_file
from replax.tasks.math import _in_test


def exact_answer_reward(prompt: str, completion: str, answer: str) -> float:
    """1.0 when the stripped completion, or its final answer, is the answer."""
    del prompt
    text = completion.strip()
    if text == answer.strip():
        return 1.0
    final = extract_answer(text)
    return float(final is not None and answers_match(final, answer))


def resolve_reward(spec: str) -> Callable[[str, str, str], float]:
    """FN of task.reward='MODULE:FN' or 'path/to/file.py:FN'. Raises ValueError (one line)
    naming task.reward."""
    setting = f"task.reward={spec!r}"
    module_name, colon, attr = spec.rpartition(":")
    if not colon or not module_name or not attr:
        raise ValueError(
            f"{setting}: allowed are 'path/to/file.py:FN' or 'package.module:FN', with "
            "FN(prompt, completion, answer) -> float (empty: exact match of the answer)"
        )
    if module_name.endswith(".py"):
        module = load_file(module_name, setting)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ValueError(
                f"{setting}: cannot import {module_name!r} ({e}): the module must be "
                f"importable (on PYTHONPATH), or give a file, task.reward=path/to/file.py:{attr}"
            ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        what = "nothing" if fn is None else type(fn).__name__
        raise ValueError(
            f"{setting}: {module_name} has no callable {attr!r} ({attr} is {what}): it must "
            "be a function FN(prompt, completion, answer) -> float"
        )
    return fn


def read_records(path: str) -> list[Example]:
    """The file's records as Examples, in file order. Raises ValueError naming
    task.data_path (and the line) on bad input."""
    setting = f"task.data_path={path!r}"
    file = pathlib.Path(path)
    if not path:
        raise ValueError("task.data_path='': task.name='jsonl' reads a JSONL file: set it")
    if not file.is_file():
        raise ValueError(f"{setting}: no such file (a JSONL file of prompt and answer records)")
    examples = []
    with file.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{setting}: line {number} is not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{setting}: line {number} is not a JSON object")
            missing = [k for k in ("prompt", "answer") if k not in record]
            if missing:
                raise ValueError(
                    f"{setting}: line {number} has no {' or '.join(map(repr, missing))} field "
                    "(each record needs 'prompt' and 'answer')"
                )
            prompt, answer = record["prompt"], record["answer"]
            if not isinstance(prompt, str) or not isinstance(answer, str | int | float):
                raise ValueError(
                    f"{setting}: line {number}: 'prompt' must be a string and 'answer' a "
                    "string or a number"
                )
            examples.append(Example(prompt, str(answer)))
    if not examples:
        raise ValueError(f"{setting}: the file has no records")
    return examples


class JsonlTask(Task):
    """Records of a JSONL file, scored by `reward` (a spec, see the module docstring)."""

    name = "jsonl"

    def __init__(self, data_path: str = "", reward: str = "", test_fraction: float = 0.1):
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"task.test_fraction={test_fraction}: allowed is 0 < f < 1")
        self.data_path, self.reward_spec, self.test_fraction = data_path, reward, test_fraction
        self._reward_fn = resolve_reward(reward) if reward else exact_answer_reward
        records = read_records(data_path)
        self._splits = {
            split: [e for e in records if _in_test(e.prompt, test_fraction) == (split == "test")]
            for split in ("train", "test")
        }
        for split, examples in self._splits.items():
            if not examples:
                raise ValueError(
                    f"task.data_path={data_path!r}: none of its {len(records)} records falls "
                    f"in the {split} split (task.test_fraction={test_fraction} of them, by a "
                    "hash of the prompt): use more records"
                )

    def examples(self, split: str, num: int, seed: int = 0) -> list[Example]:
        """The first `num` records of the split (all for num <= 0), in file order."""
        del seed
        if split not in self._splits:
            raise ValueError(f"jsonl: split {split!r}: allowed are 'train', 'test'")
        examples = self._splits[split]
        if num > len(examples):
            raise ValueError(
                f"task.data_path={self.data_path!r}: {len(examples)} {split} records, asked "
                f"{num}: allowed is num <= {len(examples)} (task.num_train / task.num_test, "
                "eval.num_prompts)"
            )
        return list(examples if num <= 0 else examples[:num])

    def score(self, prompt: str, completion: str, answer: str) -> float:
        return float(self._reward_fn(prompt, completion, answer))

    def reward(self, completion: str, answer: str) -> float:
        # Without the prompt: the default reward does not read it.
        return exact_answer_reward("", completion, answer)

    def max_answer_chars(self) -> int:
        return max(len(e.answer) for split in self._splits.values() for e in split)

    def data_key(self) -> str:
        # The file's contents, not only its name: an edited file builds new data.
        digest = hashlib.sha1(pathlib.Path(self.data_path).read_bytes()).hexdigest()[:12]
        return f"JsonlTask({self.data_path!r}, {digest}, {self.test_fraction})"

    def __repr__(self) -> str:
        return (
            f"JsonlTask(data_path={self.data_path!r}, reward={self.reward_spec!r}, "
            f"test_fraction={self.test_fraction})"
        )
