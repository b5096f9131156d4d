"""Tests for replax/tasks/base.py: deterministic disjoint splits, the Task interface's
defaults, and user files loaded by path."""

import pytest

from replax.tasks.base import Example, Task, draw_split, load_file


def _sample(rng):
    n = rng.randrange(50)
    return str(n), n


def _parity(text):  # even numbers are test problems
    return "test" if int(text) % 2 == 0 else "train"


def test_draw_split_is_deterministic_and_keeps_splits_apart():
    test = draw_split("t:test", "test", 20, _sample, _parity, "numbers")
    assert test == draw_split("t:test", "test", 20, _sample, _parity, "numbers")
    assert len(set(test)) == 20 and all(n % 2 == 0 for n in test)  # distinct test items
    train = draw_split("t:train", "train", 200, _sample, _parity, "numbers")
    assert len(train) == 200 and all(n % 2 == 1 for n in train)  # i.i.d., repeats allowed
    assert len(set(train)) < 200
    assert draw_split("t:other", "test", 20, _sample, _parity, "numbers") != test


def test_draw_split_says_what_ran_short_and_how_to_get_more():
    with pytest.raises(ValueError, match="numbers.*more digits"):
        draw_split("t", "test", 26, _sample, _parity, "numbers", hint="more digits")
    with pytest.raises(ValueError, match="split must be one of"):
        draw_split("t", "valid", 1, _sample, _parity, "numbers")


class _Echo(Task):
    name = "echo"

    def examples(self, split, num, seed=0):
        return [Example(prompt=f"{i}=", answer=str(i)) for i in range(num)]

    def reward(self, completion, answer):
        return float(completion.strip() == answer)


def test_task_defaults_score_by_reward_and_demonstrate_prompt_then_answer():
    task = _Echo()
    (example,) = task.examples("train", 1)
    assert task.score("ignored", " 0", "0") == 1.0 and task.score("0=", "1", "0") == 0.0
    assert task.demonstration(example) == "0=0"
    assert task.max_prompt_chars() is None and task.data_key() == repr(task)


def test_load_file_loads_once_and_names_the_setting(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text("COUNT = [0]\nCOUNT[0] += 1\n")
    first = load_file("mine.py", "task.reward='mine.py:fn'")
    assert load_file("mine.py", "x") is first and first.COUNT == [1]
    with pytest.raises(ValueError, match=r"^task\.reward='no\.py:fn': no such file 'no\.py'"):
        load_file("no.py", "task.reward='no.py:fn'")
    (tmp_path / "bad.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match="importing bad.py raised RuntimeError: boom"):
        load_file("bad.py", "task.reward")
