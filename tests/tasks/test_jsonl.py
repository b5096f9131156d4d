"""Tests for replax/tasks/jsonl.py:
task.name=jsonl: records of a file, a reward function by config."""

import json
import pathlib

import numpy as np
import pytest

from replax.rl import evaluation
from replax.tasks import (
    make_task,
)
from replax.text.tokenizer import ByteTokenizer

DATA = pathlib.Path(__file__).parent.parent / "data"


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


def test_jsonl_reward_that_raises_scores_zero_and_is_counted(tmp_path, monkeypatch):
    # The user's function raises on one completion in two; the run scores the task as
    # the trainer does (rl.evaluation.score with the prompts), so the error is counted
    # there, not swallowed by the task.
    (tmp_path / "my_reward.py").write_text(
        "def reward(prompt, completion, answer):\n"
        "    if completion.startswith('x'):\n"
        "        raise ValueError('not a number')\n"
        "    return float(prompt.endswith('=') and completion == answer)\n"
    )
    monkeypatch.chdir(tmp_path)
    task = make_task("jsonl", data_path=write_records("data.jsonl"), reward="my_reward.py:reward")
    tok = ByteTokenizer()
    completions = ["3", "x3", "4", "xx"]
    ids = np.full((4, 4), tok.pad_id, np.int32)
    for i, text in enumerate(completions):
        encoded = tok.encode(text) + [tok.eos_id]
        ids[i, : len(encoded)] = encoded
    rewards, errors = evaluation.score(task, tok, ids, ["3"] * 4, prompts=["1+2="] * 4)
    np.testing.assert_array_equal(rewards, [1.0, 0.0, 0.0, 0.0])
    assert errors == 2


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
