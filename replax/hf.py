"""Hugging Face checkpoints of the Llama / Qwen2 / Qwen3 family in and out of replax.

`load_pretrained(dir)` reads config.json and model.safetensors (or the shards listed in
model.safetensors.index.json) into a `model.ModelConfig` and the params of
`model.Transformer(config)`; `save_pretrained` writes them back in the HF layout. Only
safetensors.numpy and numpy are needed (no torch, no transformers).

Layout. HF nn.Linear weights are [out, in]; replax contracts x [..., in] with w [in, out]
and keeps heads as separate axes:
  self_attn.{q,k,v}_proj.weight [H*D, E]  <->  attn/{q,k,v} [E, H, D]  (transpose, split)
  self_attn.o_proj.weight       [E, H*D]  <->  attn/o [H, D, E]
  self_attn.{q,k,v}_proj.bias   [H*D]     <->  attn/{q,k,v}_bias [H, D]      (Qwen2)
  self_attn.{q,k}_norm.weight   [D]       <->  attn/{q,k}_norm/scale         (Qwen3)
  mlp.{gate,up}_proj.weight     [M, E]    <->  mlp/{gate,up} [E, M]
  mlp.down_proj.weight          [E, M]    <->  mlp/down [M, E]
  input_layernorm / post_attention_layernorm / model.norm  <->  attn_norm / mlp_norm /
  final_norm scale;  embed_tokens [V, E] = embedding;  lm_head.weight [V, E] <-> lm_head
  [E, V] (only when the embeddings are untied).
RoPE: both use the rotate-half form (dimension i pairs with i + D/2) with inv_freq =
theta^(-2i/D), so q/k weights are copied without any permutation. RMSNorm: both compute
x * rsqrt(mean(x^2) + eps) * weight (no 1 + weight), one eps for every norm.

Params are returned as the plain (unboxed) 'params' tree of host numpy arrays: pass them
to `train_step.init_train_state(..., params=...)`, which places them on the mesh, or use
`shard_params` to place them for sampling / evaluation.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from replax import model as model_lib
from replax import sharding

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_MODEL_TYPES = {"llama": 0, "qwen2": 1, "qwen3": 2}
# transformers' defaults for a config.json without max_position_embeddings.
_DEFAULT_MAX_LEN = dict(zip(ARCHITECTURES, (2048, 32768, 32768)))
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
# Buffers older Llama checkpoints stored; recomputed by the model, hence skipped.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# ---------------------------------------------------------------------------------------
# Config.


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


def _rope(hf: Mapping[str, Any]) -> float:
    """rope_theta, after checking the RoPE is the plain (unscaled, full-width) one."""
    # transformers >= 5 folds theta and the scaling into `rope_parameters`.
    params = hf.get("rope_parameters") or {}
    for name, value in (("rope_scaling", hf.get("rope_scaling")), ("rope_parameters", params)):
        if value is None:
            continue
        kind = value.get("rope_type", value.get("type", "default"))
        if kind != "default":
            raise ValueError(
                f"{name}={value}: replax supports only unscaled RoPE "
                "(rope_scaling null or rope_type 'default')"
            )
    factor = hf.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise ValueError(f"partial_rotary_factor={factor}: only 1.0 (full-width RoPE) is allowed")
    return float(hf.get("rope_theta", params.get("rope_theta", 10_000.0)))


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
    rope_theta = _rope(hf)

    heads = int(hf["num_attention_heads"])
    kwargs = dict(
        vocab_size=int(hf["vocab_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        d_model=int(hf["hidden_size"]),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
        mlp_dim=int(hf["intermediate_size"]),
        max_len=int(hf.get("max_position_embeddings", _DEFAULT_MAX_LEN[arch])),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=arch == "Qwen2ForCausalLM",
        qk_norm=arch == "Qwen3ForCausalLM",
        rope_theta=rope_theta,
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
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
        "max_position_embeddings": config.max_len,
        "hidden_act": "silu",
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": config.tie_embeddings,
        "attention_dropout": 0.0,
        "torch_dtype": config.param_dtype,
    }
    if model_type == "llama":
        hf.update(attention_bias=False, mlp_bias=False)
    else:
        hf.update(use_sliding_window=False, sliding_window=None)
        if model_type == "qwen3":
            hf["attention_bias"] = False
    return hf


# ---------------------------------------------------------------------------------------
# Parameters.


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One HF tensor and the replax parameter it maps to.

    kind: 'copy' (same shape), 'reshape' (flat HF bias <-> [heads, head_dim]) or 'linear'
    (HF [out, in] <-> replax [*in, *out] with `n_in` input axes).
    """

    hf_name: str
    path: tuple[str, ...]
    shape: tuple[int, ...]  # replax shape
    kind: str
    n_in: int = 1

    @property
    def hf_shape(self) -> tuple[int, ...]:
        if self.kind == "copy":
            return self.shape
        if self.kind == "reshape":
            return (math.prod(self.shape),)
        return (math.prod(self.shape[self.n_in :]), math.prod(self.shape[: self.n_in]))

    def from_hf(self, x: np.ndarray) -> np.ndarray:
        if self.kind == "linear":
            x = x.T
        return x.reshape(self.shape)

    def to_hf(self, x: np.ndarray) -> np.ndarray:
        if self.kind == "linear":
            return x.reshape(math.prod(self.shape[: self.n_in]), -1).T
        return x.reshape(self.hf_shape)


