"""Finished runs kept apart from the machine that made them, found again by their settings.

A study (scripts/compare.py) outlives one machine when each finished run's small files
(`KEPT_FILES`: metrics.jsonl, config.json, the trainer's summary and the cached
re-evaluations; never checkpoints) are copied into a committed directory, one folder per
run named `run_name` (variant, rate, seed and a fingerprint of the settings). A later
study on another machine indexes such directories (`index`) and takes a run from them
instead of running it again when the settings it would run with have the same
`fingerprint`: the run's config.json without the keys that only say where things lie on a
machine (`MACHINE_KEYS`) or how it logs. Reads JSON only: no JAX.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
from typing import Any

from replax.config import migration
from replax.core import config_utils
from replax.tools import analysis

# What a run is rebuilt from: its records, settings, summary (base accuracy) and the
# cached evaluations of its last checkpoint (final_eval_passN.json, transfer_*.json).
KEPT_FILES = (
    "metrics.jsonl",
    analysis.RUN_CONFIG_FILE,
    analysis.SUMMARY_FILE,
    "final_eval_pass*.json",
    "transfer_*.json",
)
# Settings that name places on one machine (the same model or data elsewhere lies
# elsewhere) or only how a run reports and saves itself: not part of what a run is.
MACHINE_KEYS = (
    "model.checkpoint",
    "tokenizer.path",
    "task.data_dir",
    "task.data_path",
    "task.test_path",
    "warmstart.cache_dir",
    "log.*",
    "checkpoint_every",
    "checkpoint_keep",
)


def settings(config: dict[str, Any]) -> dict[str, Any]:
    """The flat settings that make a run what it is: a config (a plain dict, as config.json
    holds it) brought up to date (replax.config.migration: a run written before a setting
    existed ran with its old value) without MACHINE_KEYS; tuples as lists, as JSON has.
    Two configs that run alike have equal settings: a setting without effect takes its old
    value (migration.INERT_UNLESS), and warmstart.num_examples=0 (the task's train split)
    resolves to task.num_train as the trainer resolves it
    (sections.WarmstartSection.config)."""
    plain = json.loads(json.dumps(config, default=list))
    flat = migration.without_inert(config_utils.flatten(migration.migrate(plain)))
    if flat.get("warmstart.num_examples") == 0:
        flat["warmstart.num_examples"] = flat.get("task.num_train") or 0
    return {k: v for k, v in flat.items() if not any(fnmatch.fnmatch(k, p) for p in MACHINE_KEYS)}


def fingerprint(config: dict[str, Any]) -> str:
    """Eight hex digits of a hash of `settings(config)`: equal for runs with equal settings
    on any machine."""
    text = json.dumps(settings(config), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def run_name(variant: str, lr: float, seed: int, config: dict[str, Any]) -> str:
    """The folder a kept run goes to, e.g. replay_lr1e-05_seed0_3f2a9c1b: readable, and
    unique for its settings (two studies' variants of one name but other overrides differ
    in the fingerprint)."""
    return f"{variant}_lr{lr:g}_seed{seed}_{fingerprint(config)}"


def index(roots) -> dict[str, str]:
    """{fingerprint: run directory} of every run under the roots (any depth) that has a
    config.json and a metrics.jsonl; the first root wins where two hold one settings."""
    found: dict[str, str] = {}
    for root in roots:
        for directory, _, files in sorted(os.walk(root)):
            if analysis.RUN_CONFIG_FILE in files and "metrics.jsonl" in files:
                with open(os.path.join(directory, analysis.RUN_CONFIG_FILE)) as f:
                    found.setdefault(fingerprint(json.load(f)), directory)
    return found


def keep(run_dir: str, out_dir: str) -> list[str]:
    """Copies a run's KEPT_FILES into out_dir (created); returns the names copied. A run
    already there (out_dir is run_dir) is left as it is."""
    os.makedirs(out_dir, exist_ok=True)
    if os.path.samefile(run_dir, out_dir):
        return []
    copied = []
    for name in sorted(os.listdir(run_dir)):
        path = os.path.join(run_dir, name)
        if os.path.isfile(path) and any(fnmatch.fnmatch(name, p) for p in KEPT_FILES):
            shutil.copyfile(path, os.path.join(out_dir, name))
            copied.append(name)
    return copied
