"""Small helpers for config files and config checks: variant parsing, ConfigError and
the one-line checks the run spec's sections (`replax.config.spec`) are written with.

Only scripts and the trainer read a ConfigDict, and only to parse it into a
`replax.config.spec.RunSpec`; library code takes the spec's sections, keyword arguments or small
frozen dataclasses. Checks run before any compute and raise ConfigError with one line
naming the key and what is allowed.
"""

from __future__ import annotations

import difflib
import importlib.util
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence


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


def flat_keys(config: Mapping) -> list[str]:
    """The dotted keys of a config's leaves ("rollout.group_size", ...)."""
    out = []
    for key, value in config.items():
        if isinstance(value, Mapping) or hasattr(value, "keys"):  # a dict or a ConfigDict
            out += [f"{key}.{k}" for k in flat_keys(value)]
        else:
            out.append(str(key))
    return out


def flatten(tree: Mapping, prefix: str = "") -> dict:
    """A nested dict (a config as config.json holds it) as {dotted key: leaf}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# Words of key names that say "how many" (prompts_per_step is the number of prompts).
_COUNT_WORDS = ("num", "n", "number", "count", "per")


def _stem(word: str) -> str:
    word = "num" if word in _COUNT_WORDS else word
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _words(leaf: str) -> list[str]:
    return [_stem(w) for w in leaf.lower().split("_") if w]


def _same_word(a: str, b: str) -> bool:
    """Two stemmed words (`_words`) are one word, or one misspelt: short words must match
    exactly, since one letter apart they are other words (top_k, top_p)."""
    return a == b or (
        min(len(a), len(b)) >= 4 and difflib.SequenceMatcher(None, a, b).ratio() >= 0.8
    )


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """The hint " (did you mean KNOWN?)" for the known key a mistaken one most likely
    meant, or "". Meaning first: the known key whose leaf shares the most words with the
    key's leaf (rollout.num_prompts -> rollout.prompts_per_step, not the closer spelling
    rollout.max_prompt_len); at equal words, one of the key's own section; then spelling.
    A key sharing no word is suggested only when spelt alike: its leaf among the section's
    keys, or the whole key among every key (a misspelt section; any two keys of one section
    look alike by their shared section, so the whole key is held to a closer match)."""
    section, _, leaf = key.rpartition(".")
    words = _words(leaf)

    def rank(candidate: str) -> tuple[int, bool, float]:
        c_section, _, c_leaf = candidate.rpartition(".")
        c_words = _words(c_leaf)
        shared = sum(any(_same_word(w, c) for c in c_words) for w in words)
        own = c_section == section
        spelling = difflib.SequenceMatcher(
            None, leaf if own else key, c_leaf if own else candidate
        ).ratio()
        return shared, own, spelling

    ranked = [(rank(k), k) for k in known if k != key]
    alike = [(r, k) for r, k in ranked if r[0] or r[2] >= (0.6 if r[1] else 0.8)]
    return f" (did you mean {max(alike)[1]}?)" if alike else ""


def unknown_override(argv: Sequence[str], config: Mapping) -> str | None:
    """The first --config.KEY of a command line that is not a key of `config` (a config
    file's config, before overrides), or None."""
    known = flat_keys(config)
    prefixes = {k.rsplit(".", i)[0] for k in known for i in range(k.count(".") + 1)}
    for arg in argv:
        if arg.startswith("--config."):
            key = arg[len("--config.") :].partition("=")[0]
            if key not in prefixes:
                return key
    return None


def default_workdir(config_flag: str, root: str) -> str:
    """ROOT/runs/NAME, the workdir of a --config=FILE[:VARIANT] run when --workdir is not
    given: NAME is FILE's stem for the file's default config (no variant, or one that
    gives the same config: configs/arith.py:replay is runs/arith) and STEM-VARIANT for
    another (configs/gsm8k.py:qwen2.5-0.5b-instruct is runs/gsm8k-qwen2.5-0.5b-instruct;
    a variant's comma-separated parts are joined by '-')."""
    path, _, arg = config_flag.partition(":")
    name = os.path.splitext(os.path.basename(path))[0]
    if arg:
        module = load_module(path)
        if module.get_config(arg).to_dict() != module.get_config(None).to_dict():
            name = f"{name}-{arg.replace(',', '-').replace(os.sep, '-')}"
    return os.path.join(root, "runs", name)


def flag_error_line(error: Exception, argv: Sequence[str] = (), config=None) -> str:
    """The informative line of a flag-parsing error (config files raise inside absl).

    With the command line and the config file's config (no overrides), an unknown
    --config.KEY is named with its section and the closest key it may have meant."""
    if isinstance(error, KeyError | AttributeError) and config is not None:
        key = unknown_override(argv, config)
        if key is not None:
            return (
                f"unknown config key {key}{did_you_mean(key, flat_keys(config))}: the config "
                "file lists the keys it has"
            )
    text = str(error).strip().strip('"')
    if isinstance(error, KeyError) or (text.startswith("'") and text.endswith("'")):
        return f"unknown config key {text}: the config file lists the keys it has"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    line = lines[-1] if "Traceback" in str(error) else lines[0]
    head, sep, tail = line.partition(": ")
    return tail if sep and head.rsplit(".", 1)[-1].endswith(("Error", "Exception")) else line


def parse_flags_or_exit(argv: Sequence[str]) -> list[str]:
    """absl's flag parsing for `app.run(main, flags_parser=...)`, with a bad flag (an
    enum's unknown value, a malformed number, an unknown flag) reported as this project
    reports bad input: one line naming the flag and what is allowed, exit 2. absl's own
    parser prints a usage hint as well and exits 1."""
    from absl import flags

    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        print(f"error: {flag_error_line(e)}", file=sys.stderr)
        sys.exit(2)


def config_from_argv(argv: Sequence[str], default: str):
    """The config of a command line's --config=FILE[:ARG] (else `default`) as the file
    gives it, without overrides; None when it does not load (its own error is reported)."""
    flag = default
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            flag = arg.split("=", 1)[1]
        elif arg == "--config" and i + 1 < len(argv):
            flag = argv[i + 1]
    path, _, arg = flag.partition(":")
    try:
        return load_module(path).get_config(arg or None)
    except Exception:  # noqa: BLE001 - a missing or broken file: the caller's message
        return None


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
