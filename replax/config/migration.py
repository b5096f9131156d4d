"""A config from an earlier replax, brought up to date: the one home of old defaults.

A workdir's config.json, or a config file written before a setting existed, lacks that
setting, or holds it under an earlier name. `migrate` moves a renamed setting to its new
name and gives a missing one the value that reproduces what such runs did, so that
`replax.config.spec.parse` reads every config the same way and a run resumes under its old value
(`replax.run.runtime.check_resume_config`).
"""

from __future__ import annotations

import copy
from typing import Any

# Settings renamed after runs were made: old key -> new key. The value carries over.
RENAMED_KEYS = {
    # It cuts the top fraction by covariance; the paper's Clip-Cov is loss.clip_cov_ratio.
    "loss.cov_clip_frac": "loss.cov_cut_frac",
}

# Settings added after runs were made, with the value that reproduces what those runs did.
ADDED_KEYS = {
    "model.scan_layers": False,
    "model.remat_policy": "none",
    "model.attention": "einsum",
    "train.num_microbatches": 1,
    "train.logits_chunk_size": 0,
    "optimizer.state_dtype": "float32",
    "rollout.top_p_candidates": 64,
    "rollout.dtype": "",
    "rollout.cache_dtype": "",
    "rollout.mesh_shape": [],
    "rollout.placement": "colocated",
    "rollout.num_devices": 0,
    "rollout.sync_every": 1,
    "rollout.max_policy_lag": 1,
    "rollout.slots": 0,
    "rollout.refill_every": 4,
    "rollout.max_admit": 0,
    "rollout.drain_halvings": 0,
    "rollout.stream": False,
    "train.max_steps_per_generation": 1,
    "task.long_prompts": "error",
    "loss.positive_weight": 1.0,
    "loss.cov_cut_frac": 0.0,
    "loss.clip_cov_ratio": 0.0,
    "loss.clip_cov_low": 1.0,
    "loss.clip_cov_high": 5.0,
    "loss.kl_cov_frac": 0.0,
    "loss.kl_cov_coef": 1.0,
    # Runs before these wrote no samples.jsonl; their progress off a terminal was silent.
    "eval.num_samples": 0,
    "log.print_every_s": 60.0,
    "eval.max_rows": 0,
    "log.wandb": False,
    "log.wandb_mode": "offline",
    "model.lora_rank": 0,
    "model.lora_alpha": 16.0,
    "model.lora_targets": "q,k,v,o,gate,up,down",
    # The warm start drew from the first 20,000 train examples before the key existed.
    "warmstart.num_examples": 20_000,
    # Auto mode planned y >= B / R only.
    "replay.auto_min_y": 0.0,
    # Auto mode's on-policy steps trained on train.batch_size rollouts.
    "replay.auto_onpolicy_batches": 1,
}

# Settings that do nothing unless another has a value: {key: (that key, its value)}. Where
# it lacks that value the setting takes its old value (ADDED_KEYS), the one a run kept
# before the setting existed holds, so that today's default does not part the two: such a
# run resumes, and a kept run's fingerprint (replax.tools.run_store) stays what it was.
INERT_UNLESS = {
    "replay.auto_min_y": ("replay.mode", "auto"),
    "replay.auto_onpolicy_batches": ("replay.mode", "auto"),
    "warmstart.num_examples": ("model.init", "warmstart"),
}


def without_inert(flat: dict[str, Any]) -> dict[str, Any]:
    """Flat settings (config_utils.flatten) with each INERT_UNLESS setting that has no
    effect at its old value."""
    out = dict(flat)
    for key, (switch, value) in INERT_UNLESS.items():
        if key in out and out.get(switch) != value:
            out[key] = ADDED_KEYS[key]
    return out


def migrate(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a config's plain dict with each RENAMED_KEYS setting moved to its new name
    (the new name wins where a config holds both) and each ADDED_KEYS setting it lacks set
    to the old value (its section created if it has none)."""
    out = copy.deepcopy(config)
    for old, new in RENAMED_KEYS.items():
        (old_section, old_leaf), (new_section, new_leaf) = old.split("."), new.split(".")
        section = out.get(old_section)
        if isinstance(section, dict) and old_leaf in section:
            value = section.pop(old_leaf)
            out.setdefault(new_section, {}).setdefault(new_leaf, value)
    for key, value in ADDED_KEYS.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node.setdefault(leaf, copy.deepcopy(value))
    return out
