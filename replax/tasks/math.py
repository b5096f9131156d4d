"""GSM8K and MATH: the task over local data, its prompts and its rewards.

Answers are extracted, normalised and compared by `replax.tasks.answers` (the last
\\boxed{...}, the text after "####" or the last number, as the field does it); a reward
never raises: anything odd scores 0.0. Data is read by `replax.tasks.math_data`.

Prompts. "instruct": the tokenizer's chat template over the question and the field's
instruction (GSM8K: verl's "Let's think step by step and output the final answer after
"####"."; MATH: Qwen2.5-Math's "Please reason step by step, and put your final answer
within \\boxed{}."). "base": a few-shot prompt with fixed exemplars written for replax.
"plain": the question alone.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import re
import threading

from replax.tasks.answers import BOX_COMMANDS, answers_match, extract_answer, extract_gsm8k_answer
from replax.tasks.base import Example, Task
from replax.tasks.math_data import is_saved_dataset, read_gsm8k, read_math

_MAX_CHARS = 100_000  # completions are capped by the sampler; this guards odd input

# How a final answer is compared with the reference: replax's normaliser
# (`answers.answers_match`) or the math-verify package's parser and sympy comparison
# (pip install 'replax[math_verify]').
GRADERS = ("builtin", "math_verify")

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
PROMPT_FORMATS = ("instruct", "base", "plain")

# Few-shot exemplars for base models (written for replax; GSM8K and MATH style).
GSM8K_SHOTS = (
    (
        "A baker makes 24 muffins in the morning and 18 in the afternoon. He sells 35 of "
        "them. How many muffins are left?",
        "He makes 24 + 18 = 42 muffins. After selling 35, 42 - 35 = 7 are left.\n#### 7",
    ),
    (
        "Tickets cost $6 for adults and $4 for children. How much do 3 adults and 5 "
        "children pay in total?",
        "The adults pay 3 * 6 = 18 dollars and the children pay 5 * 4 = 20 dollars. "
        "Together they pay 18 + 20 = 38 dollars.\n#### 38",
    ),
    (
        "A tank holds 1,200 liters. It is filled at 40 liters per minute. How many minutes "
        "does it take to fill half of the tank?",
        "Half of the tank is 1200 / 2 = 600 liters. At 40 liters per minute this takes "
        "600 / 40 = 15 minutes.\n#### 15",
    ),
    (
        "Mia reads 12 pages a day for 5 days and then 20 pages a day for 3 days. How many "
        "pages does she read?",
        "She reads 12 * 5 = 60 pages and then 20 * 3 = 60 pages, so 60 + 60 = 120 pages.\n#### 120",
    ),
)
MATH_SHOTS = (
    (
        "What is the value of $\\frac{3}{4} + \\frac{1}{6}$?",
        "With the common denominator 12, $\\frac{9}{12} + \\frac{2}{12} = \\frac{11}{12}$. "
        "The final answer is $\\boxed{\\frac{11}{12}}$.",
    ),
    (
        "Solve for $x$: $3x - 7 = 11$.",
        "Adding 7 to both sides gives $3x = 18$, so $x = 6$. The final answer is $\\boxed{6}$.",
    ),
    (
        "How many positive divisors does $36$ have?",
        "$36 = 2^2 \\cdot 3^2$, so it has $(2+1)(2+1) = 9$ divisors. The final answer is "
        "$\\boxed{9}$.",
    ),
    (
        "What is the distance between the points $(1, 2)$ and $(4, 6)$?",
        "The distance is $\\sqrt{(4-1)^2 + (6-2)^2} = \\sqrt{9 + 16} = 5$. The final answer "
        "is $\\boxed{5}$.",
    ),
)
# Where a base model's continuation starts the next exemplar: the answer is cut there.
_NEXT_QUESTION = re.compile(r"\n\s*(?:Question|Problem):")


# ---------------------------------------------------------------------------------------
# Rewards.


def math_verify_match(predicted: str, reference: str) -> bool:
    """math-verify's verdict on two final answers (each parsed as inline LaTeX)."""
    import math_verify

    # Its timeouts use signal.alarm, which only the main thread may set.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = math_verify.parse(f"${reference}$", parsing_timeout=timeout)
    target = math_verify.parse(f"${predicted}$", parsing_timeout=timeout)
    return bool(gold and target and math_verify.verify(gold, target, timeout_seconds=timeout))


def check_grader(grader: str) -> None:
    """Raises a one-line ValueError for an unknown grader or a missing math-verify."""
    if grader not in GRADERS:
        raise ValueError(f"task.grader={grader!r}: allowed are {list(GRADERS)}")
    if grader == "math_verify" and importlib.util.find_spec("math_verify") is None:
        raise ValueError(
            "task.grader='math_verify' needs the math-verify package: pip install "
            "'replax[math_verify]' (or task.grader='builtin')"
        )