def _layout(config: model_lib.ModelConfig) -> list[_Entry]:
    """Every parameter of `model.Transformer(config)` with its HF name, in HF file order."""
    e, h, kv, d, m, v = (
        config.d_model,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.mlp_dim,
        config.vocab_size,
    )
    out = [_Entry("model.embed_tokens.weight", ("embedding",), (v, e), "copy")]
    for i in range(config.num_layers):
        hf, rp = f"model.layers.{i}.", (f"layer_{i}",)
        attn, mlp = hf + "self_attn.", hf + "mlp."
        ra, rm = rp + ("attn",), rp + ("mlp",)
        out.append(_Entry(hf + "input_layernorm.weight", rp + ("attn_norm", "scale"), (e,), "copy"))
        for name, heads in (("q", h), ("k", kv), ("v", kv)):
            out.append(_Entry(f"{attn}{name}_proj.weight", ra + (name,), (e, heads, d), "linear"))
            if config.qkv_bias:
                out.append(
                    _Entry(f"{attn}{name}_proj.bias", ra + (f"{name}_bias",), (heads, d), "reshape")
                )
        if config.qk_norm:
            for name in ("q", "k"):
                out.append(
                    _Entry(
                        f"{attn}{name}_norm.weight", ra + (f"{name}_norm", "scale"), (d,), "copy"
                    )
                )
        out.append(_Entry(attn + "o_proj.weight", ra + ("o",), (h, d, e), "linear", n_in=2))
        out.append(
            _Entry(hf + "post_attention_layernorm.weight", rp + ("mlp_norm", "scale"), (e,), "copy")
        )
        out.append(_Entry(mlp + "gate_proj.weight", rm + ("gate",), (e, m), "linear"))
        out.append(_Entry(mlp + "up_proj.weight", rm + ("up",), (e, m), "linear"))
        out.append(_Entry(mlp + "down_proj.weight", rm + ("down",), (m, e), "linear"))
    out.append(_Entry("model.norm.weight", ("final_norm", "scale"), (e,), "copy"))
    if not config.tie_embeddings:
        out.append(_Entry("lm_head.weight", ("lm_head",), (e, v), "linear"))
    return out


def _np_dtype(dtype, config: model_lib.ModelConfig) -> np.dtype:
    if dtype is None:
        return np.dtype(config.jnp_param_dtype)
    if isinstance(dtype, str):
        if dtype not in model_lib.DTYPES:
            raise ValueError(f"dtype={dtype!r}: allowed are {sorted(model_lib.DTYPES)}")
        return np.dtype(model_lib.DTYPES[dtype])
    return np.dtype(dtype)


