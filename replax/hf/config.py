"""config.json of Hugging Face Llama / Qwen2 / Qwen3 checkpoints <-> `model.ModelConfig`.

`config_from_hf` (a config.json dict) and `read_config` (a checkpoint directory) give the
ModelConfig, `config_to_hf` the config.json of one, and `generation_config` the
generation_config.json contents for a tokenizer. The weights are `replax.hf.checkpoint`.

RoPE: the frequencies, with the scalings transformers offers for these models ("linear",
"dynamic", "llama3"), are `model.rope_inv_freq`. Both the 4.x (rope_theta +
rope_scaling) and the 5.x (rope_parameters) config forms are read, and both are written.

Anything replax cannot represent (architecture, RoPE type, activation, ...) raises a
one-line ValueError naming it and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from replax.model import transformer as model_lib

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_MODEL_TYPES = {"llama": 0, "qwen2": 1, "qwen3": 2}
# transformers' defaults for a config.json without max_position_embeddings.
_DEFAULT_MAX_LEN = dict(zip(ARCHITECTURES, (2048, 32768, 32768)))
CONFIG_NAME = "config.json"


def _architecture(hf: Mapping[str, Any]) -> str:
    archs = hf.get("architectures")
    if archs:
        if len(archs) != 1 or archs[0] not in ARCHITECTURES:
            raise ValueError(f"architectures={archs}: allowed are one of {list(ARCHITECTURES)}")
        return archs[0]
    model_type = hf.get("model_type")
    if model_type not in _MODEL_TYPES:
        raise ValueError(
            f"model_type={model_type!r} (and no architectures): allowed are "
            f"{sorted(_MODEL_TYPES)} or architectures {list(ARCHITECTURES)}"
        )
    return ARCHITECTURES[_MODEL_TYPES[model_type]]


def _rope(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The ModelConfig RoPE fields from config.json, read as transformers reads them.

    transformers 4.x writes `rope_theta` and `rope_scaling` (null or {"rope_type" or "type",
    "factor", ...}); 5.x writes one `rope_parameters` dict that also holds `rope_theta`.
    Like transformers, a non-empty rope_scaling wins, and a theta inside the dict wins over
    the top-level one.
    """
    field = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    params = hf.get(field) or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"{field}={params!r}: allowed is a dict (or null)")
    if any(isinstance(v, Mapping) for v in params.values()):
        raise ValueError(f"{field} per layer type ({sorted(params)}): allowed is one dict")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in model_lib.ROPE_TYPES:
        raise ValueError(
            f"{field} type {kind!r}: allowed are {list(model_lib.ROPE_TYPES)} (rope_type)"
        )
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise ValueError(f"partial_rotary_factor={factor}: only 1.0 (full-width RoPE) is allowed")
    out: dict[str, Any] = {
        "rope_theta": float(params.get("rope_theta", hf.get("rope_theta", 10_000.0))),
        "rope_type": kind,
    }
    if kind == "default":
        return out
    required = {"linear": ("factor",), "dynamic": ("factor",)}.get(
        kind, ("factor", "low_freq_factor", "high_freq_factor")
    )
    missing = [k for k in required if params.get(k) is None]
    if missing:
        raise ValueError(f"{field} type {kind!r} lacks {missing}: required are {list(required)}")
    out["rope_factor"] = float(params["factor"])
    if kind == "llama3":
        out["rope_low_freq_factor"] = float(params["low_freq_factor"])
        out["rope_high_freq_factor"] = float(params["high_freq_factor"])
        # transformers falls back to max_position_embeddings, as here.
        original = params.get("original_max_position_embeddings")
        out["rope_original_max_len"] = int(original or _max_position_embeddings(hf))
    elif kind == "dynamic":
        out["rope_original_max_len"] = _max_position_embeddings(hf)
    return out


def _max_position_embeddings(hf: Mapping[str, Any]) -> int:
    return int(hf.get("max_position_embeddings") or _DEFAULT_MAX_LEN[_architecture(hf)])


