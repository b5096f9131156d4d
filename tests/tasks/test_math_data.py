"""Tests for replax/tasks/math_data.py:
reading GSM8K and MATH files: formats, saved datasets, malformed input."""

import json
import pathlib
import re
import sys

import pytest

from replax.tasks import (
    Example,
    math_data,
)
from replax.tasks import math as math_task
from replax.tasks.math import math_reward

DATA = pathlib.Path(__file__).parent.parent / "data"


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