def _listed(names: list[str], limit: int = 4) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def params_from_hf(
    tensors: Mapping[str, np.ndarray], config: model_lib.ModelConfig, dtype=None
) -> dict[str, Any]:
    """The plain 'params' tree of `model.Transformer(config)` from HF-named tensors.

    Arrays are host numpy arrays cast to `dtype` (default config.param_dtype). Raises a
    ValueError naming any missing, unexpected or mis-shaped tensor.
    """
    target = _np_dtype(dtype, config)
    layout = _layout(config)
    expected = {entry.hf_name for entry in layout}
    names = [n for n in tensors if not n.endswith(_IGNORED_SUFFIXES)]
    extra = sorted(set(names) - expected)
    if config.tie_embeddings and "lm_head.weight" in extra:
        # Some tied checkpoints store the head too; accept it when it is the embedding.
        head, emb = tensors["lm_head.weight"], tensors.get("model.embed_tokens.weight")
        if emb is not None and np.array_equal(np.asarray(head), np.asarray(emb)):
            extra.remove("lm_head.weight")
    if extra:
        raise ValueError(
            f"unexpected tensor(s) {_listed(extra)} for this config ({len(expected)} expected; "
            f"qkv_bias={config.qkv_bias}, qk_norm={config.qk_norm}, "
            f"tie_embeddings={config.tie_embeddings})"
        )
    missing = [e for e in layout if e.hf_name not in tensors]
    if missing:
        listed = [f"{e.hf_name} (expected shape {list(e.hf_shape)})" for e in missing]
        raise ValueError(f"missing tensor(s): {_listed(listed)}")
    params: dict[str, Any] = {}
    for entry in layout:
        x = tensors[entry.hf_name]
        if tuple(x.shape) != entry.hf_shape:
            raise ValueError(
                f"tensor {entry.hf_name} has shape {list(x.shape)}, expected "
                f"{list(entry.hf_shape)} from the config"
            )
        node = params
        for key in entry.path[:-1]:
            node = node.setdefault(key, {})
        node[entry.path[-1]] = np.ascontiguousarray(entry.from_hf(np.asarray(x)), dtype=target)
    return params


def _path_str(path) -> str:
    return "/".join(str(getattr(k, "key", k)) for k in path)


