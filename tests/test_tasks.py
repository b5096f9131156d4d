"""Tests for replax/tasks: arithmetic generation and the arith / math rewards."""

import random
import re

import pytest

from replax.tasks import Example, arith, make_task
from replax.tasks.math import extract_answer, math_reward, read_gsm8k_jsonl


def _python_value(prompt: str) -> int:
    assert prompt.endswith("=")
    # Python's eval is the reference; it rejects leading zeros ("007"), so drop them.
    return eval(re.sub(r"\b0+(\d)", r"\1", prompt[:-1]))  # noqa: S307 - digits and +-* only


@pytest.mark.parametrize("difficulty", [arith.EASY, arith.HARD])
def test_answers_match_python(difficulty):
    task = arith.ArithTask(difficulty)
    for split in arith.SPLITS:
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
    from replax.tokenizer import ByteTokenizer, decode_completion

    tok = ByteTokenizer()
    ids = tok.encode("66") + [tok.eos_id] + tok.encode("99") + [tok.pad_id] * 3
    assert arith.check_answer(decode_completion(tok, ids), "66") == 1.0
    assert arith.check_answer(tok.decode(ids), "66") == 0.0  # text after EOS spoils it


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("so the answer is \\boxed{42}.", "42", 1.0),
        ("\\boxed{41} no wait \\boxed{42}", "42", 1.0),  # the last box counts
        ("\\boxed{\\frac{1}{2}}", "1/2", 1.0),
        ("\\boxed{\\dfrac{1}{2}}", "0.5", 1.0),
        ("$\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt{3}}{2}", 1.0),  # nested braces
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{2}}{2}", 0.0),
        ("\\boxed{x^{2}+1}", "x^{2} + 1", 1.0),  # non-numeric: normalised strings
        ("\\boxed{10\\%}", "10", 1.0),
        ("\\boxed{\\text{5 cm}}", "5cm", 1.0),
        ("\\boxed{5", "5", 1.0),  # unbalanced box: falls back to the last number
        ("Tom pays 3 + 4 = 7 dollars.\n#### 7", "7", 1.0),
        ("#### $1,000.", "1000", 1.0),
        ("#### 1,000", "1,000", 1.0),
        ("#### 8", "7", 0.0),
        ("She has 12 apples, so 12 - 5 = 7.", "7", 1.0),  # last number
        ("The total is $1,234.50.", "1234.5", 1.0),
        ("It rose by 25%.", "25", 1.0),
        ("x = 3/4", "0.75", 1.0),
        ("The answer is -7", "-7", 1.0),
        ("The answer is 7", "-7", 0.0),
        ("0.3333", "1/3", 0.0),  # tolerance is relative 1e-6
        ("0.3333333", "1/3", 1.0),
        ("", "7", 0.0),
        ("no number here", "7", 0.0),
        ("\\boxed{}", "7", 0.0),
        ("9" * 10_000, "7", 0.0),
        ("7", "Tom pays 3 + 4 = 7 dollars.\n#### 7", 1.0),  # full reference solution
    ],
)
def test_math_reward(completion, answer, expected):
    assert math_reward(completion, answer) == expected


def test_math_reward_never_raises_on_garbage():
    rng = random.Random(0)
    alphabet = "0123456789{}\\boxed#$,./%-+ frac\n"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        assert math_reward(text, "12") in (0.0, 1.0)
        assert math_reward("12", text) in (0.0, 1.0)


def test_extract_answer():
    assert extract_answer("a \\boxed{\\frac{a}{b}} b") == "\\frac{a}{b}"
    assert extract_answer("\\fbox{3}") == "3"
    assert extract_answer("\\boxed 5$ done") == "5"
    assert extract_answer("steps\n#### 42\nmore") == "42"
    assert extract_answer("from 1 to 2,500 and 3") == "3"
    assert extract_answer("nothing") is None


def test_read_gsm8k_jsonl(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(
        '{"question": "2+2?", "answer": "2+2=4\\n#### 4"}\n\n'
        '{"question": "Big?", "answer": "#### 1,000"}\n'
    )
    assert read_gsm8k_jsonl(path) == [Example("2+2?", "4"), Example("Big?", "1,000")]
    task = make_task("gsm8k", files={"test": str(path)})
    assert task.examples("test", 1) == [Example("2+2?", "4")]
    assert task.reward("so \\boxed{4}", "4") == 1.0
    path.write_text('{"question": "2+2?", "answer": "#### 4"}\n{"question": "x"}\n')
    with pytest.raises(ValueError, match=r"train.jsonl:2"):
        read_gsm8k_jsonl(path)
