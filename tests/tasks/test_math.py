"""Tests for replax/tasks/math.py:
GSM8K and MATH rewards and tasks: splits, settings, prompts, graders."""

import json
import pathlib
import random

import pytest

from replax.tasks import (
    Example,
    make_task,
    math_data,
)
from replax.tasks import math as math_task
from replax.tasks.math import math_reward
from replax.tasks.math_data import read_gsm8k_jsonl

DATA = pathlib.Path(__file__).parent.parent / "data"


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


def test_read_gsm8k_jsonl(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(
        '{"question": "2+2?", "answer": "2+2=4\\n#### 4"}\n\n'
        '{"question": "Big?", "answer": "#### 1,000"}\n'
    )
    assert read_gsm8k_jsonl(path) == [Example("2+2?", "4"), Example("Big?", "1000")]
    task = make_task("gsm8k", files={"test": str(path)})
    assert task.examples("test", 1) == [Example("2+2?", "4")]
    assert task.reward("so \\boxed{4}", "4") == 1.0
    path.write_text('{"question": "2+2?", "answer": "#### 4"}\n{"question": "x"}\n')
    with pytest.raises(ValueError, match=r"train.jsonl:2"):
        read_gsm8k_jsonl(path)


def test_rewards_never_raise():
    rng = random.Random(1)
    alphabet = "0123456789{}\\boxed#$,./%-+ frac\n=x^circ text"
    odd = ["\\frac{1}{0}", "1/0", "\\boxed{1/0}", "#### ", "\\boxed{\\frac{.}{.}}", "\x00" * 5]
    task = math_task.MathTask("math", prompt_format="base")
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        for a, b in (
            [(text, "12"), ("12", text)] + [(o, "1") for o in odd] + [("1", o) for o in odd]
        ):
            assert math_task.gsm8k_reward(a, b) in (0.0, 1.0)
            assert math_reward(a, b) in (0.0, 1.0)
            assert task.reward(a, b) in (0.0, 1.0)
    assert math_task.gsm8k_reward(None, "1") == 0.0  # even not a string


def test_math_task_splits(tmp_path):
    source = DATA / "gsm8k_tiny.jsonl"
    # One file: split by a hash of each question, disjoint, covering, deterministic.
    task = make_task("gsm8k", data_path=str(source), prompt_format="plain", test_fraction=0.25)
    train, test = task.examples("train", 0), task.examples("test", 0)
    assert len(train) + len(test) == 40 and 4 <= len(test) <= 18
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert task.examples("test", 3) == test[:3]
    with pytest.raises(ValueError, match=r"asked 41: allowed is num <= 40|allowed is num <="):
        task.examples("train", 41)
    # A directory with train.jsonl and test.jsonl; or data_path plus test_path.
    lines = source.read_text().splitlines(keepends=True)
    (tmp_path / "train.jsonl").write_text("".join(lines[:30]))
    (tmp_path / "test.jsonl").write_text("".join(lines[30:]))
    by_dir = math_task.MathTask(data_path=str(tmp_path), prompt_format="plain")
    assert len(by_dir.examples("train", 0)) == 30 and len(by_dir.examples("test", 0)) == 10
    by_paths = math_task.MathTask(
        data_path=str(tmp_path / "train.jsonl"),
        test_path=str(tmp_path / "test.jsonl"),
        prompt_format="plain",
    )
    assert by_paths.examples("test", 0) == by_dir.examples("test", 0)
    with pytest.raises(ValueError, match="split 'validation'"):
        by_dir.examples("validation", 1)
    with pytest.raises(ValueError, match="task.data_path"):
        math_task.MathTask(prompt_format="plain").examples("train", 1)
    assert by_dir.data_key() == by_paths.data_key()  # the same files, the same data
    base = math_task.MathTask(data_path=str(tmp_path), prompt_format="base")
    assert base.data_key() != by_dir.data_key()
    assert by_dir.max_prompt_chars() == max(len(e.prompt) for e in math_data.read_gsm8k(source))


def test_an_empty_file_or_split_is_named(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    task = make_task("gsm8k", data_path=str(empty), prompt_format="plain")
    with pytest.raises(ValueError) as error:
        task.examples("train", 1)
    assert str(error.value) == f"task.data_path={str(empty)!r}: {empty} is empty (no examples)"
    # One question, hashed into train: the test split of the file has none.
    one = tmp_path / "one.jsonl"
    one.write_text('{"question": "2+2?", "answer": "#### 4"}\n')
    task = make_task("gsm8k", data_path=str(one), prompt_format="plain")
    assert len(task.examples("train", 0)) == 1
    with pytest.raises(
        ValueError, match=r"none of the 1 examples of .*one.jsonl falls in the test"
    ):
        task.examples("test", 1)


def test_math_task_bad_settings():
    with pytest.raises(ValueError, match="prompt_format='instruct' needs a tokenizer"):
        math_task.MathTask("gsm8k", prompt_format="instruct")
    with pytest.raises(ValueError, match="prompt_format='chat'.*allowed"):
        math_task.MathTask("gsm8k", prompt_format="chat")
    with pytest.raises(ValueError, match="num_shots=9"):
        math_task.MathTask("math", prompt_format="base", num_shots=9)
    with pytest.raises(ValueError, match="task.name='aime'"):
        math_task.MathTask("aime")
    with pytest.raises(ValueError, match=r"task.grader='exact': allowed are \['builtin'"):
        math_task.MathTask("math", grader="exact")


def test_math_verify_grader_missing_package_is_one_line(monkeypatch):
    real = math_task.importlib.util.find_spec
    monkeypatch.setattr(
        math_task.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "math_verify" else real(name, *a),
    )
    with pytest.raises(ValueError, match=r"needs the math-verify package: pip install"):
        math_task.MathTask("math", grader="math_verify")


def test_math_verify_grader_scores_equivalent_forms():
    pytest.importorskip("math_verify")
    assert math_reward("so $\\boxed{0.5}$", "\\frac{1}{2}", "math_verify") == 1.0
    assert math_reward("\\boxed{(1, 2)}", "(1,2)", "math_verify") == 1.0
    assert math_reward("\\boxed{3}", "4", "math_verify") == 0.0
    assert math_reward("no answer here", "4", "math_verify") == 0.0
    assert math_task.gsm8k_reward("so #### 1,000", "1000", "math_verify") == 1.0


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _chat_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from replax.text.hf_tokenizer import HFTokenizer

    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "[UNK]": 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "bos_token": None, "chat_template": CHATML}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return HFTokenizer(tmp_path)


def test_instruct_prompts_use_the_chat_template(tmp_path):
    tokenizer = _chat_tokenizer(tmp_path)
    gsm8k = make_task("gsm8k", data_path=str(DATA / "gsm8k_tiny.jsonl"), tokenizer=tokenizer)
    assert gsm8k.prompt_format == "instruct"  # a tokenizer with a chat template
    example = gsm8k.examples("train", 1)[0]
    question = gsm8k.raw_examples("train")[0].prompt
    assert example.prompt == (
        f"<|im_start|>user\n{question}\n{math_task.GSM8K_INSTRUCTION}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert gsm8k.reward("Let me think.\n#### " + example.answer, example.answer) == 1.0
    math = math_task.MathTask(
        "math",
        data_path=str(DATA / "math_tiny.jsonl"),
        tokenizer=tokenizer,
        system_prompt="You are a careful mathematician.",
    )
    prompt = math.format_prompt("What is 1+1?")
    assert prompt.startswith("<|im_start|>system\nYou are a careful mathematician.<|im_end|>")
    assert "What is 1+1?\nPlease reason step by step, and put your final answer within " in prompt
    assert math.reward("so $\\boxed{\\dfrac{1}{2}}$", "\\frac{1}{2}") == 1.0


def test_base_prompts_are_few_shot_and_cut_at_the_next_question():
    gsm8k = math_task.MathTask(
        "gsm8k", data_path=str(DATA / "gsm8k_tiny.jsonl"), prompt_format="base", num_shots=2
    )
    prompt = gsm8k.format_prompt("How many legs do 3 cats have?")
    question, answer = math_task.GSM8K_SHOTS[0]
    assert prompt.startswith(f"Question: {question}\nAnswer: {answer}\n\n")
    assert prompt.count("Question: ") == 3
    assert prompt.endswith("Question: How many legs do 3 cats have?\nAnswer:")
    # A base model runs on into an invented next exemplar: only its first answer counts.
    completion = " 3 * 4 = 12.\n#### 12\n\nQuestion: What is 2+2?\nAnswer: 4\n#### 4"
    assert gsm8k.reward(completion, "12") == 1.0
    assert gsm8k.reward(completion, "4") == 0.0
    math = math_task.MathTask("math", prompt_format="base")
    assert math.format_prompt("p").endswith("Problem: p\nSolution:")
    assert math.format_prompt("p").count("\\boxed") == 4
