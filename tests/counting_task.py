"""A user task that counts its calls, for the multi-process tests; also its config file.

  python scripts/train.py --config=tests/counting_task.py --workdir=DIR \
      --config.task.log_dir=LOGS

The reward is an arbitrary, deterministic function of the completion with spread (a
random policy's rollouts of one prompt get different rewards, so every step trains).
With task.log_dir set, each call appends one line to LOGS/reward.P.PID (P the jax process
index, PID the operating system's) and each `examples` call one line to
LOGS/examples.P.PID: the test counts completions scored per process and data builds.
"""

import os
import random
import sys

import ml_collections

from replax.core.config_utils import load_module
from replax.tasks import Example, Task

_HERE = os.path.dirname(os.path.abspath(__file__))
# `counting_task:make_task` is imported by name: its directory must be on the path.
sys.path.insert(0, _HERE)

# Train and test words of different letters: a logged answer says which split it is from.
LETTERS = {"train": "abcd", "test": "efgh"}


def _append(log_dir: str, kind: str, line: str) -> None:
    import jax

    if log_dir:
        path = os.path.join(log_dir, f"{kind}.{jax.process_index()}.{os.getpid()}")
        with open(path, "a") as f:
            f.write(line + "\n")


class CountingTask(Task):
    def __init__(self, log_dir: str = ""):
        self.log_dir = log_dir
        self.name = "counting"

    def examples(self, split: str, num: int, seed: int = 0) -> list[Example]:
        _append(self.log_dir, "examples", f"{split} {num}")
        rng = random.Random(f"{split}:{seed}")
        words = ["".join(rng.choice(LETTERS[split]) for _ in range(3)) for _ in range(num)]
        return [Example(prompt=w + ">", answer=w[::-1]) for w in words]

    def reward(self, completion: str, answer: str) -> float:
        _append(self.log_dir, "reward", answer)
        return (sum(map(ord, completion)) + len(completion)) % 5 / 4

    def max_prompt_chars(self) -> int:
        return 4

    def max_answer_chars(self) -> int:
        return 3

    def __repr__(self) -> str:  # what the data depends on: not where calls are logged
        return "CountingTask()"


def make_task(log_dir: str = "") -> CountingTask:
    return CountingTask(log_dir)


def get_config(arg=None):
    """configs/arith.py (its `arg` variant) with this task."""
    c = load_module(os.path.join(os.path.dirname(_HERE), "configs", "arith.py")).get_config(arg)
    c.task = ml_collections.ConfigDict()
    c.task.name = "counting_task:make_task"
    c.task.log_dir = ""
    c.task.data_seed = 0
    c.task.num_train = 64
    c.task.num_test = 16
    c.task.data_dir = ""
    c.model.init = "random"
    return c
