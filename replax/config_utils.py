"""Small helpers for config files and config checks: variant parsing, ConfigError and
the one-line checks the run spec's sections (`replax.spec`) are written with.

Only scripts and the trainer read a ConfigDict, and only to parse it into a
`replax.spec.RunSpec`; library code takes the spec's sections, keyword arguments or small
frozen dataclasses. Checks run before any compute and raise ConfigError with one line
naming the key and what is allowed.
"""

from __future__ import annotations

import importlib.util
import math
import os


class ConfigError(ValueError):
    """A bad configuration value: the message names the key and what is allowed."""


def parse_variant(arg: str | None, allowed: tuple[str, ...], default: str) -> str:
    """`configs/x.py:variant` -> variant, checked against the allowed names."""
    variant = arg or default
    if variant not in allowed:
        raise ConfigError(f"config variant {variant!r}: allowed are {allowed}")
    return variant


def load_module(path: str):
    """The Python module of a file, loaded by path: config files are not a package
    (ml_collections loads them by path), so configs/gsm8k.py reaches its shared
    configs/_real_models.py this way, and scripts reach config files' get_config."""
    name = f"_replax_config_{os.path.splitext(os.path.basename(path))[0]}_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_sibling(file: str, name: str):
    """The module of file `name` next to `file` (a config file's `__file__`): how a config
    reaches configs/_common.py or configs/_real_models.py."""
    return load_module(os.path.join(os.path.dirname(os.path.abspath(file)), name))


def flag_error_line(error: Exception) -> str:
    """The informative line of a flag-parsing error (config files raise inside absl)."""
    text = str(error).strip().strip('"')
    if isinstance(error, KeyError) or (text.startswith("'") and text.endswith("'")):
        return f"unknown config key {text}: the config file lists the keys it has"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    line = lines[-1] if "Traceback" in str(error) else lines[0]
    head, sep, tail = line.partition(": ")
    return tail if sep and head.rsplit(".", 1)[-1].endswith(("Error", "Exception")) else line


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def one_of(key: str, value, allowed) -> None:
    """`key`'s value is one of `allowed`."""
    require(value in allowed, f"{key}={value!r}: allowed are {tuple(allowed)}")


def positive(key: str, value, *, allow_zero=False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    require(ok, f"{key}={value}: must be {'>= 0' if allow_zero else '> 0'}")


def number(
    key: str,
    value,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
) -> None:
    """`key`'s value is a finite number (an integer if asked) in the given range."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and math.isfinite(value) and (not integer or float(value).is_integer())
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        kind = "an integer" if integer else "a finite number"
        bounds = []
        if low is not None:
            bounds.append(f"{'>' if low_open else '>='} {low:g}")
        if high is not None:
            bounds.append(f"{'<' if high_open else '<='} {high:g}")
        where = f" {' and '.join(bounds)}" if bounds else ""
        raise ConfigError(f"{key}={value!r}: must be {kind}{where}")
