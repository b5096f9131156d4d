"""Task names: the built-in tasks, user registrations and factories by path."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from replax.tasks.base import Task, load_file

_REGISTRY: dict[str, Callable[..., Task]] = {}
_BUILTIN_REGISTERED = []


def register_task(name: str, factory: Callable[..., Task]) -> None:
    """Makes `task.name=name` build `factory(**task_keys)`."""
    _REGISTRY[name] = factory


def registered_tasks() -> tuple[str, ...]:
    _register_builtin()
    return tuple(sorted(_REGISTRY))


def resolve_factory(name: str) -> Callable[..., Task]:
    """The factory of a registered name, of `package.module:factory` or of
    `path/to/file.py:factory`. Raises ValueError
    (one line) naming what was asked and what is allowed."""
    _register_builtin()
    if name in _REGISTRY:
        return _REGISTRY[name]
    module_name, colon, attr = name.rpartition(":")
    if not colon or not module_name or not attr:
        raise ValueError(
            f"task.name={name!r}: allowed are {registered_tasks()}, 'package.module:factory' "
            "or 'path/to/file.py:factory'"
        )
    if module_name.endswith(".py"):
        module = load_file(module_name, f"task.name={name!r}")
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ValueError(
                f"task.name={name!r}: cannot import {module_name!r} ({e}): the module must be "
                "importable (its directory on PYTHONPATH), or give it as a file path, "
                f"task.name=path/to/file.py:{attr}"
            ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"task.name={name!r}: {module_name} has no callable {attr!r}")
    return factory


def make_task(name: str, **kwargs) -> Task:
    """The task `name` (registered, or `package.module:factory`) built with kwargs."""
    task = resolve_factory(name)(**kwargs)
    if not isinstance(task, Task):
        raise ValueError(
            f"task.name={name!r}: the factory returned {type(task).__name__}, not a "
            "replax.tasks.Task"
        )
    return task


def _register_builtin() -> None:
    if _BUILTIN_REGISTERED:
        return
    _BUILTIN_REGISTERED.append(True)
    from replax.tasks import arith, jsonl, math, word_problems  # noqa: I001

    builtin = {
        "arith": arith.make_arith_task,
        "arith_hard": lambda **kw: arith.ArithTask(arith.HARD, **kw),
        "arith_easy": lambda **kw: arith.ArithTask(arith.EASY, **kw),
        "gsm8k": lambda **kw: math.MathTask(name="gsm8k", **kw),
        "math": lambda **kw: math.MathTask(name="math", **kw),
        "word_problems": word_problems.WordProblemTask,
        "jsonl": jsonl.JsonlTask,
    }
    for name, factory in builtin.items():
        _REGISTRY.setdefault(name, factory)  # a user's registration wins
