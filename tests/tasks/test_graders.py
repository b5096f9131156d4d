"""The built-in answer grader (replax/tasks/answers.py) and math_verify against the
hand-written verdicts of tests/tasks/grader_pairs.py; docs/graders.md is their table."""

import os
import sys

import pytest
from grader_pairs import ALGEBRA, PAIRS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import grader_table  # noqa: E402

pytest.importorskip("math_verify")


@pytest.fixture(scope="module")
def rows():
    return grader_table.score()


def wrong(rows, column):
    return [(topic, p, r, expected) for topic, p, r, expected, *v in rows if v[column] != expected]


def test_the_pairs_cover_every_topic_both_ways():
    assert len(PAIRS) >= 100
    assert len({(p, r) for _, p, r, _ in PAIRS}) == len(PAIRS)  # no pair twice
    topics = {topic for topic, *_ in PAIRS}
    assert {"fraction", "dfrac", "decimal", "pi", "units", "thousands", "interval", "set"} <= topics
    assert {"percent", "negative", "wrapper"} <= topics
    for topic in topics:  # each topic has equivalent and non-equivalent pairs
        if topic not in ALGEBRA:
            assert {e for t, _, _, e in PAIRS if t == topic} == {True, False}, topic


def test_builtin_grader_is_right_on_every_pair_it_is_meant_to_handle(rows):
    handled = [row for row in rows if row[0] not in ALGEBRA]
    assert wrong(handled, 0) == []
    # Over all pairs, those needing algebra included: at least 90% right.
    assert len(wrong(rows, 0)) <= 0.1 * len(rows)


def test_builtin_grader_never_calls_a_non_equivalent_pair_equal(rows):
    assert [row for row in wrong(rows, 0) if not row[3]] == []


def test_math_verify_agrees_with_the_hand_verdicts_as_a_reference_should(rows):
    # It decides the algebra pairs; what it misses is listed in docs/graders.md.
    assert wrong([row for row in rows if row[0] in ALGEBRA], 1) == []
    assert len(wrong(rows, 1)) <= 0.05 * len(rows)


def test_docs_graders_md_is_the_scripts_output(rows):
    with open(os.path.join(ROOT, "docs", "graders.md")) as f:
        assert f.read() == grader_table.render(rows), "run python scripts/grader_table.py"