def config_from_hf(hf: Mapping[str, Any], **overrides) -> model_lib.ModelConfig:
    """ModelConfig from a config.json dict of a Llama, Qwen2 or Qwen3 causal LM.

    `overrides` replace ModelConfig fields afterwards (e.g. max_len=2048 for a shorter KV
    cache, param_dtype / dtype; the checkpoint's torch_dtype is not used). Anything replax
    cannot represent raises a one-line ValueError naming the field.
    """
    arch = _architecture(hf)
    for name in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
    ):
        if name not in hf:
            raise ValueError(f"config.json lacks {name}: it is required for {arch}")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r}: only 'silu' (SwiGLU MLP) is allowed")
    if hf.get("mlp_bias", False):
        raise ValueError("mlp_bias=True: only false is allowed (replax's MLP has no biases)")
    if hf.get("attention_bias", False):
        raise ValueError(
            "attention_bias=True: only false is allowed (replax has no o_proj bias; "
            "Qwen2's q/k/v biases are implied by the architecture)"
        )
    if hf.get("use_sliding_window", False):
        raise ValueError("use_sliding_window=True: only false (full attention) is allowed")
    layer_types = hf.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise ValueError(f"layer_types={layer_types}: only 'full_attention' layers are allowed")
    if hf.get("quantization_config"):
        raise ValueError("quantization_config is set: only unquantized checkpoints are allowed")
    rope = _rope(hf)

    heads = int(hf["num_attention_heads"])
    kwargs = dict(
        vocab_size=int(hf["vocab_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        d_model=int(hf["hidden_size"]),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
        mlp_dim=int(hf["intermediate_size"]),
        max_len=_max_position_embeddings(hf),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=arch == "Qwen2ForCausalLM",
        qk_norm=arch == "Qwen3ForCausalLM",
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        **rope,
    )
    fields = {f.name for f in dataclasses.fields(model_lib.ModelConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown ModelConfig override(s) {unknown}: allowed are {sorted(fields)}")
    kwargs.update(overrides)
    return model_lib.ModelConfig(**kwargs)


def config_to_hf(config: model_lib.ModelConfig) -> dict[str, Any]:
    """config.json dict for a ModelConfig: Llama (plain), Qwen2 (qkv_bias) or Qwen3 (qk_norm)."""
    if config.qkv_bias and config.qk_norm:
        raise ValueError(
            "qkv_bias=True with qk_norm=True: no HF architecture has q/k/v biases and q/k "
            "norms without an o_proj bias; allowed is at most one of them"
        )
    if config.qk_norm:
        arch, model_type = "Qwen3ForCausalLM", "qwen3"
    elif config.qkv_bias:
        arch, model_type = "Qwen2ForCausalLM", "qwen2"
    else:
        arch, model_type = "LlamaForCausalLM", "llama"
    max_len = config.max_len
    rope: dict[str, Any] = {"rope_type": config.rope_type, "rope_theta": config.rope_theta}
    if config.rope_type != "default":
        rope["factor"] = config.rope_factor
    if config.rope_type == "llama3":
        rope.update(
            low_freq_factor=config.rope_low_freq_factor,
            high_freq_factor=config.rope_high_freq_factor,
            original_max_position_embeddings=config.rope_original_max_len,
        )
    elif config.rope_type == "dynamic" and config.rope_original_max_len:
        # Dynamic NTK scales relative to max_position_embeddings: keep the model's own.
        max_len = config.rope_original_max_len
    hf = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.mlp_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": max_len,
        "hidden_act": "silu",
        "rms_norm_eps": config.norm_eps,
        # transformers 5.x reads rope_parameters; 4.x reads rope_theta and rope_scaling.
        "rope_parameters": rope,
        "rope_theta": config.rope_theta,
        "rope_scaling": None
        if config.rope_type == "default"
        else {k: v for k, v in rope.items() if k != "rope_theta"},
        "tie_word_embeddings": config.tie_embeddings,
        "attention_dropout": 0.0,
        "dtype": config.param_dtype,
        "torch_dtype": config.param_dtype,
    }
    if model_type == "llama":
        hf.update(attention_bias=False, mlp_bias=False)
    else:
        hf.update(use_sliding_window=False, sliding_window=None)
        if model_type == "qwen3":
            hf["attention_bias"] = False
    return hf


def read_config(path: str, **config_overrides) -> model_lib.ModelConfig:
    """ModelConfig of an HF checkpoint directory's config.json (see `config_from_hf`)."""
    config_path = os.path.join(path, CONFIG_NAME)
    try:
        with open(config_path) as f:
            hf = json.load(f)
    except OSError as e:
        raise ValueError(f"{config_path}: cannot be read ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_path}: not JSON ({e})") from None
    return config_from_hf(hf, **config_overrides)


def generation_config(tokenizer, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """generation_config.json contents: `base` (e.g. the source model's sampling defaults)
    with bos/pad ids and every stop id of `tokenizer` (an int, or a list if several)."""
    out = dict(base or {})
    stop_ids = [int(i) for i in getattr(tokenizer, "stop_ids", (tokenizer.eos_id,))]
    out["eos_token_id"] = stop_ids[0] if len(stop_ids) == 1 else stop_ids
    out["pad_token_id"] = int(tokenizer.pad_id)
    if tokenizer.bos_id is not None:
        out["bos_token_id"] = int(tokenizer.bos_id)
    return out
