"""Tests for replax/tasks: arithmetic generation and the arith / math rewards."""

import json
import pathlib
import random
import re
import sys

import pytest

from replax.tasks import (
    SPLITS,
    Example,
    arith,
    make_task,
    math_data,
    resolve_factory,
    word_problems,
)
from replax.tasks import math as math_task
from replax.tasks.math import math_reward
from replax.tasks.math_data import read_gsm8k_jsonl

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


# ---------------------------------------------------------------------------------------
# GSM8K and MATH rewards: never an exception.


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


# ---------------------------------------------------------------------------------------
# The tiny data sets: every reference solution earns its own reward.


def test_gsm8k_tiny_data():
    examples = math_data.read_gsm8k(DATA / "gsm8k_tiny.jsonl")
    assert len(examples) == 40
    assert all(re.fullmatch(r"\d+", e.answer) for e in examples)
    solutions = [json.loads(line)["answer"] for line in open(DATA / "gsm8k_tiny.jsonl")]
    assert any("," in s.split("####")[1] for s in solutions)  # "#### 1,234" is read as 1234
    for example, solution in zip(examples, solutions):
        assert math_task.gsm8k_reward(solution, example.answer) == 1.0
        assert math_task.gsm8k_reward(solution, str(int(example.answer) + 1)) == 0.0


def test_math_tiny_data():
    examples = math_data.read_math(DATA / "math_tiny.jsonl")
    assert len(examples) == 20
    records = [json.loads(line) for line in open(DATA / "math_tiny.jsonl")]
    assert examples[0] == Example(records[0]["problem"], "\\frac{1}{2}")
    assert examples[17].answer == "10"  # the answer field wins over the boxed "10\text{ cm}"
    for example, record in zip(examples, records):
        assert math_reward(record["solution"], example.answer) == 1.0, record["solution"]
        assert math_reward("\\boxed{12345}", example.answer) == 0.0


# ---------------------------------------------------------------------------------------
# Readers: JSONL, parquet, saved datasets; errors name the file and line.


def test_readers_agree_across_formats(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    records = [json.loads(line) for line in open(DATA / "gsm8k_tiny.jsonl")]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "train.parquet")
    jsonl = math_data.read_gsm8k(DATA / "gsm8k_tiny.jsonl")
    assert math_data.read_gsm8k(tmp_path / "train.parquet") == jsonl


def test_reads_a_saved_datasets_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    records = [json.loads(line) for line in open(DATA / "math_tiny.jsonl")]
    records = [{k: r[k] for k in ("problem", "solution")} for r in records]
    data = datasets.DatasetDict(
        train=datasets.Dataset.from_list(records[:15]),
        test=datasets.Dataset.from_list(records[15:]),
    )
    data.save_to_disk(str(tmp_path / "math"))
    task = math_task.MathTask("math", data_path=str(tmp_path / "math"), prompt_format="plain")
    assert len(task.examples("train", 0)) == 15 and len(task.examples("test", 0)) == 5


def test_saved_dataset_without_datasets_installed(tmp_path, monkeypatch):
    (tmp_path / "dataset_dict.json").write_text('{"splits": ["train"]}')
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ValueError, match="pip install datasets"):
        math_data.read_math(tmp_path, "train")


@pytest.mark.parametrize(
    "content, message",
    [
        (
            '{"question": "q", "answer": "#### 1"}\n\n{"question": "q"}\n',
            r"bad.jsonl:3: .*'answer'",
        ),
        ('{"question": "q", "answer": "no hashes"}\n', r"bad.jsonl:1: .*####"),
        ('{"question": "q", "answer": "#### 1"}\n{oops\n', r"bad.jsonl:2: not JSON"),
        ('["a list"]\n', r"bad.jsonl:1: .*not an object"),
    ],
)
def test_malformed_gsm8k_lines(tmp_path, content, message):
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        math_data.read_gsm8k(tmp_path / "bad.jsonl")
    assert "\n" not in str(info.value)


