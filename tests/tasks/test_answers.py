"""Tests for replax/tasks/answers.py: GSM8K and MATH answers, as the field extracts and
normalises them."""

import pytest

from replax.tasks import answers


def test_extract_answer():
    assert answers.extract_answer("a \\boxed{\\frac{a}{b}} b") == "\\frac{a}{b}"
    assert answers.extract_answer("\\fbox{3}") == "3"
    assert answers.extract_answer("\\boxed 5$ done") == "5"
    assert answers.extract_answer("steps\n#### 42\nmore") == "42"
    assert answers.extract_answer("from 1 to 2,500 and 3") == "3"
    assert answers.extract_answer("nothing") is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so 3 + 4 = 7.\n#### 7", "7"),
        ("#### 1,234.", "1234"),
        ("#### 5\nthen more text #### 6", "6"),  # the last "####"
        ("She pays $1,250 in total.", "1250"),  # no "####": the last number
        ("It is 18.", "18"),
        ("Answer: \\boxed{42} (from 40 + 2)", "42"),  # a box beats later numbers
        ("-3 degrees", "-3"),
        ("nothing", None),
    ],
)
def test_extract_gsm8k_answer(text, expected):
    assert answers.extract_gsm8k_answer(text) == expected


def test_gsm8k_reference_removes_commas():
    assert answers.gsm8k_reference("so 1000 + 234\n#### 1,234") == "1234"
    with pytest.raises(ValueError, match="####"):
        answers.gsm8k_reference("no final answer")


@pytest.mark.parametrize(
    "predicted, reference",
    [
        ("\\left( 3, 4 \\right)", "(3,4)"),
        ("\\!5", "5"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\tfrac12", "\\frac{1}{2}"),
        ("\\frac12", "0.5"),  # numbers compare by value
        ("\\frac{3}{4}", "0.75"),
        ("10\\text{ cm}", "10"),
        ("\\text{10 cm}", "10"),
        ("720^\\circ", "720"),
        ("90^{\\circ}", "90"),
        ("\\$31.25", "31.25"),
        ("$5$", "5"),
        ("x = 5", "5"),
        ("k=-3", "-3"),
        ("5.", "5"),
        ("2.50", "2.5"),
        ("5\\sqrt2", "5\\sqrt{2}"),
        ("2, 3", "2,3"),
        ("1,000", "1000"),
        ("\\text{(A)}", "(A)"),
        ("45\\%", "45"),
        ("3\\ \\text{ways}", "3"),
        (".5", "\\frac{1}{2}"),
    ],
)
def test_answers_match_normalisation(predicted, reference):
    assert answers.answers_match(predicted, reference)
    assert answers.answers_match(reference, predicted)


@pytest.mark.parametrize(
    "predicted, reference",
    [("\\frac{1}{3}", "0.33"), ("2,3", "23"), ("5\\sqrt{3}", "5\\sqrt{2}"), ("x+1", "x-1")],
)
def test_answers_differ(predicted, reference):
    assert not answers.answers_match(predicted, reference)