def _reward(extract, completion: str, answer: str, grader: str = "builtin") -> float:
    try:
        if len(completion) > _MAX_CHARS or len(answer) > _MAX_CHARS:
            return 0.0
        predicted = extract(completion)
        if predicted is None:
            return 0.0
        match = math_verify_match if grader == "math_verify" else answers_match
        return 1.0 if match(predicted, answer) else 0.0
    except Exception:  # noqa: BLE001 - a reward must never take the trainer down
        return 0.0


def gsm8k_reward(completion: str, answer: str, grader: str = "builtin") -> float:
    """1.0 if the completion's GSM8K answer equals `answer` (the reference final answer),
    else 0.0. Never raises. grader: one of GRADERS."""
    return _reward(extract_gsm8k_answer, completion, answer, grader)


def math_reward(completion: str, answer: str, grader: str = "builtin") -> float:
    """1.0 if the completion's final answer (`extract_answer`) equals `answer`, else 0.0.
    Never raises. grader: one of GRADERS.

    `answer` is the reference final answer ("42", "\\frac{1}{2}"); a full reference
    solution ending in "#### 42" or containing \\boxed{...} also works.
    """
    try:
        if "####" in answer or any(c in answer for c in BOX_COMMANDS):
            answer = extract_answer(answer) or ""
    except Exception:  # noqa: BLE001
        return 0.0
    return _reward(extract_answer, completion, answer, grader)


# ---------------------------------------------------------------------------------------
# The task.


def _in_test(text: str, fraction: float) -> bool:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