def test_malformed_math_and_missing_files(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"problem": "p", "solution": "no box"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: .*no answer"):
        math_data.read_math(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match=r"nope.jsonl: no such file"):
        math_data.read_gsm8k(tmp_path / "nope.jsonl")
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match=r"bad.parquet: not a readable parquet"):
        math_data.read_gsm8k(tmp_path / "bad.parquet")


def test_a_users_task_by_file_path_needs_no_pythonpath(tmp_path, monkeypatch):
    """task.name=path/to/file.py:factory loads the file, relative to the working directory;
    the module is loaded once, so a second name of the file gives the same factory."""
    (tmp_path / "my_tasks.py").write_text(
        "from replax.tasks import Example, Task\n"
        "class Echo(Task):\n"
        "    name = 'echo'\n"
        "    def __init__(self, word='ab'):\n"
        "        self.word = word\n"
        "    def examples(self, split, num, seed=0):\n"
        "        return [Example(self.word, self.word)] * num\n"
        "    def reward(self, completion, answer):\n"
        "        return float(completion == answer)\n"
        "def make(word='ab'):\n"
        "    return Echo(word)\n"
    )
    monkeypatch.chdir(tmp_path)
    task = make_task("my_tasks.py:make", word="xy")
    assert task.examples("train", 2) == [Example("xy", "xy")] * 2
    assert task.reward("xy", "xy") == 1.0
    assert resolve_factory(f"{tmp_path}/my_tasks.py:make") is resolve_factory("my_tasks.py:make")


