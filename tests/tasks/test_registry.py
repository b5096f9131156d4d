"""Tests for replax/tasks/registry.py:
task names: factories by module or by file path, and what a wrong one says."""

import pathlib

import pytest

from replax.tasks import (
    Example,
    make_task,
    resolve_factory,
)

DATA = pathlib.Path(__file__).parent.parent / "data"


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