class MathTask(Task):
    """GSM8K or MATH problems from local data, with the field's answer checking.

    name: "gsm8k" or "math" (what records look like and how answers are checked).
    Data, per split ("train", "test"): `files[split]` if given; else `test_path` for test
    and `data_path` for train; else `data_path` itself: a saved DatasetDict's split, a
    directory's SPLIT.jsonl / SPLIT.parquet / SPLIT-*.parquet, or one file (or Dataset)
    split by a hash of each problem (`test_fraction` of them in test).
    prompt_format: "instruct" (chat template of `tokenizer`, see
    `replax.text.tokenizer.format_prompt`), "base" (few-shot, `num_shots` exemplars) or "plain";
    None picks "instruct" for a tokenizer with a chat template, "base" for one without,
    "plain" without a tokenizer.
    grader: how answers are compared, "builtin" or "math_verify" (GRADERS).
    """

    def __init__(
        self,
        name: str = "gsm8k",
        *,
        data_path: str | None = None,
        test_path: str | None = None,
        files: dict[str, str] | None = None,
        prompt_format: str | None = None,
        tokenizer=None,
        system_prompt: str | None = None,
        instruction: str | None = None,
        num_shots: int = 4,
        test_fraction: float = 0.1,
        grader: str = "builtin",
    ):
        check_grader(grader)
        if name not in ("gsm8k", "math"):
            raise ValueError(f"task.name={name!r}: allowed are 'gsm8k', 'math'")
        if prompt_format is None:
            has_template = bool(getattr(tokenizer, "chat_template", None))
            prompt_format = "plain" if tokenizer is None else "instruct" if has_template else "base"
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(
                f"task.prompt_format={prompt_format!r}: allowed are {list(PROMPT_FORMATS)}"
            )
        shots = GSM8K_SHOTS if name == "gsm8k" else MATH_SHOTS
        if not 0 <= num_shots <= len(shots):
            raise ValueError(f"task.num_shots={num_shots}: allowed are 0 to {len(shots)}")
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"task.test_fraction={test_fraction}: allowed is 0 < f < 1")
        if prompt_format == "instruct" and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "task.prompt_format='instruct' needs a tokenizer with a chat template "
                f"(got {tokenizer!r}): use prompt_format 'base' or 'plain'"
            )
        self.name = name
        self.data_path, self.test_path = data_path, test_path
        self.files = dict(files or {})
        self.prompt_format = prompt_format
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.instruction = instruction or (
            GSM8K_INSTRUCTION if name == "gsm8k" else MATH_INSTRUCTION
        )
        self.shots = shots[:num_shots]
        self.test_fraction = test_fraction
        self.grader = grader
        self._cache: dict[str, list[Example]] = {}

    # Data.

    def _source(self, split: str) -> tuple[str, str | None, bool]:
        """(path, datasets split, hash-split?) for a split."""
        if split not in ("train", "test"):
            raise ValueError(f"{self.name}: split {split!r}: allowed are 'train', 'test'")
        if split in self.files:
            return self.files[split], split, False
        if split == "test" and self.test_path:
            return self.test_path, split, False
        if self.data_path is None:
            raise ValueError(
                f"{self.name}: no data for split {split!r}: set task.data_path (or files)"
            )
        path = pathlib.Path(self.data_path)
        if split == "train" and self.test_path:
            return str(path), split, False
        if is_saved_dataset(path):
            if (path / "dataset_dict.json").is_file():
                return str(path), split, False
            return str(path), None, True
        if path.is_dir():
            for pattern in (f"{split}.jsonl", f"{split}.parquet", f"{split}-*.parquet"):
                found = sorted(path.glob(pattern))
                if found:
                    return str(found[0]), split, False
            raise ValueError(
                f"{path}: no {split}.jsonl, {split}.parquet or {split}-*.parquet in it"
            )
        return str(path), None, True

    def _source_key(self, split: str) -> str:
        """The setting that names a split's file, e.g. "task.data_path='/data/gsm8k'"."""
        if split in self.files:
            return f"files[{split!r}]={self.files[split]!r}"
        if split == "test" and self.test_path:
            return f"task.test_path={self.test_path!r}"
        return f"task.data_path={self.data_path!r}"

    def raw_examples(self, split: str) -> list[Example]:
        """The split's problems with unformatted prompts, in file order (cached). Raises
        ValueError naming the setting and the file when the split has none."""
        if split not in self._cache:
            path, data_split, hashed = self._source(split)
            if not pathlib.Path(path).exists():
                raise ValueError(
                    f"{self._source_key(split)}: no such file or directory (a JSONL or parquet "
                    "file, a directory of them, or a saved datasets directory)"
                )
            read = read_gsm8k if self.name == "gsm8k" else read_math
            examples = read(path, data_split)
            if not examples:
                raise ValueError(f"{self._source_key(split)}: {path} is empty (no examples)")
            if hashed:
                want = split == "test"
                chosen = [e for e in examples if _in_test(e.prompt, self.test_fraction) == want]
                if not chosen:
                    raise ValueError(
                        f"{self._source_key(split)}: none of the {len(examples)} examples of "
                        f"{path} falls in the {split} split (task.test_fraction="
                        f"{self.test_fraction} of them, by a hash of the prompt): use more "
                        "examples or a task.test_path"
                    )
                examples = chosen
            self._cache[split] = examples
        return self._cache[split]

    def format_prompt(self, question: str) -> str:
        """The prompt the policy sees for a question, in this task's prompt format."""
        from replax.text import tokenizer as tokenizer_lib

        if self.prompt_format == "plain":
            return question
        if self.prompt_format == "instruct":
            return tokenizer_lib.format_prompt(
                self.tokenizer,
                f"{question}\n{self.instruction}",
                style="chat",
                system=self.system_prompt,
            )
        gsm8k = self.name == "gsm8k"
        return tokenizer_lib.format_prompt(
            self.tokenizer,
            question,
            style="base",
            system=self.system_prompt,
            shots=self.shots,
            question_prefix="Question: " if gsm8k else "Problem: ",
            answer_prefix="Answer:" if gsm8k else "Solution:",
        )

    def examples(self, split: str, num: int, seed: int = 0) -> list[Example]:
        """The first `num` problems of the split (all of them for num <= 0), in file order
        (seed unused), with formatted prompts."""
        del seed
        examples = self.raw_examples(split)
        if num > len(examples):
            raise ValueError(
                f"{self.name} {split}: {len(examples)} examples in {self._source(split)[0]}, "
                f"asked {num}: allowed is num <= {len(examples)} (or num <= 0 for all)"
            )
        chosen = examples if num <= 0 else examples[:num]
        return [Example(self.format_prompt(e.prompt), e.answer) for e in chosen]

    # Rewards.

    def reward(self, completion: str, answer: str) -> float:
        try:
            if self.prompt_format == "base":  # a base model goes on to invent the next one
                completion = _NEXT_QUESTION.split(completion, maxsplit=1)[0]
        except Exception:  # noqa: BLE001
            return 0.0
        if self.name == "gsm8k":
            return gsm8k_reward(completion, answer, self.grader)
        return math_reward(completion, answer, self.grader)

    def demonstration(self, example: Example) -> str:
        if self.name == "gsm8k":
            return f"{example.prompt} #### {example.answer}"
        return f"{example.prompt} The final answer is $\\boxed{{{example.answer}}}$."

    def max_prompt_chars(self) -> int | None:
        """The longest formatted prompt of the splits that have data (reading them: a bad
        file raises its ValueError here, before any compute)."""
        lengths = []
        for split in ("train", "test"):
            try:
                self._source(split)
            except ValueError:
                continue
            lengths += [len(e.prompt) for e in self.examples(split, 0)]
        return max(lengths, default=None)

    def data_key(self) -> str:
        sources = []
        for split in ("train", "test"):
            try:
                path = self._source(split)[0]
                stat = os.stat(path)
                sources.append([split, os.path.abspath(path), stat.st_size, stat.st_mtime_ns])
            except (ValueError, OSError):
                sources.append([split, None])
        template = getattr(self.tokenizer, "chat_template", None) or ""
        return json.dumps(
            {
                "name": self.name,
                "sources": sources,
                "format": self.prompt_format,
                "system": self.system_prompt,
                "instruction": self.instruction,
                "shots": len(self.shots),
                "test_fraction": self.test_fraction,
                "tokenizer": repr(self.tokenizer),
                "template": hashlib.sha256(template.encode()).hexdigest()[:16],
            },
            sort_keys=True,
        )

    def __repr__(self) -> str:
        return (
            f"MathTask({self.name!r}, data_path={self.data_path!r}, test_path="
            f"{self.test_path!r}, files={self.files!r}, prompt_format={self.prompt_format!r}, "
            f"grader={self.grader!r})"
        )
