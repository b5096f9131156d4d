"""Hugging Face checkpoints of the Llama / Qwen2 / Qwen3 family in and out of replax.

`load_pretrained(dir)` reads config.json and model.safetensors (or the shards listed in
model.safetensors.index.json) into a `model.ModelConfig` and host numpy params of
`model.Transformer(config)`; `load_pretrained_sharded(dir, mesh, rules)` places each
parameter straight into its NamedSharding, reading only each device's block from the
files; `save_pretrained` writes them back in the HF layout, with the tokenizer files and a
generation_config.json when given a tokenizer directory. Only safetensors, numpy and
ml_dtypes are needed (no torch, no transformers).

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
RoPE: both use the rotate-half form (dimension i pairs with i + D/2), so q/k weights are
copied without any permutation; the frequencies, with the scalings transformers offers
for these models ("linear", "dynamic", "llama3"), are `model.rope_inv_freq`. Both the
4.x (rope_theta + rope_scaling) and the 5.x (rope_parameters) config forms are read, and
both are written. RMSNorm: both compute x * rsqrt(mean(x^2) + eps) * weight (no
1 + weight), one eps for every norm.

Anything replax cannot represent (architecture, RoPE type, activation, a missing or
mis-shaped tensor) raises a one-line ValueError naming it and what is allowed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
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


def _check_tensors(
    shapes: Mapping[str, tuple[int, ...]], config: model_lib.ModelConfig, head_is_embedding
) -> list[_Entry]:
    """The layout after checking the checkpoint's tensor names and shapes against it.

    `head_is_embedding()` says whether a stored lm_head.weight equals the embedding (some
    tied checkpoints store the head too; it is then accepted and ignored).
    """
    layout = _layout(config)
    expected = {entry.hf_name for entry in layout}
    names = [n for n in shapes if not n.endswith(_IGNORED_SUFFIXES)]
    extra = sorted(set(names) - expected)
    if (
        config.tie_embeddings
        and "lm_head.weight" in extra
        and "model.embed_tokens.weight" in shapes
        and shapes["lm_head.weight"] == shapes["model.embed_tokens.weight"]
        and head_is_embedding()
    ):
        extra.remove("lm_head.weight")
    if extra:
        raise ValueError(
            f"unexpected tensor(s) {_listed(extra)} for this config ({len(expected)} expected; "
            f"qkv_bias={config.qkv_bias}, qk_norm={config.qk_norm}, "
            f"tie_embeddings={config.tie_embeddings})"
        )
    missing = [e for e in layout if e.hf_name not in shapes]
    if missing:
        listed = [f"{e.hf_name} (expected shape {list(e.hf_shape)})" for e in missing]
        raise ValueError(f"missing tensor(s): {_listed(listed)}")
    for entry in layout:
        shape = tuple(shapes[entry.hf_name])
        if shape != entry.hf_shape:
            raise ValueError(
                f"tensor {entry.hf_name} has shape {list(shape)}, expected "
                f"{list(entry.hf_shape)} from the config"
            )
    return layout


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def params_from_hf(
    tensors: Mapping[str, np.ndarray], config: model_lib.ModelConfig, dtype=None
) -> dict[str, Any]:
    """The plain 'params' tree of `model.Transformer(config)` from HF-named tensors.

    Arrays are host numpy arrays cast to `dtype` (default config.param_dtype). Raises a
    ValueError naming any missing, unexpected or mis-shaped tensor.
    """
    target = _np_dtype(dtype, config)

    def head_is_embedding():
        head, emb = tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]
        return np.array_equal(np.asarray(head), np.asarray(emb))

    shapes = {name: tuple(np.shape(x)) for name, x in tensors.items()}
    params: dict[str, Any] = {}
    for entry in _check_tensors(shapes, config, head_is_embedding):
        x = entry.from_hf(np.asarray(tensors[entry.hf_name]))
        _set(params, entry.path, np.ascontiguousarray(x, dtype=target))
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
        return {k: np.array(v) for k, v in _read_safetensors_raw(path).items()}


_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def _read_safetensors_raw(path: str) -> dict[str, np.ndarray]:
    """A safetensors file as read-only numpy memory maps (BF16 through ml_dtypes): nothing
    is read until a tensor, or a slice of one, is."""
    import ml_dtypes

    with open(path, "rb") as f:
        (header_len,) = np.frombuffer(f.read(8), dtype="<u8")
        header = json.loads(f.read(int(header_len)))
    data_start = 8 + int(header_len)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(
                f"{path}: tensor {name} has dtype {info['dtype']}: allowed are "
                f"{sorted(_SAFETENSORS_DTYPES)}"
            )
        name_of = _SAFETENSORS_DTYPES[info["dtype"]]
        dtype = np.dtype(ml_dtypes.bfloat16 if name_of == "bfloat16" else name_of)
        start, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end == start:
            out[name] = np.zeros(shape, dtype.newbyteorder("<"))
            continue
        out[name] = np.memmap(
            path, dtype=dtype.newbyteorder("<"), mode="r", offset=data_start + start, shape=shape
        )
    return out


def _weight_map(path: str) -> dict[str, str]:
    """Tensor name -> safetensors file name of a checkpoint directory."""
    index_path = os.path.join(path, INDEX_NAME)
    if os.path.exists(index_path):
        with open(index_path) as f:
            return dict(json.load(f)["weight_map"])
    if os.path.exists(os.path.join(path, WEIGHTS_NAME)):
        return {}  # one file: its names are read from its header
    raise ValueError(f"{path}: neither {WEIGHTS_NAME} nor {INDEX_NAME} found")


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


def load_pretrained(path: str, **config_overrides):
    """(config, params) from an HF checkpoint directory: config.json plus model.safetensors,
    or the shards named by model.safetensors.index.json. `config_overrides` go to
    `config_from_hf`; params are host numpy arrays in config.param_dtype. For params placed
    on a mesh without a host copy of the whole model, see `load_pretrained_sharded`."""
    config = read_config(path, **config_overrides)
    weight_map = _weight_map(path)
    files = sorted(set(weight_map.values())) or [WEIGHTS_NAME]
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        for key, value in _read_safetensors(os.path.join(path, name)).items():
            if key in tensors:
                raise ValueError(f"tensor {key} appears in more than one shard ({name})")
            tensors[key] = value
    return config, params_from_hf(tensors, config)


class _LazyTensors:
    """The tensors of a checkpoint directory, opened with safetensors.safe_open (numpy) so
    that a slice reads only its bytes; numpy memory maps where safe_open cannot (an older
    safetensors without bfloat16). Use as a context manager."""

    def __init__(self, path: str):
        self.path = path
        self._weight_map = _weight_map(path)
        self._stack = contextlib.ExitStack()
        self._files: dict[str, Any] = {}

    def __enter__(self):
        from safetensors import safe_open

        files = sorted(set(self._weight_map.values())) or [WEIGHTS_NAME]
        self.names: dict[str, str] = {}
        for file in files:
            full = os.path.join(self.path, file)
            if not os.path.isfile(full):
                raise ValueError(f"{full}: not found (named by {INDEX_NAME})")
            try:
                handle = self._stack.enter_context(safe_open(full, framework="numpy"))
                keys = list(handle.keys())
                # One empty read per dtype in the file: can this safetensors give numpy it?
                probes = {handle.get_slice(k).get_dtype(): k for k in keys}
                for key in probes.values():
                    if len(handle.get_slice(key).get_shape()):
                        handle.get_slice(key)[(slice(0, 0),)]
            except (AttributeError, KeyError, TypeError, ValueError):
                handle = _read_safetensors_raw(full)
                keys = list(handle)
            except Exception as e:  # noqa: BLE001 - safetensors' own error for a bad file
                raise ValueError(f"{full}: not a readable safetensors file ({e})") from None
            self._files[file] = handle
            for key in keys:
                if key in self.names:
                    raise ValueError(f"tensor {key} appears in more than one shard ({file})")
                self.names[key] = file
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def slice(self, name: str):
        """An object with numpy slicing that reads only the selected block."""
        handle = self._files[self.names[name]]
        return handle[name] if isinstance(handle, dict) else handle.get_slice(name)

    def shape(self, name: str) -> tuple[int, ...]:
        view = self.slice(name)
        return tuple(view.shape) if hasattr(view, "shape") else tuple(view.get_shape())


def _flat_index(shape: tuple[int, ...], index: tuple[slice, ...]) -> np.ndarray:
    """Row-major flat positions, in order, of the block `index` of an array of `shape`
    (shapes here are one side of a matrix: at most vocab or heads x head_dim long)."""
    return np.arange(math.prod(shape)).reshape(shape)[index].ravel()


def _read_block(view, entry: _Entry, index: tuple[slice, ...]) -> np.ndarray:
    """Block `index` of replax parameter `entry`, reading from the HF tensor `view` only the
    rows and columns that hold it (a contiguous range, so one read per device shard)."""
    index = tuple(slice(*s.indices(n)) for s, n in zip(index, entry.shape))
    block_shape = tuple(len(range(*s.indices(n))) for s, n in zip(index, entry.shape))
    if 0 in block_shape:
        return np.zeros(block_shape, np.float32)
    if entry.kind == "copy":
        return np.asarray(view[index])

    def gather(flat: np.ndarray):  # a contiguous read, then the block's own positions
        lo, hi = int(flat[0]), int(flat[-1]) + 1
        return slice(lo, hi), (slice(None) if hi - lo == flat.size else flat - lo)

    if entry.kind == "reshape":
        read, pick = gather(_flat_index(entry.shape, index))
        return np.asarray(view[(read,)])[pick].reshape(block_shape)
    n = entry.n_in
    rows, row_pick = gather(_flat_index(entry.shape[n:], index[n:]))  # HF [out, in]
    cols, col_pick = gather(_flat_index(entry.shape[:n], index[:n]))
    block = np.asarray(view[(rows, cols)])[row_pick][:, col_pick]  # [out block, in block]
    return block.T.reshape(block_shape)


def load_pretrained_sharded(
    path: str, mesh, rules=sharding.DEFAULT_RULES, **config_overrides
) -> tuple[model_lib.ModelConfig, dict[str, Any]]:
    """(config, params) with every parameter a jax.Array already in the NamedSharding its
    logical axes get under `rules` on `mesh` (what `shard_params` gives for the same mesh).

    Each parameter is built with jax.make_array_from_callback: for each of this process's
    devices, only that device's block is read from the safetensors file (safe_open slices),
    transposed to replax's layout and cast to config.param_dtype. Blocks that several
    devices share are read once. The host never holds more than one parameter's worth of
    blocks, so a model larger than host memory loads as long as each device's part fits.
    Names and shapes are checked from the file headers before anything is read.
    """
    import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy

    config = read_config(path, **config_overrides)
    target = _np_dtype(None, config)
    rules = sharding.validate_rules(rules)
    dummy = jnp.zeros((1, 1), jnp.int32)
    abstract = jax.eval_shape(
        lambda: model_lib.Transformer(config).init(jax.random.key(0), dummy, dummy)
    )
    shardings = sharding.params_shardings(mesh, abstract, rules)["params"]
    params: dict[str, Any] = {}
    with _LazyTensors(path) as source:

        def head_is_embedding(rows: int = 4096) -> bool:
            head, emb = source.slice("lm_head.weight"), source.slice("model.embed_tokens.weight")
            total = source.shape("lm_head.weight")[0]
            return all(
                np.array_equal(head[i : i + rows], emb[i : i + rows]) for i in range(0, total, rows)
            )

        shapes = {name: source.shape(name) for name in source.names}
        for entry in _check_tensors(shapes, config, head_is_embedding):
            view, blocks = source.slice(entry.hf_name), {}
            place = shardings
            for key in entry.path:
                place = place[key]

            def block(index, entry=entry, view=view, blocks=blocks):
                key = tuple(s.indices(n) for s, n in zip(index, entry.shape))
                if key not in blocks:
                    blocks[key] = np.ascontiguousarray(
                        _read_block(view, entry, index), dtype=target
                    )
                return blocks[key]

            _set(params, entry.path, jax.make_array_from_callback(entry.shape, place, block))
    return config, params


# Files a tokenizer directory may hold that transformers' AutoTokenizer reads.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
GENERATION_CONFIG_NAME = "generation_config.json"


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


def save_pretrained(
    path: str,
    config: model_lib.ModelConfig,
    params,
    max_shard_bytes: int | None = None,
    *,
    tokenizer_dir: str | None = None,
    generation: Mapping[str, Any] | None = None,
) -> list[str]:
    """Writes config.json and the weights (in the params' dtype) in the HF layout, and with
    `tokenizer_dir` the tokenizer too, so that transformers' AutoModelForCausalLM and
    AutoTokenizer load the directory.

    With max_shard_bytes, tensors are packed in order into model-0000i-of-0000n.safetensors
    files of at most that size (a larger tensor gets a file of its own) plus
    model.safetensors.index.json; otherwise (or if everything fits) one model.safetensors.
    Stale weight files of an earlier save in `path` are removed.
    tokenizer_dir: its TOKENIZER_FILES that exist are copied, and generation_config.json is
    written: the directory's own, if any, with the bos / pad / stop ids of
    `tokenizer.HFTokenizer(tokenizer_dir)`. `generation` entries are written over it.
    Returns the files written.
    """
    from safetensors.numpy import save_file

    hf_config = config_to_hf(config)
    tensors = params_to_hf(params, config)
    if tensors:
        dtype = str(next(iter(tensors.values())).dtype)
        hf_config["dtype"] = hf_config["torch_dtype"] = dtype
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

    gen = None
    if tokenizer_dir is not None:
        from replax import tokenizer as tokenizer_lib

        tok = tokenizer_lib.HFTokenizer(tokenizer_dir)
        for name in TOKENIZER_FILES:
            source = os.path.join(tokenizer_dir, name)
            if os.path.isfile(source) and os.path.abspath(source) != os.path.abspath(
                os.path.join(path, name)
            ):
                shutil.copyfile(source, os.path.join(path, name))
                written.append(name)
        gen = generation_config(tok, tok.generation_config)
    if generation:
        gen = {**(gen or {}), **generation}
    if gen is not None:
        with open(os.path.join(path, GENERATION_CONFIG_NAME), "w") as f:
            json.dump(gen, f, indent=2)
        written.append(GENERATION_CONFIG_NAME)
    return written
