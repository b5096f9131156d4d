"""A user's own task, defined outside replax: reverse a short word ("abc>" -> "cba").

The trainer reaches it through `--config.task.name=user_task:make_task` with no change to
replax; tests/user_task_config.py is the config file a user would write for it.
"""

import random

from replax.tasks import Example, Task

LETTERS = "abcdefgh"


class ReverseTask(Task):
    def __init__(self, length: int):
        self.length = length
        self.name = f"reverse{length}"

    def examples(self, split: str, num: int, seed: int = 0) -> list[Example]:
        rng = random.Random(f"{split}:{seed}")
        words = ["".join(rng.choice(LETTERS) for _ in range(self.length)) for _ in range(num)]
        return [Example(prompt=w + ">", answer=w[::-1]) for w in words]

    def reward(self, completion: str, answer: str) -> float:
        # Partial credit per correct position, so that a random policy scores above zero.
        text = completion.strip()
        return sum(a == b for a, b in zip(text, answer)) / len(answer)

    def max_prompt_chars(self) -> int:
        return self.length + 1

    def max_answer_chars(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"ReverseTask(length={self.length})"


def make_task(length: int = 3) -> ReverseTask:
    return ReverseTask(length)
