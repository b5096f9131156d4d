"""The arithmetic task with a reward that takes host time, as an external verifier (a code
sandbox, a math checker in another process) does: `--config.task.name=
benchmarks.slow_reward:make_task --config.task.reward_s=S` waits S seconds per scored
batch of `completions` rollouts. Used by the `placement` benchmark."""

import time

from replax.tasks.arith import ArithTask, make_arith_task


class SlowRewardArith(ArithTask):
    def __init__(self, seconds_per_completion: float, **kwargs):
        self.__dict__.update(make_arith_task(**kwargs).__dict__)
        self._seconds = seconds_per_completion

    def reward(self, completion: str, answer: str) -> float:
        time.sleep(self._seconds)  # releases the GIL, as waiting on a verifier does
        return super().reward(completion, answer)


def make_task(reward_s: float = 0.0, completions: int = 16, tokenizer=None, **arith_keys):
    """task.reward_s seconds per scored batch of task.completions; task.* of arith too."""
    del tokenizer  # the arithmetic task needs none
    return SlowRewardArith(reward_s / completions, **arith_keys)
