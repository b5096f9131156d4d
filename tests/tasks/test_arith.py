"""Tests for replax/tasks/arith.py:
the embedded arithmetic task: answers, splits, difficulty, rewards."""

import pathlib
import random
import re

import pytest

from replax.tasks import (
    SPLITS,
    Example,
    arith,
    make_task,
)

DATA = pathlib.Path(__file__).parent.parent / "data"


def _python_value(prompt: str) -> int:
    assert prompt.endswith("=")
    # Python's eval is the reference; it rejects leading zeros ("007"), so drop them.
    return eval(re.sub(r"\b0+(\d)", r"\1", prompt[:-1]))  # noqa: S307 - digits and +-* only


@pytest.mark.parametrize("difficulty", [arith.EASY, arith.HARD])
def test_answers_match_python(difficulty):
    task = arith.ArithTask(difficulty)
    for split in SPLITS:
        for example in task.examples(split, 500, seed=3):
            assert re.fullmatch(r"[0-9+\-*]+=", example.prompt)
            assert example.answer == str(_python_value(example.prompt))


def test_evaluate_by_hand():
    assert arith.evaluate("37+48-19") == 66
    assert arith.evaluate("2+3*4-5") == 9
    assert arith.evaluate("1-2*3*4") == -23
    assert arith.evaluate("007+010") == 17


def test_train_test_disjoint():
    task = arith.ArithTask(arith.EASY)
    train = {e.prompt for seed in range(3) for e in task.examples("train", 2000, seed)}
    test = [e.prompt for e in task.examples("test", 500, seed=0)]
    assert not train & set(test)
    assert len(set(test)) == len(test)  # test prompts are distinct
    assert all(arith.split_of(p[:-1]) == "test" for p in test)


def test_split_fraction_is_about_test_fraction():
    rng = random.Random(0)
    expressions = [arith.sample_expression(rng, arith.HARD) for _ in range(4000)]
    fraction = sum(arith.split_of(e, 0.25) == "test" for e in expressions) / len(expressions)
    assert 0.2 < fraction < 0.3


def test_deterministic_by_seed():
    task = arith.ArithTask(arith.HARD)
    assert task.examples("train", 50, seed=7) == task.examples("train", 50, seed=7)
    assert task.examples("train", 50, seed=7) != task.examples("train", 50, seed=8)
    # A prefix of a longer request is the shorter request: sizes do not reshuffle.
    assert task.examples("test", 80, seed=1)[:20] == task.examples("test", 20, seed=1)


def test_difficulty_parameters_respected():
    difficulty = arith.ArithDifficulty(
        min_terms=3, max_terms=4, min_digits=2, max_digits=3, ops="-*", max_mul_operand=5
    )
    examples = arith.ArithTask(difficulty).examples("train", 400, seed=0)
    num_terms = set()
    for example in examples:
        expression = example.prompt[:-1]
        assert "+" not in expression
        terms = re.split(r"[-*]", expression)
        num_terms.add(len(terms))
        ops = re.findall(r"[-*]", expression)
        for i, term in enumerate(terms):
            next_to_mul = (i > 0 and ops[i - 1] == "*") or (i < len(ops) and ops[i] == "*")
            if next_to_mul:
                assert 1 <= int(term) <= 5
            else:
                assert 2 <= len(term) <= 3 and term[0] != "0"
    assert num_terms == {3, 4}
    assert max(len(e.prompt) for e in examples) <= difficulty.max_prompt_chars()


def test_easy_is_easier_than_hard():
    easy = arith.ArithTask(arith.EASY).examples("train", 300)
    assert all(re.fullmatch(r"\d{1,2}[+-]\d{1,2}=", e.prompt) for e in easy)
    hard = arith.ArithTask(arith.HARD).examples("train", 300)
    assert any("*" in e.prompt for e in hard)
    assert max(len(e.prompt) for e in hard) > max(len(e.prompt) for e in easy)


def test_zero_pad_fixes_width():
    difficulty = arith.ArithDifficulty(max_digits=3, ops="+", zero_pad=True)
    for example in arith.ArithTask(difficulty).examples("train", 50):
        assert re.fullmatch(r"\d{3}(\+\d{3})+=", example.prompt)


def test_invalid_difficulty_and_split():
    with pytest.raises(ValueError, match="ops"):
        arith.ArithDifficulty(ops="+/")
    with pytest.raises(ValueError, match="min_terms"):
        arith.ArithDifficulty(min_terms=1)
    with pytest.raises(ValueError, match="split"):
        arith.ArithTask().examples("validation", 1)
    # One-digit "a+b" has 100 expressions, about 10 of them in test: 100 cannot be found.
    tiny = arith.ArithDifficulty(min_terms=2, max_terms=2, max_digits=1, ops="+")
    with pytest.raises(ValueError, match="distinct"):
        arith.ArithTask(tiny).examples("test", 100)


def test_demonstration_is_prompt_then_answer():
    task = make_task("arith_easy")
    assert task.name == "arith_easy"
    assert task.demonstration(Example("37+48-19=", "66")) == "37+48-19=66"


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("66", 1.0),
        (" 66\n", 1.0),
        ("\t66 ", 1.0),
        ("066", 1.0),  # the same integer
        ("67", 0.0),
        ("-66", 0.0),
        ("66.0", 0.0),
        ("6 6", 0.0),
        ("66=66", 0.0),
        ("", 0.0),
        ("   ", 0.0),
        ("abc", 0.0),
        ("\ufffd\x00", 0.0),
        ("9" * 100_000, 0.0),
    ],
)
def test_arith_reward(completion, expected):
    assert arith.ArithTask().reward(completion, "66") == expected


def test_arith_reward_negative_answer_and_odd_reference():
    task = arith.ArithTask()
    assert task.reward("-12", "-12") == 1.0
    assert task.reward("12", "-12") == 0.0
    assert task.reward("12", "garbage") == 0.0  # never raises


def test_arith_reward_with_eos_from_the_sampler():
    from replax.text.tokenizer import ByteTokenizer, decode_completion

    tok = ByteTokenizer()
    ids = tok.encode("66") + [tok.eos_id] + tok.encode("99") + [tok.pad_id] * 3
    assert arith.check_answer(decode_completion(tok, ids), "66") == 1.0
    assert arith.check_answer(tok.decode(ids), "66") == 0.0  # text after EOS spoils it
