"""Tests for replax/tasks/word_problems.py:
the word-problem task: answers by construction, splits, rewards, prompts."""

import pathlib
import random
import re

import pytest
from test_math import _chat_tokenizer

from replax.tasks import (
    SPLITS,
    make_task,
    word_problems,
)

DATA = pathlib.Path(__file__).parent.parent / "data"


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
