"""LoRA adapters: which params train, the base they adapt, merging, and PEFT's format.

The adapters live in the model's own params, beside the weight they adapt (`q_lora_a`,
`q_lora_b` next to `attn/q`; see `model.project`), so one tree serves the sampler, the
evaluator and the checkpoint, and under `scan_layers` they are stacked and scanned with
their layer. Written here rather than taken from qwix (tunix's LoRA): qwix adapts
flax's nn.Dense / nn.Einsum modules, and replax's projections are raw params multiplied
by `model.dense` (2-D matmuls kept for XLA:CPU's layouts), with the fp32-to-bf16 cast
pinned to each weight's shard inside the scanned, rematerialised Block; adapters declared
in the same place inherit all of that and the logical-axis sharding with no interception.

With LoRA on, `partition` splits the params into the trainable adapters and the frozen
base: the train step differentiates only the adapters and keeps optimizer state only for
them, and the KL reference is the base alone (no second copy of the weights).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import traverse_util

from replax.model_config import ModelConfig

SUFFIXES = ("_lora_a", "_lora_b")
# replax's projection -> (its module in a transformers decoder layer, its PEFT name).
HF_MODULES = {
    "q": ("self_attn", "q_proj"),
    "k": ("self_attn", "k_proj"),
    "v": ("self_attn", "v_proj"),
    "o": ("self_attn", "o_proj"),
    "gate": ("mlp", "gate_proj"),
    "up": ("mlp", "up_proj"),
    "down": ("mlp", "down_proj"),
}
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"


def enabled(config: ModelConfig) -> bool:
    return config.lora_rank > 0


def base_config(config: ModelConfig) -> ModelConfig:
    """The config of the base model: the same without adapters."""
    return dataclasses.replace(config, lora_rank=0)


def is_adapter(path: tuple[str, ...]) -> bool:
    return path[-1].endswith(SUFFIXES)


def partition(params, lora_on: bool):
    """(trainable, frozen): with LoRA on, the adapters and the base params (nested dicts
    of the same layout, each holding only its leaves); off, (params, None)."""
    if not lora_on:
        return params, None
    flat = traverse_util.flatten_dict(params)
    adapters = {k: v for k, v in flat.items() if is_adapter(k)}
    base = {k: v for k, v in flat.items() if not is_adapter(k)}
    return traverse_util.unflatten_dict(adapters), traverse_util.unflatten_dict(base)


def combine(trainable, frozen):
    """The inverse of `partition`: the whole params."""
    if frozen is None:
        return trainable
    flat = traverse_util.flatten_dict(frozen)
    flat.update(traverse_util.flatten_dict(trainable))
    return traverse_util.unflatten_dict(flat)


def without_adapters(params):
    """The base params: the model they give is the one before any adapter."""
    return partition(params, True)[1]


def has_adapters(params) -> bool:
    return any(is_adapter(k) for k in traverse_util.flatten_dict(nn.unbox(params)))


def merged(params, config: ModelConfig):
    """The base params with each adapter folded into its weight, W + A B * alpha / r (in
    float32, back to W's dtype): a model without adapters that computes the same
    function, for export."""
    params = nn.unbox(params)
    adapters, base = partition(params, True)
    flat_base = traverse_util.flatten_dict(base)
    flat_adapters = traverse_util.flatten_dict(adapters)
    for path, a in flat_adapters.items():
        if not path[-1].endswith("_lora_a"):
            continue
        name = path[-1][: -len("_lora_a")]
        b = flat_adapters[(*path[:-1], f"{name}_lora_b")]
        weight_path = (*path[:-1], name)
        w = flat_base[weight_path]
        flat_base[weight_path] = _fold(w, a, b, config.lora_scale, stacked="layers" in path)
    return traverse_util.unflatten_dict(flat_base)


def _fold(w, a, b, scale: float, stacked: bool):
    """w + a b * scale over the rank axis (a's last, b's first after the [L] axis of
    scanned layers)."""
    w32, a32, b32 = (jnp.asarray(x, jnp.float32) for x in (w, a, b))
    if stacked:
        delta = jax.vmap(lambda x, y: jnp.tensordot(x, y, axes=1))(a32, b32)
    else:
        delta = jnp.tensordot(a32, b32, axes=1)
    return (w32 + delta * scale).astype(w.dtype)


def adapter_bytes(params) -> int:
    """Bytes of the adapters in params (what a disjoint sync moves with LoRA on)."""
    adapters, _ = partition(nn.unbox(params), True)
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(adapters)))


# BASE FINGERPRINT: which base a checkpoint's adapters belong to.

# Tensors stored as-is in both layouts (replax path, Hugging Face name): a few rows of the
# embedding and the final norm say which model this is, and are cheap to read.
_FINGERPRINT_ROWS = 16


def _digest(arrays) -> str:
    """SHA-256 of the arrays rounded to bfloat16 (so a float32 and a bfloat16 copy of the
    same checkpoint agree)."""
    h = hashlib.sha256()
    for x in arrays:
        x = np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)
        h.update(str(x.shape).encode())
        h.update(x.tobytes())
    return h.hexdigest()


def fingerprint_of_params(params, source: str) -> dict[str, str]:
    """{'source', 'sha256'} of the base in params (the first embedding rows and the final
    norm scale)."""
    params = nn.unbox(params)
    rows = jax.device_get(params["embedding"][:_FINGERPRINT_ROWS])
    norm = jax.device_get(params["final_norm"]["scale"])
    return {"source": source, "sha256": _digest([rows, norm])}


def fingerprint_of_checkpoint(path: str) -> dict[str, str]:
    """The same fingerprint read from a Hugging Face directory's safetensors (a few rows,
    not the whole tensors)."""
    from replax import hf

    with hf._LazyTensors(path) as source:
        rows = source.slice("model.embed_tokens.weight")[:_FINGERPRINT_ROWS]
        norm = source.slice("model.norm.weight")[:]
    return {"source": os.path.basename(os.path.normpath(path)), "sha256": _digest([rows, norm])}


# PEFT EXPORT


def to_peft(params, config: ModelConfig) -> dict[str, np.ndarray]:
    """The adapters as PEFT names them on a transformers causal LM, float32 host arrays:
    `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` [r, in] and
    `...lora_B.weight` [out, r] (torch Linear layout: [out, in])."""
    from replax import model as model_lib

    params = nn.unbox(params)
    adapters, _ = partition(params, True)
    adapters = jax.device_get(adapters)
    if config.scan_layers:
        adapters = model_lib.unstack_layers(adapters, config.num_layers)
    out = {}
    for i in range(config.num_layers):
        layer = adapters[f"layer_{i}"]
        for name in config.lora_targets:
            group, module = HF_MODULES[name]
            block = layer["attn" if group == "self_attn" else "mlp"]
            a = np.asarray(block[f"{name}_lora_a"], np.float32)  # [*in, r]
            b = np.asarray(block[f"{name}_lora_b"], np.float32)  # [r, *out]
            prefix = f"base_model.model.model.layers.{i}.{group}.{module}"
            out[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a.reshape(-1, a.shape[-1]).T)
            out[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b.reshape(b.shape[0], -1).T)
    return out


def peft_config(config: ModelConfig, base_model: str = "") -> dict[str, Any]:
    """PEFT's adapter_config.json for these adapters (plain LoRA, no dropout or bias)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": config.lora_rank,
        "lora_alpha": config.lora_alpha,
        "target_modules": [HF_MODULES[t][1] for t in config.lora_targets],
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
    }


def save_peft(path: str, params, config: ModelConfig, base_model: str = "") -> list[str]:
    """Writes adapter_config.json and adapter_model.safetensors, which
    `peft.PeftModel.from_pretrained(base, path)` loads. Returns the files written."""
    from safetensors.numpy import save_file

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, PEFT_CONFIG), "w") as f:
        json.dump(peft_config(config, base_model), f, indent=2)
    save_file(to_peft(params, config), os.path.join(path, PEFT_WEIGHTS), metadata={"format": "pt"})
    return [PEFT_CONFIG, PEFT_WEIGHTS]
