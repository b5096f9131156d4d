"""The tensor layout of Hugging Face Llama / Qwen2 / Qwen3 checkpoints <-> replax params.

`params_from_hf` gives the params tree of `model.Transformer(config)` from HF-named
tensors, `params_to_hf` the HF-named tensors of a params tree; `check_tensors` checks a
checkpoint's names and shapes against a config and `read_block` reads one device's block
of a parameter from an HF tensor (`Param.read_block` of a parameter stacked over layers).
Files are `replax.hf.checkpoint`, config.json `replax.hf.config`.

With config.scan_layers the per-layer tensors below are stacked on a leading
[num_layers] axis under `layers/...` (model.stack_layers) instead of `layer_i/...`.

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
copied without any permutation. RMSNorm: both compute x * rsqrt(mean(x^2) + eps) *
weight (no 1 + weight), so norm weights are copied as they are.

A missing, unexpected or mis-shaped tensor raises a one-line ValueError naming it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from replax.model import transformer as model_lib

# Buffers older Llama checkpoints stored; recomputed by the model, hence skipped.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


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


@dataclasses.dataclass(frozen=True)
class Param:
    """One replax parameter and the HF tensors it is read from: one entry, or with
    scan_layers one per layer for a parameter stacked on a leading [num_layers] axis."""

    path: tuple[str, ...]
    shape: tuple[int, ...]
    entries: tuple[_Entry, ...]
    stacked: bool

    def read_block(self, views, index: tuple[slice, ...]) -> np.ndarray:
        """Block `index` of the parameter; views: the HF tensors of `entries`, in order.
        A stacked parameter reads only the layers in index[0], each its own block."""
        if not self.stacked:
            return read_block(views[0], self.entries[0], index)
        layers = range(*index[0].indices(self.shape[0]))  # a device's slice: never empty
        return np.stack([read_block(views[i], self.entries[i], index[1:]) for i in layers])


def params_of(layout: list[_Entry], config: model_lib.ModelConfig) -> list[Param]:
    """The parameters of `model.Transformer(config)`, grouping the per-layer entries of
    `layout` (`check_tensors`) into stacked `layers/...` parameters under scan_layers."""
    if not config.scan_layers:
        return [Param(e.path, e.shape, (e,), False) for e in layout]
    out, by_path = [], {}
    for entry in layout:
        if not entry.path[0].startswith("layer_"):
            out.append(Param(entry.path, entry.shape, (entry,), False))
            continue
        by_path.setdefault(("layers", *entry.path[1:]), []).append(entry)
    for path, entries in by_path.items():
        entries.sort(key=lambda e: int(e.path[0].removeprefix("layer_")))
        out.append(Param(path, (len(entries), *entries[0].shape), tuple(entries), True))
    return out


def np_dtype(dtype, config: model_lib.ModelConfig) -> np.dtype:
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


def check_tensors(
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


def set_path(tree: dict, path: tuple[str, ...], value) -> None:
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
    target = np_dtype(dtype, config)

    def head_is_embedding():
        head, emb = tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]
        return np.array_equal(np.asarray(head), np.asarray(emb))

    shapes = {name: tuple(np.shape(x)) for name, x in tensors.items()}
    params: dict[str, Any] = {}
    for entry in check_tensors(shapes, config, head_is_embedding):
        x = entry.from_hf(np.asarray(tensors[entry.hf_name]))
        set_path(params, entry.path, np.ascontiguousarray(x, dtype=target))
    if config.scan_layers:
        params = model_lib.stack_layers(params, config.num_layers)
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
    if config.scan_layers:
        if not isinstance(params, Mapping) or "layers" not in params:
            raise ValueError("model.scan_layers=True but the params have no 'layers' entry")
        params = {**params, "layers": jax.device_get(params["layers"])}
        params = model_lib.unstack_layers(params, config.num_layers)
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


def _flat_index(shape: tuple[int, ...], index: tuple[slice, ...]) -> np.ndarray:
    """Row-major flat positions, in order, of the block `index` of an array of `shape`
    (shapes here are one side of a matrix: at most vocab or heads x head_dim long)."""
    return np.arange(math.prod(shape)).reshape(shape)[index].ravel()


def read_block(view, entry: _Entry, index: tuple[slice, ...]) -> np.ndarray:
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
