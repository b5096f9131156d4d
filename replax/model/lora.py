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

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import traverse_util

from replax.model.config import ModelConfig

SUFFIXES = ("_lora_a", "_lora_b")


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


# PEFT EXPORT
