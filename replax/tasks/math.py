"""Final-answer checking for GSM8K- and MATH-style problems.

The final answer of a completion is the content of its last \\boxed{...} (nested
braces allowed), else what follows its last "####", else its last number. Both the
completion's answer and the reference are normalised (commas, $, %, trailing ".",
spaces, \\text{...}, \\dfrac) and compared as numbers (integers, decimals, a/b,
\\frac{a}{b}) with a relative tolerance, else as normalised strings.
"""

from __future__ import annotations

import json
import math
import pathlib
import re
from fractions import Fraction

from replax.tasks import Example, Task

_MAX_CHARS = 100_000  # completions are capped by the sampler; this guards odd input
# A leading "-" counts as a sign only when it does not follow a word ("5-3", "x-2").
_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|\.\d+)")
_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}, "\\boxed 5"), braces balanced."""
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start:]
    rest = rest[len("\\boxed") if rest.startswith("\\boxed") else len("\\fbox") :]
    if rest.startswith(" "):  # "\boxed 5": up to the next "$" or whitespace
        words = rest.split("$")[0].split()
        return words[0] if words else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None  # unbalanced: no answer


def extract_answer(text: str) -> str | None:
    """The final answer stated in `text`, before normalisation; None if there is none."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if "####" in text:
        after = text.rsplit("####", 1)[1].strip()
        return after.splitlines()[0] if after else None
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def normalize(answer: str) -> str:
    """Canonical string form of a final answer (see the module docstring)."""
    s = answer.strip()
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)  # \text{cm} -> cm
    s = s.replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", "")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)  # \frac12 -> \frac{1}{2}
    s = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s)  # \sqrt3 -> \sqrt{3}
    s = re.sub(r"\^\{?\\circ\}?", "", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = s.replace("\u2212", "-")  # unicode minus
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)  # 1,000 -> 1000 (not "1,2")
    s = s.rstrip(".")
    if re.fullmatch(r"-?\d+\.\d*?0+", s):  # 2.50 -> 2.5, 3.0 -> 3
        s = s.rstrip("0").rstrip(".")
    return s


def to_number(s: str) -> Fraction | None:
    """The value of a normalised answer if it is a plain number or fraction."""
    if len(s) > 200:
        return None
    if m := re.fullmatch(r"(-?)\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", s):
        value = Fraction(m.group(2)) / Fraction(m.group(3))
        return -value if m.group(1) else value
    if m := re.fullmatch(r"(-?[\d.]+)/(-?[\d.]+)", s):
        return Fraction(m.group(1)) / Fraction(m.group(2))
    if re.fullmatch(r"-?(\d+\.?\d*|\.\d+)", s):
        return Fraction(s)
    return None


def answers_match(predicted: str, reference: str, rel_tol: float = 1e-6) -> bool:
    """Numeric equality within rel_tol if both are numbers, else string equality."""
    predicted, reference = normalize(predicted), normalize(reference)
    if not predicted:
        return False
    a, b = to_number(predicted), to_number(reference)
    if a is not None and b is not None:
        return a == b or math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=1e-12)
    return predicted == reference


def math_reward(completion: str, answer: str) -> float:
    """1.0 if the completion's final answer equals `answer`, else 0.0. Never raises.

    `answer` is the reference final answer ("42", "\\frac{1}{2}"); a full reference
    solution ending in "#### 42" or containing \\boxed{...} also works.
    """
    try:
        if len(completion) > _MAX_CHARS:
            return 0.0
        predicted = extract_answer(completion)
        if predicted is None:
            return 0.0
        if "####" in answer or any(c in answer for c in _BOX_COMMANDS):
            answer = extract_answer(answer) or ""
        return 1.0 if answers_match(predicted, answer) else 0.0
    except Exception:  # noqa: BLE001 - a reward must never take the trainer down
        return 0.0


def read_gsm8k_jsonl(path: str | pathlib.Path) -> list[Example]:
    """Examples from a GSM8K-format JSONL file: {"question": ..., "answer": "... #### 42"}.

    The prompt is the question; the answer is the text after "####". Raises
    ValueError naming the file and the 1-based line number of a malformed line.
    """
    path = pathlib.Path(path)
    out = []
    with path.open(encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                question, solution = record["question"], record["answer"]
                if not isinstance(question, str) or not isinstance(solution, str):
                    raise TypeError("question and answer must be strings")
                if "####" not in solution:
                    raise ValueError('answer has no "####" final answer')
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(
                    f"{path}:{line_number}: malformed GSM8K line ({type(e).__name__}: {e})"
                ) from e
            final = solution.rsplit("####", 1)[1].strip()
            out.append(Example(prompt=question, answer=final))
    return out


class MathTask(Task):
    """GSM8K / MATH style problems; examples come from local JSONL files, if given."""

    def __init__(self, name: str = "gsm8k", *, files: dict[str, str] | None = None):
        self.name = name
        self.files = dict(files or {})

    def examples(self, split: str, num: int, seed: int = 0) -> list[Example]:
        """The first `num` examples of the split's file, in file order (seed unused)."""
        del seed
        if split not in self.files:
            raise ValueError(
                f"{self.name}: no file for split {split!r}; pass files={{'{split}': path}}"
            )
        examples = read_gsm8k_jsonl(self.files[split])
        if num > len(examples):
            raise ValueError(f"{self.files[split]} has {len(examples)} examples, asked {num}")
        return examples[:num]

    def reward(self, completion: str, answer: str) -> float:
        return math_reward(completion, answer)

    def demonstration(self, example: Example) -> str:
        return f"{example.prompt}\n#### {example.answer}"