def params_to_hf(params, config: model_lib.ModelConfig) -> dict[str, np.ndarray]:
    """HF-named host numpy tensors (in the params' dtype) from replax params (boxed or not).

    lm_head.weight is written only when the embeddings are untied.
    """
    params = nn.unbox(params)
    if isinstance(params, Mapping) and set(params) == {"params"}:
        params = params["params"]
    leaves = {_path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
    layout = _layout(config)
    extra = sorted(set(leaves) - {"/".join(e.path) for e in layout})
    if extra:
        raise ValueError(f"params have leaves {_listed(extra)} that this config does not define")
    out = {}
    for entry in layout:
        key = "/".join(entry.path)
        if key not in leaves:
            raise ValueError(f"params lack {key} (expected shape {list(entry.shape)})")
        x = np.asarray(jax.device_get(leaves[key]))
        if tuple(x.shape) != entry.shape:
            raise ValueError(f"param {key} has shape {list(x.shape)}, expected {list(entry.shape)}")
        out[entry.hf_name] = np.ascontiguousarray(entry.to_hf(x))
    return out


def shard_params(params, config: model_lib.ModelConfig, mesh, rules=sharding.DEFAULT_RULES):
    """Places plain params on the mesh with the shardings their logical axes get under
    `rules` (as `train_step.init_train_state` does for the train state)."""
    dummy = jnp.zeros((1, 1), jnp.int32)
    abstract = jax.eval_shape(
        lambda: model_lib.Transformer(config).init(jax.random.key(0), dummy, dummy)
    )["params"]
    return jax.device_put(params, sharding.params_shardings(mesh, abstract, rules))


# ---------------------------------------------------------------------------------------
# Files.


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    try:
        return load_file(path)
    except (KeyError, TypeError):  # safetensors without numpy bfloat16: read it directly.
        return _read_safetensors_raw(path)


def _read_safetensors_raw(path: str) -> dict[str, np.ndarray]:
    """A safetensors file read with numpy alone (BF16 through ml_dtypes)."""
    import ml_dtypes

    types = {
        "F64": np.float64,
        "F32": np.float32,
        "F16": np.float16,
        "BF16": ml_dtypes.bfloat16,
        "I64": np.int64,
        "I32": np.int32,
        "I16": np.int16,
        "I8": np.int8,
        "U8": np.uint8,
        "BOOL": np.bool_,
    }
    with open(path, "rb") as f:
        (header_len,) = np.frombuffer(f.read(8), dtype="<u8")
        header = json.loads(f.read(int(header_len)))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in types:
            raise ValueError(f"tensor {name}: dtype {info['dtype']} not supported")
        start, end = info["data_offsets"]
        dtype = np.dtype(types[info["dtype"]]).newbyteorder("<")
        out[name] = np.frombuffer(data[start:end], dtype=dtype).reshape(info["shape"])
    return out


def load_pretrained(path: str, **config_overrides):
    """(config, params) from an HF checkpoint directory: config.json plus model.safetensors,
    or the shards named by model.safetensors.index.json. `config_overrides` go to
    `config_from_hf`; params are host numpy arrays in config.param_dtype."""
    with open(os.path.join(path, CONFIG_NAME)) as f:
        config = config_from_hf(json.load(f), **config_overrides)
    index_path = os.path.join(path, INDEX_NAME)
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    elif os.path.exists(os.path.join(path, WEIGHTS_NAME)):
        files = [WEIGHTS_NAME]
    else:
        raise FileNotFoundError(f"{path}: neither {WEIGHTS_NAME} nor {INDEX_NAME} found")
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        for key, value in _read_safetensors(os.path.join(path, name)).items():
            if key in tensors:
                raise ValueError(f"tensor {key} appears in more than one shard ({name})")
            tensors[key] = value
    return config, params_from_hf(tensors, config)


def save_pretrained(
    path: str, config: model_lib.ModelConfig, params, max_shard_bytes: int | None = None
) -> list[str]:
    """Writes config.json and the weights (in the params' dtype) in the HF layout.

    With max_shard_bytes, tensors are packed in order into model-0000i-of-0000n.safetensors
    files of at most that size (a larger tensor gets a file of its own) plus
    model.safetensors.index.json; otherwise (or if everything fits) one model.safetensors.
    Stale weight files of an earlier save in `path` are removed. Returns the files written.
    """
    from safetensors.numpy import save_file

    hf_config = config_to_hf(config)
    tensors = params_to_hf(params, config)
    if tensors:
        hf_config["torch_dtype"] = str(next(iter(tensors.values())).dtype)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, x in tensors.items():
        if max_shard_bytes is not None and shards[-1] and size + x.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = x
        size += x.nbytes
    if len(shards) == 1:
        names = [WEIGHTS_NAME]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]

    os.makedirs(path, exist_ok=True)
    for stale in os.listdir(path):
        if (stale in (WEIGHTS_NAME, INDEX_NAME) or _SHARD_RE.match(stale)) and stale not in names:
            os.remove(os.path.join(path, stale))
    with open(os.path.join(path, CONFIG_NAME), "w") as f:
        json.dump(hf_config, f, indent=2)
    for name, shard in zip(names, shards):
        save_file(shard, os.path.join(path, name), metadata={"format": "pt"})
    written = [CONFIG_NAME, *names]
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(x.nbytes for x in tensors.values())},
            "weight_map": {k: name for name, shard in zip(names, shards) for k in shard},
        }
        with open(os.path.join(path, INDEX_NAME), "w") as f:
            json.dump(index, f, indent=2)
        written.append(INDEX_NAME)
    return written