@pytest.mark.parametrize(
    "name, message",
    [
        (
            "no_such_module:make_task",
            "task.name='no_such_module:make_task': cannot import 'no_such_module' (No module "
            "named 'no_such_module'): the module must be importable (its directory on "
            "PYTHONPATH), or give it as a file path, task.name=path/to/file.py:make_task",
        ),
        ("nowhere/tasks.py:make", "task.name='nowhere/tasks.py:make': no such file"),
        ("broken.py:make", "task.name='broken.py:make': importing broken.py raised ZeroDivision"),
        ("broken_ok.py:missing", "task.name='broken_ok.py:missing': "),
    ],
)
def test_a_users_task_that_does_not_load_says_how_to_name_it(tmp_path, monkeypatch, name, message):
    (tmp_path / "broken.py").write_text("1 / 0\n")
    (tmp_path / "broken_ok.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as info:
        make_task(name)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_a_missing_data_file_names_task_data_path(tmp_path):
    missing = str(tmp_path / "nope.jsonl")
    task = make_task("gsm8k", data_path=missing, prompt_format="plain")
    with pytest.raises(ValueError) as info:
        task.examples("train", 1)
    message = str(info.value)
    assert message.startswith(f"task.data_path={missing!r}: no such file or directory"), message
    assert "\n" not in message


# ---------------------------------------------------------------------------------------
# MathTask: splits, prompt formats, rewards.


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


# ---------------------------------------------------------------- word problems


def _solve_word_problem(question: str) -> int:
    """An independent reading of a generated problem: its numbers and which template's
    phrases it has give the answer."""
    n = [int(x) for x in re.findall(r"\d+", question)]
    if "A friend has" in question:  # a, and the friend a + more: together
        return n[0] + (n[0] + n[1])
    if "into" in question and "same number in each" in question:
        return n[0] // n[1]
    if "gives away" in question:  # a containers of b, c given away
        return n[0] * n[1] - n[2]
    if "in each" in question and " has " in question:  # c, then a containers of b
        return n[0] + n[1] * n[2]
    if "in each" in question:
        return n[0] * n[1]
    if "and then gives" in question:
        return n[0] + n[1] - n[2]
    if "gives" in question:
        return n[0] - n[1]
    assert "buys" in question and "more" in question, question
    return n[0] + n[1]


def test_word_problem_answers_are_right_by_construction():
    task = word_problems.WordProblemTask(prompt_format="plain", instruction="")
    seen = set()
    for split in SPLITS:
        for question, answer in task.problems(split, 400, seed=1):
            assert answer == _solve_word_problem(question) and answer >= 0, question
            seen.add(next(t.__name__ for t in _templates() if _matches(t, question)))
    assert len(seen) == 8  # every template is drawn


def _templates():
    return [t for templates in word_problems.TEMPLATES.values() for t in templates]


def _matches(template, question):
    """Whether `template` can write `question`: its text with the numbers blanked."""
    blank = re.sub(r"\d+", "#", question)
    for name, pronoun in word_problems._NAMES:
        for thing, container in word_problems._THINGS:
            rng = random.Random(0)
            d = word_problems._Draw(name, pronoun, thing, container, rng, 20)
            if re.sub(r"\d+", "#", template(d)[0]) == blank:
                return True
    return False


def test_word_problems_by_hand():
    rng = random.Random(0)
    draw = word_problems._Draw("Maria", "she", "apples", "bag", rng, 20)
    question, answer = word_problems._add(draw)
    a, b = (int(x) for x in re.findall(r"\d+", question))
    assert question == (
        f"Maria has {a} apples. She buys {b} more. How many apples does Maria have now?"
    )
    assert answer == a + b
    question, answer = word_problems._multiply_subtract(
        word_problems._Draw("Omar", "he", "pencils", "box", rng, 20)
    )
    assert question.startswith("Omar buys ") and " boxes of pencils with " in question
    assert " He gives away " in question and answer == _solve_word_problem(question)


def test_word_problems_deterministic_by_seed_and_splits_disjoint():
    task = word_problems.WordProblemTask(prompt_format="plain")
    assert task.examples("train", 50, seed=3) == task.examples("train", 50, seed=3)
    assert task.examples("train", 50, seed=3) != task.examples("train", 50, seed=4)
    train = {q for q, _ in task.problems("train", 3000)}
    test = [q for q, _ in task.problems("test", 300)]
    assert len(set(test)) == len(test) and not train & set(test)
    assert all(word_problems.split_of(q, 0.1) == "test" for q in test)
    # The step counts asked for: one-step problems only.
    one_step = word_problems.WordProblemTask(steps=(1,), prompt_format="plain")
    names = {t.__name__ for t in word_problems.TEMPLATES[1]}
    for question, _ in one_step.problems("train", 200):
        assert any(_matches(t, question) for t in word_problems.TEMPLATES[1]), question
    assert names == {"_add", "_subtract", "_multiply", "_divide"}


def test_word_problem_rewards_on_hand_made_completions():
    task = make_task("word_problems", prompt_format="plain")
    assert task.reward("Maria has 7 + 5 = 12 apples.\n#### 12", "12") == 1.0
    assert task.reward("7 + 5 = 12", "12") == 1.0  # no "####": the last number
    assert task.reward("#### 12\nThe answer is 13.", "12") == 1.0  # the last "####" wins
    assert task.reward("7 + 5 = 12, so she has 13.", "12") == 0.0
    assert task.reward("She has twelve apples.", "12") == 0.0
    assert task.reward("#### 1,200", "1200") == 1.0
    assert task.reward("", "12") == 0.0
    assert task.reward("x" * 200_000, "12") == 0.0
    example = task.examples("test", 1)[0]
    assert example.prompt.endswith("\n" + word_problems.INSTRUCTION)
    assert task.reward(task.demonstration(example)[len(example.prompt) :], example.answer) == 1.0


def test_word_problem_prompts_use_the_chat_template(tmp_path):
    tokenizer = _chat_tokenizer(tmp_path)
    task = make_task("word_problems", tokenizer=tokenizer, instruction="Answer with a number.")
    question, _ = task.problems("test", 1)[0]
    assert task.examples("test", 1)[0].prompt == (
        f"<|im_start|>user\n{question}\nAnswer with a number.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert len(task.examples("test", 1)[0].prompt) <= task.max_prompt_chars()


def test_word_problem_bad_settings_are_one_line():
    for kwargs, words in [
        (dict(steps=(3,)), "task.steps"),
        (dict(steps=()), "task.steps"),
        (dict(max_number=2), "task.max_number"),
        (dict(test_fraction=1.0), "task.test_fraction"),
        (dict(prompt_format="base"), "task.prompt_format"),
        (dict(prompt_format="instruct"), "chat template"),
    ]:
        with pytest.raises(ValueError, match=words):
            word_problems.WordProblemTask(**kwargs)
    with pytest.raises(ValueError, match="split"):
        word_problems.WordProblemTask(prompt_format="plain").problems("valid", 1)


# ---------------------------------------------------------------------------------------
# task.name=jsonl: records of a file, a reward function by config.


def write_records(path, num=40):
    """num addition records, "a+b=" -> "a+b"."""
    with open(path, "w") as f:
        for i in range(num):
            f.write(json.dumps({"prompt": f"{i}+{2 * i}=", "answer": str(3 * i)}) + "\n")
    return str(path)


def test_jsonl_task_splits_by_a_hash_of_the_prompt(tmp_path):
    data = write_records(tmp_path / "data.jsonl")
    task = make_task("jsonl", data_path=data, test_fraction=0.25)
    train, test = task.examples("train", 0), task.examples("test", 0)
    assert len(train) + len(test) == 40 and test
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    # A record keeps its split when the file changes around it.
    more = write_records(tmp_path / "more.jsonl", 80)
    bigger = make_task("jsonl", data_path=more, test_fraction=0.25)
    assert {e.prompt for e in test} <= {e.prompt for e in bigger.examples("test", 0)}
    assert task.examples("test", 2) == test[:2]


def test_jsonl_default_reward_is_an_exact_final_answer(tmp_path):
    task = make_task("jsonl", data_path=write_records(tmp_path / "data.jsonl"))
    assert task.score("1+2=", " 3 ", "3") == 1.0
    assert task.score("1+2=", "so it is 3", "3") == 1.0
    assert task.score("1+2=", "4", "3") == 0.0
    assert task.reward("3", "3") == 1.0


def test_jsonl_reward_by_file_gets_prompt_completion_and_answer(tmp_path, monkeypatch):
    (tmp_path / "my_reward.py").write_text(
        "def reward(prompt, completion, answer):\n    return len(prompt + completion + answer)\n"
    )
    monkeypatch.chdir(tmp_path)
    task = make_task("jsonl", data_path=write_records("data.jsonl"), reward="my_reward.py:reward")
    assert task.score("ab", "c", "de") == 5.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"data_path": "nope.jsonl"}, "task.data_path='nope.jsonl': no such file"),
        ({"reward": "no_colon"}, "task.reward='no_colon': allowed are 'path/to/file.py:FN'"),
        ({"reward": "nope.py:fn"}, "task.reward='nope.py:fn': no such file"),
        ({"reward": "my_reward.py:LIMIT"}, "task.reward='my_reward.py:LIMIT': my_reward.py has "),
        ({"reward": "no_such_mod:fn"}, "task.reward='no_such_mod:fn': cannot import"),
        ({"data_path": "no_answer.jsonl"}, "task.data_path='no_answer.jsonl': line 2 has no "),
    ],
)
def test_jsonl_bad_settings_name_the_key(tmp_path, monkeypatch, kwargs, message):
    monkeypatch.chdir(tmp_path)
    write_records("data.jsonl")
    (tmp_path / "my_reward.py").write_text("LIMIT = 3\n")
    (tmp_path / "no_answer.jsonl").write_text('{"prompt": "a", "answer": "b"}\n{"prompt": "c"}\n')
    with pytest.raises(ValueError) as info:
        make_task("jsonl", **{"data_path": "data.jsonl", **kwargs})
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)
