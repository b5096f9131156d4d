"""Real GSM8K and MATH data (tests/assets.py) through replax's graders.

Every reference solution must score 1 against its own final answer: GSM8K train and test
(8,792 solutions ending in "#### N"), the MATH test set (5,000 solutions, the last
\\boxed{} taken as the reference, as replax.tasks.math_data reads it), MATH train
(7,498 of 7,500: two end in an empty \\boxed{}) and MATH-500 (500 solutions against its
separate `answer` field). The built-in normaliser misses none of them; `KNOWN_MISSES`
lists any that remain (the test allows at most those). The math_verify grader runs on
MATH-500 (also against the next problem's answer) and the MATH test set; its agreement
with the built-in one is printed and checked.

Print the figures with `pytest -s tests/tasks/test_answers_real.py`.
"""

import assets
import pytest

from replax.tasks import math as math_task
from replax.tasks.answers import gsm8k_reference, last_boxed
from replax.tasks.math_data import read_gsm8k, read_math

# (data set, reference) pairs the built-in normaliser does not match: none today.
KNOWN_MISSES: dict[str, list[str]] = {"gsm8k": [], "math_test": [], "math_train": [], "math500": []}

# The least agreement of math_verify with the built-in grader measured on each set.
MIN_AGREEMENT = {"math500": 1.0, "math500_shifted": 1.0, "math_test": 1.0}
# MATH-500 solutions matching the next problem's answer (answers such as "2" recur).
MAX_SHIFTED_MATCHES = 100


def _math_pairs(path, use_answer_field):
    """(solution, reference) of each record: its `answer` field, or its last \\boxed{}."""
    out = []
    for record in assets.read_jsonl(path):
        reference = record["answer"] if use_answer_field else last_boxed(record["solution"])
        out.append((record["solution"], reference))
    return out


def test_every_gsm8k_solution_scores_one_against_its_reference():
    rows = assets.read_jsonl(assets.gsm8k("train")) + assets.read_jsonl(assets.gsm8k("test"))
    assert len(rows) == 7_473 + 1_319
    misses = [
        r["answer"][-60:]
        for r in rows
        if math_task.gsm8k_reward(r["answer"], gsm8k_reference(r["answer"])) != 1.0
    ]
    print(f"\nGSM8K: {len(rows)} solutions, {len(misses)} missed by the built-in grader")
    assert len(misses) <= len(KNOWN_MISSES["gsm8k"]), misses[:10]
    # The reader agrees: the task's answers are the same references.
    assert [e.answer for e in read_gsm8k(assets.gsm8k("test"))][:3] == ["18", "3", "70000"]


@pytest.mark.parametrize(
    "name, split, use_answer_field, count",
    [
        ("math_test", "test", False, 5_000),
        ("math_train", "train", False, 7_500),
        ("math500", None, True, 500),
    ],
)
def test_every_math_solution_scores_one_against_its_reference(name, split, use_answer_field, count):
    path = assets.math500() if split is None else assets.math_file(split)
    pairs = _math_pairs(path, use_answer_field)
    assert len(pairs) == count
    # Two MATH train solutions end in an empty \boxed{} (the data set's own slip): they
    # have no reference, and the reader leaves them out.
    empty = [i for i, (_, reference) in enumerate(pairs) if not reference]
    assert len(empty) == (2 if name == "math_train" else 0)
    pairs = [pair for pair in pairs if pair[1]]
    misses = [ref for solution, ref in pairs if math_task.math_reward(solution, ref) != 1.0]
    print(f"\n{name}: {len(pairs)} solutions, {len(misses)} missed by the built-in grader")
    assert len(misses) <= len(KNOWN_MISSES[name]), misses[:10]
    # The task reads the same references (MATH-500: its answer field).
    assert [e.answer for e in read_math(path)] == [ref.strip() for _, ref in pairs]


@pytest.mark.parametrize("name", ["math500", "math500_shifted", "math_test"])
def test_math_verify_grader_agrees_with_the_builtin_one(name):
    """On matching pairs, and on MATH-500's solutions against the next problem's answer
    (mostly different answers: a grader that accepts too much shows there)."""
    assets.require_module("math_verify", "math-verify")
    path = assets.math_file("test") if name == "math_test" else assets.math500()
    pairs = _math_pairs(path, name != "math_test")
    if name == "math500_shifted":
        pairs = [(s, ref) for (s, _), (_, ref) in zip(pairs, pairs[1:] + pairs[:1])]
    builtin = [math_task.math_reward(s, ref) for s, ref in pairs]
    verified = [math_task.math_reward(s, ref, "math_verify") for s, ref in pairs]
    agree = sum(a == b for a, b in zip(builtin, verified))
    disagree = [ref for (_, ref), a, b in zip(pairs, builtin, verified) if a != b]
    print(
        f"\n{name}: math_verify agrees with the built-in grader on {agree} / {len(pairs)} "
        f"(math_verify scores {sum(verified):.0f}, builtin {sum(builtin):.0f}); "
        f"disagreements {disagree[:10]}"
    )
    assert agree >= MIN_AGREEMENT[name] * len(pairs), disagree[:10]
    if name == "math500_shifted":
        assert sum(builtin) <= MAX_SHIFTED_MATCHES, sum(builtin)


def test_math_verify_grader_through_the_task(tmp_path):
    assets.require_module("math_verify", "math-verify")
    task = math_task.MathTask("math", data_path=str(assets.math500()), grader="math_verify")
    assert task.reward("so $x = \\boxed{0.5}$", "\\frac{1}{2}") == 1.0
    assert task.reward("\\boxed{\\frac{\\pi}{2}}", "\\frac12 \\pi") == 1.0
    assert task.reward("\\boxed{3}", "4") == 0.0
    with pytest.raises(ValueError, match="task.grader='exact': allowed are"):
        math_task.MathTask("math", grader="exact")
