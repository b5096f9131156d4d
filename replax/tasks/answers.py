"""GSM8K and MATH final answers: extraction as the field does it, normalisation, comparison.

Answers. GSM8K: the reference is the text after "####" in the solution, commas removed;
a completion's answer is the text after its last "####", else its last \\boxed{...},
else its last number (commas removed, a trailing period dropped). MATH: the reference is
the `answer` field, else the last \\boxed{...} of the solution; a completion's answer is
its last \\boxed{...} (or \\fbox), else what follows "####", else its last number. Both
sides are normalised as the MATH / Minerva / lm-eval-harness answer checkers do
(`normalize`: \\left \\right, \\! and spacing, \\dfrac -> \\frac, \\frac12 -> \\frac{1}{2},
units such as "\\text{ cm}", ^\\circ, dollars, percent, "x =", trailing ".") and compared
as numbers when both are (0.5 equals \\frac{1}{2}; relative tolerance 1e-6), else as strings.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

# A leading "-" counts as a sign only when it does not follow a word ("5-3", "x-2").
_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|\.\d+)")
BOX_COMMANDS = ("\\boxed", "\\fbox")


# ---------------------------------------------------------------------------------------
# Extraction.


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}, "\\boxed 5"), braces balanced."""
    start = max(text.rfind(command) for command in BOX_COMMANDS)
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


def _after_hashes(text: str) -> str | None:
    if "####" not in text:
        return None
    after = text.rsplit("####", 1)[1].strip()
    return after.splitlines()[0].strip() if after else None


def _last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def gsm8k_reference(solution: str) -> str:
    """The final answer of a GSM8K solution: the text after "####", commas removed."""
    if "####" not in solution:
        raise ValueError('the solution has no "####" final answer')
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def extract_gsm8k_answer(text: str) -> str | None:
    """A GSM8K completion's answer: after its last "####", else its last \\boxed{...},
    else its last number; commas removed and a trailing period dropped."""
    answer = _after_hashes(text)
    if answer is None:
        answer = last_boxed(text)
    if answer is None:
        answer = _last_number(text)
    if answer is None:
        return None
    return answer.replace(",", "").strip().rstrip(".")


def extract_answer(text: str) -> str | None:
    """A MATH-style final answer: the last \\boxed{...}, else what follows "####", else the
    last number; before normalisation. None if there is none."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    after = _after_hashes(text)
    return after if after is not None else _last_number(text)


# ---------------------------------------------------------------------------------------
# Normalisation and comparison.

# Unit words dropped from answers (Minerva's list), when not part of a longer word.
_UNITS = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "inch",
    "ft",
    "hours",
    "km",
    "units",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
)
_UNIT_RE = re.compile(
    r"(?<![A-Za-z\\])(?:" + "|".join(_UNITS) + r")(?:\^[23]|\^\{[23]\})?(?![A-Za-z])"
)
_TEXT_RE = re.compile(r"\\(?:text|textbf|mbox|mathrm|textrm|overline|boxed)\{([^{}]*)\}")


# One argument of \frac: a braced group, a command such as \pi, or a single character.
_FRAC_ARG = r"(\{[^{}]*\}|\\[A-Za-z]+|[^\s{}\\])"


def _fix_fracs(s: str) -> str:
    """\\frac12, \\frac1{2}, \\frac{1}2, \\frac\\pi4 -> \\frac{1}{2}, ..., \\frac{\\pi}{4}."""
    braced = lambda arg: arg if arg.startswith("{") else "{" + arg + "}"
    return re.sub(
        r"\\frac" + _FRAC_ARG + _FRAC_ARG,
        lambda m: "\\frac" + braced(m.group(1)) + braced(m.group(2)),
        s,
    )


def normalize(answer: str) -> str:
    """Canonical string form of a final answer (see the module docstring)."""
    s = answer.strip().replace("\n", "").replace("\\!", "")
    for opening, closing in (("\\(", "\\)"), ("\\[", "\\]")):  # display delimiters
        if s.startswith(opening) and s.endswith(closing):
            s = s[len(opening) : -len(closing)].strip()
    if s.startswith(BOX_COMMANDS) and (boxed := last_boxed(s)) is not None:
        # A box around the whole answer, nested braces and all (\boxed{\frac{1}{2}}).
        if s.endswith("}") and len(boxed) + len(s.split("{", 1)[0]) + 2 == len(s):
            s = boxed.strip()
    s = s.replace("\\\\", "\\").replace("\u2212", "-")
    s = s.replace("{,}", ",")  # 10{,}080: LaTeX's thousands separator
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\^\{?\\circ\}?", "", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    if "\\text{ " in s:  # "5\text{ cm}": a unit after the value
        head = s.split("\\text{ ")[0]
        s = head if head.strip() else s
    for _ in range(3):  # \text{...} and friends, innermost first
        s = _TEXT_RE.sub(r"\1", s)
    s = _UNIT_RE.sub("", s)
    for command in ("\\,", "\\;", "\\:", "\\ ", "~"):
        s = s.replace(command, "")
    s = re.sub(r"\s+", "", s)
    if "=" in s and len(s.split("=")[0]) <= 2:  # "x=5", "k=5": the value
        s = s.split("=", 1)[1]
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = _fix_fracs(s)
    s = re.sub(r"(?<![\d.])\.(?=\d)", "0.", s)  # .5 -> 0.5, {.5} -> {0.5}
    s = s.rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):  # 1,000 -> 1000 (not "1,2")
        s = s.replace(",", "")
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
    """Numeric equality within rel_tol if both are numbers, else normalised string equality."""
    predicted, reference = normalize(predicted), normalize(reference)
    if not predicted:
        return False
    try:
        a, b = to_number(predicted), to_number(reference)
    except (ValueError, ZeroDivisionError):
        a = b = None
    if a is not None and b is not None:
        return a == b or math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=1e-12)
    return predicted == reference
