"""Small helpers for config files and config checks: variant parsing, ConfigError and
the one-line checks `replax.configuration.validate` is written with.

Only scripts, the trainer and `replax.configuration` read a ConfigDict; library code
takes keyword arguments or small frozen dataclasses. Checks run before any compute and
raise ConfigError with one line naming the key and what is allowed.
"""

from __future__ import annotations

import math

import ml_collections


class ConfigError(ValueError):
    """A bad configuration value: the message names the key and what is allowed."""


def parse_variant(arg: str | None, allowed: tuple[str, ...], default: str) -> str:
    """`configs/x.py:variant` -> variant, checked against the allowed names."""
    variant = arg or default
    if variant not in allowed:
        raise ConfigError(f"config variant {variant!r}: allowed are {allowed}")
    return variant


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def one_of(config: ml_collections.ConfigDict, key: str, allowed) -> None:
    value = get(config, key)
    require(value in allowed, f"{key}={value!r}: allowed are {tuple(allowed)}")


def positive(config: ml_collections.ConfigDict, key: str, *, allow_zero=False) -> None:
    value = get(config, key)
    ok = value >= 0 if allow_zero else value > 0
    require(ok, f"{key}={value}: must be {'>= 0' if allow_zero else '> 0'}")


def get(config: ml_collections.ConfigDict, key: str):
    node = config
    for part in key.split("."):
        node = node[part]
    return node


def number(
    config: ml_collections.ConfigDict,
    key: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
) -> None:
    """key holds a finite number (an integer if asked) in the given range."""
    value = get(config, key)
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
