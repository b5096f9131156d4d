"""A LoRA run's adapters as a PEFT adapter (what peft's `PeftModel.from_pretrained` loads
onto the transformers base), and the fingerprint of a Hugging Face base."""

from __future__ import annotations

import json
import os
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from replax.model import lora
from replax.model.config import ModelConfig

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


def fingerprint_of_checkpoint(path: str) -> dict[str, str]:
    """The same fingerprint read from a Hugging Face directory's safetensors (a few rows,
    not the whole tensors)."""
    from replax.hf import checkpoint as hf

    with hf._LazyTensors(path) as source:
        rows = source.slice("model.embed_tokens.weight")[: lora._FINGERPRINT_ROWS]
        norm = source.slice("model.norm.weight")[:]
    return {
        "source": os.path.basename(os.path.normpath(path)),
        "sha256": lora._digest([rows, norm]),
    }


def to_peft(params, config: ModelConfig) -> dict[str, np.ndarray]:
    """The adapters as PEFT names them on a transformers causal LM, float32 host arrays:
    `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` [r, in] and
    `...lora_B.weight` [out, r] (torch Linear layout: [out, in])."""
    from replax.model import transformer as model_lib

    params = nn.unbox(params)
    adapters, _ = lora.partition(params, True)
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
    from replax.hf import checkpoint as hf

    os.makedirs(path, exist_ok=True)
    config_file = os.path.join(path, PEFT_CONFIG)
    with open(config_file, "w") as f:
        json.dump(peft_config(config, base_model), f, indent=2)
    hf.save_safetensors(to_peft(params, config), os.path.join(path, PEFT_WEIGHTS), like=config_file)
    return [PEFT_CONFIG, PEFT_WEIGHTS]
