r"""Scores the built-in grader and math_verify on the hand-written answer pairs of
tests/tasks/grader_pairs.py and writes docs/graders.md: each grader's accuracy, per topic, and
every pair on which either grader's verdict differs from the expected one.

  python scripts/grader_table.py --out=docs/graders.md

math_verify is scored as task.grader='math_verify' calls it
(`replax.tasks.math.math_verify_match`: each answer parsed as inline LaTeX, $...$, the
reference the gold side).
"""

import argparse
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_pairs():
    """tests/tasks/grader_pairs.py as a module (PAIRS, ALGEBRA)."""
    path = os.path.join(ROOT, "tests", "tasks", "grader_pairs.py")
    spec = importlib.util.spec_from_file_location("grader_pairs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def builtin_verdict(predicted: str, reference: str) -> bool:
    from replax.tasks import answers

    return answers.answers_match(predicted, reference)


def math_verify_verdict(predicted: str, reference: str) -> bool:
    from replax.tasks import math

    return math.math_verify_match(predicted, reference)


def score():
    """[(topic, predicted, reference, expected, builtin, math_verify)] over every pair."""
    return [
        (topic, p, r, expected, builtin_verdict(p, r), math_verify_verdict(p, r))
        for topic, p, r, expected in load_pairs().PAIRS
    ]


def _accuracy(rows, column):
    return sum(row[column] == row[3] for row in rows) / len(rows)


def render(rows) -> str:
    algebra = load_pairs().ALGEBRA
    handled = [row for row in rows if row[0] not in algebra]
    lines = [
        "# Answer graders against hand-written verdicts",
        "",
        f"{len(rows)} final-answer pairs written out by hand, each with the verdict a careful",
        "grader gives (tests/tasks/grader_pairs.py), scored by the built-in grader",
        "(`replax.tasks.answers.answers_match`) and by math_verify. Topic `algebra` needs",
        "symbolic equivalence, which the built-in grader does not attempt; it is meant to get",
        "every other pair right, and tests/tasks/test_graders.py holds it to that. Regenerate with",
        "`python scripts/grader_table.py --out=docs/graders.md`.",
        "",
        "| graded by | all pairs | without `algebra` |",
        "|---|---|---|",
        f"| built-in | {_accuracy(rows, 4):.3f} | {_accuracy(handled, 4):.3f} |",
        f"| math_verify | {_accuracy(rows, 5):.3f} | {_accuracy(handled, 5):.3f} |",
        "",
        "Every pair on which a grader's verdict is not the expected one:",
        "",
        "| topic | predicted | reference | expected | built-in | math_verify |",
        "|---|---|---|---|---|---|",
    ]
    code = lambda s: "`` " + s.replace("|", "\\|") + " ``"
    for topic, p, r, expected, builtin, verified in rows:
        if builtin != expected or verified != expected:
            lines.append(
                f"| {topic} | {code(p)} | {code(r)} | {expected} | {builtin} | {verified} |"
            )
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "graders.md"))
    args = parser.parse_args()
    with open(args.out, "w") as f:
        f.write(render(score()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
