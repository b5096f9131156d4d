"""Tasks with verifiable rewards: a prompt, a reference answer, an exact check.

A task's reward takes the completion text (up to the first stop token, see
`replax.text.tokenizer.decode_completion`) and the reference answer, returns 1.0 or 0.0,
and never raises, whatever the policy wrote.

`make_task(name, **kwargs)` builds a task from the config's `task.name`: a registered
name (`register_task`) or where a user's factory is, `package.module:factory` (imported:
on PYTHONPATH) or `path/to/file.py:factory` (loaded from the file); the factory is called
with the task's own config keys and returns a `Task`. A user's task needs no change to
replax, nor a config file of its own: on a shipped config,
`--config.task.name=path/to/file.py:factory` passes the factory the task.* keys it takes
and drops the file's other task keys while they keep the file's values
(`replax.config.build.fit_task_section`).

The package also holds the graders (`answers`), the GSM8K / MATH readers (`math_data`)
and the prompt pipeline (`pipeline`: a task's prompts as a sharded grain dataset).

May import: core, text.
"""

from replax.tasks.base import SPLITS, Example, Task, draw_split, load_file
from replax.tasks.registry import make_task, register_task, registered_tasks, resolve_factory

__all__ = [
    "SPLITS",
    "Example",
    "Task",
    "draw_split",
    "load_file",
    "make_task",
    "register_task",
    "registered_tasks",
    "resolve_factory",
]
