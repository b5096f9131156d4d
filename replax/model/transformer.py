"""Decoder-only transformer of the Llama / Qwen2 / Qwen3 family, in Flax linen.

One module serves learning and sampling:
  * `Transformer.__call__(tokens, positions, mask)` is the full-sequence forward used by
    the train step (causal attention restricted to valid, i.e. non-padding, keys);
  * `Transformer.__call__(tokens, positions, cache=..., cache_index=..., kv_mask=...)`
    is the step forward used by the sampler: it writes the new keys and values into
    the KV cache at `cache_index` and attends to every valid cache slot up to its own.

Parameters and the main activations carry logical axis names (batch, length, embed,
heads, kv_heads, head_dim, mlp, vocab; layers for scanned params) that a rule table maps
to mesh axes (`replax.core.sharding`): sharding is configuration, not code.

Layers are unrolled (`layer_0`, `layer_1`, ...) or, with `scan_layers`, one `nn.scan` over a
Block whose params (`layers/...`) carry a leading [num_layers] axis (`stack_layers` and
`unstack_layers` convert). `remat_policy` recomputes each Block's activations in the
backward pass; `attention` picks the kernel (`replax.model.attention`).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from replax.model import attention
from replax.model import layers as layers_lib

# Re-exported: replax.model.transformer stays the one import for the model, its config and RoPE.
from replax.model.attention import check_attention_backend as check_attention_backend
from replax.model.attention import rope_inv_freq as rope_inv_freq
from replax.model.attention import rotary as rotary
from replax.model.config import DTYPES as DTYPES
from replax.model.config import LORA_TARGETS as LORA_TARGETS
from replax.model.config import REMAT_POLICIES as REMAT_POLICIES
from replax.model.config import ROPE_TYPES as ROPE_TYPES
from replax.model.config import ModelConfig as ModelConfig


class Attention(nn.Module):
    """Grouped-query attention with optional q/k/v bias, q/k norm and a KV cache."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x, positions, attn_mask, layer_cache=None, cache_index=None, layer=None):
        # x: [B, T, E]; positions: [B, T]; attn_mask: [B, T, S] (True = may attend), or
        # for 'splash' the token mask [B, T] of a causal self-attention over this call's
        # tokens (a full forward, or a prefill from cache slot 0; the kernel is causal).
        cfg = self.config
        h, kv, d, e = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_model
        init = nn.initializers.normal(stddev=e**-0.5)
        wq = layers_lib._weight(self, "q", init, (e, h, d), ("embed", "heads", "head_dim"), cfg)
        wk = layers_lib._weight(self, "k", init, (e, kv, d), ("embed", "kv_heads", "head_dim"), cfg)
        wv = layers_lib._weight(self, "v", init, (e, kv, d), ("embed", "kv_heads", "head_dim"), cfg)
        wo = layers_lib._weight(
            self,
            "o",
            nn.initializers.normal(stddev=(h * d) ** -0.5),
            (h, d, e),
            ("heads", "head_dim", "embed"),
            cfg,
        )
        dt = cfg.jnp_dtype
        q = layers_lib.project(
            self, "q", x, wq, ("embed",), ("heads", "head_dim"), cfg
        )  # [B, T, H, D]
        k = layers_lib.project(
            self, "k", x, wk, ("embed",), ("kv_heads", "head_dim"), cfg
        )  # [B, T, KV, D]
        v = layers_lib.project(self, "v", x, wv, ("embed",), ("kv_heads", "head_dim"), cfg)
        if cfg.qkv_bias:
            zeros = nn.initializers.zeros
            q = q + layers_lib._param(
                self, "q_bias", zeros, (h, d), ("heads", "head_dim"), cfg
            ).astype(dt)
            k = k + layers_lib._param(
                self, "k_bias", zeros, (kv, d), ("kv_heads", "head_dim"), cfg
            ).astype(dt)
            v = v + layers_lib._param(
                self, "v_bias", zeros, (kv, d), ("kv_heads", "head_dim"), cfg
            ).astype(dt)
        if cfg.qk_norm:
            q = layers_lib.RMSNorm(cfg, axis_name="head_dim", name="q_norm")(q)
            k = layers_lib.RMSNorm(cfg, axis_name="head_dim", name="k_norm")(k)
        inv_freq = rope_inv_freq(cfg)
        q = rotary(q, positions, inv_freq)
        k = rotary(k, positions, inv_freq)
        q = layers_lib.constrain(q, ("batch", "length", "heads", "head_dim"))
        # Keys and values heads-major, [B, KV, S, D], as the KV cache stores them: both
        # attention contractions are then batched matmuls over (B, KV) that read the
        # cache in place (a [B, S, KV, D] cache would be transposed on every step).
        k = jnp.swapaxes(k, 1, 2)
        v = jnp.swapaxes(v, 1, 2)
        fresh_k, fresh_v = k, v  # [B, KV, T, D]: this call's keys and values

        new_cache = None
        if layer_cache is not None:
            # Write this call's keys/values at slots [cache_index, cache_index + T) and
            # attend over the whole cache; the mask hides empty and padding slots.
            # cache_index int32[B] (the rollout engine): each row writes at its own slot.
            # With `layer` the cache is every layer's ([L, B, KV, S, D], the scanned
            # decoder's carry): only this layer's new slots are written, then read back.
            k = _write_cache(layer_cache["k"], k, cache_index, layer)
            v = _write_cache(layer_cache["v"], v, cache_index, layer)
            new_cache = {"k": k, "v": v}
            if layer is not None:
                k = jax.lax.dynamic_index_in_dim(k, layer, 0, keepdims=False)
                v = jax.lax.dynamic_index_in_dim(v, layer, 0, keepdims=False)
            k, v = k.astype(dt), v.astype(dt)

        if attn_mask.ndim == 2:  # 'splash': causal over this call's own tokens
            # Off a TPU (a run's checks refuse it there; shapes traced without a mesh, a
            # test) the kernel runs in the Pallas interpreter.
            interpret = attention.target_platform() != "tpu"
            out = attention.splash_attention(q, fresh_k, fresh_v, attn_mask, interpret=interpret)
        elif cfg.attention == "einsum":
            out = attention.einsum_attention(q, k, v, attn_mask)  # [B, T, H, D]
        else:
            out = attention.dot_product_attention(q, k, v, attn_mask)
        # Rows' layout: under decode's weight-stationary rules the rows move, not wo.
        out = layers_lib.constrain(out, ("batch", "length", "heads", "head_dim"))
        out = layers_lib.project(
            self, "o", out, wo, ("heads", "head_dim"), ("embed",), cfg
        )  # [B, T, E]
        return out, new_cache


def _write_cache(cache, x, cache_index, layer=None):
    """cache [B, KV, S, D] with x [B, KV, T, D] written at slots [i, i + T): i a scalar for
    every row, or int32[B] one per row (a scatter of each row's own slice). With `layer`
    the cache is [L, B, KV, S, D] and only that layer's slots are written."""
    x = x.astype(cache.dtype)
    if layer is None:
        if jnp.ndim(cache_index) == 0:
            return jax.lax.dynamic_update_slice(cache, x, (0, 0, cache_index, 0))
        row = lambda c, u, i: jax.lax.dynamic_update_slice(c, u, (0, i, 0))
        return jax.vmap(row)(cache, x, cache_index)
    if jnp.ndim(cache_index) == 0:
        return jax.lax.dynamic_update_slice(cache, x[None], (layer, 0, 0, cache_index, 0))
    row = lambda c, u, i: jax.lax.dynamic_update_slice(c, u[None], (layer, 0, i, 0))
    return jax.vmap(row, in_axes=(1, 0, 0), out_axes=1)(cache, x, cache_index)


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        init = nn.initializers.normal(stddev=cfg.d_model**-0.5)
        gate = layers_lib._weight(
            self, "gate", init, (cfg.d_model, cfg.mlp_dim), ("embed", "mlp"), cfg
        )
        up = layers_lib._weight(self, "up", init, (cfg.d_model, cfg.mlp_dim), ("embed", "mlp"), cfg)
        down = layers_lib._weight(
            self,
            "down",
            nn.initializers.normal(stddev=cfg.mlp_dim**-0.5),
            (cfg.mlp_dim, cfg.d_model),
            ("mlp", "embed"),
            cfg,
        )
        hidden = layers_lib.swiglu(
            layers_lib.project(self, "gate", x, gate, ("embed",), ("mlp",), cfg),
            layers_lib.project(self, "up", x, up, ("embed",), ("mlp",), cfg),
        )
        hidden = layers_lib.constrain(hidden, ("batch", "length", "mlp"))
        return layers_lib.project(self, "down", hidden, down, ("mlp",), ("embed",), cfg)


class Block(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x, positions, attn_mask, layer_cache=None, cache_index=None, layer=None):
        attn_out, new_cache = Attention(self.config, name="attn")(
            layers_lib.RMSNorm(self.config, name="attn_norm")(x),
            positions,
            attn_mask,
            layer_cache,
            cache_index,
            layer,
        )
        x = layers_lib.constrain(x + attn_out, ("batch", "length", "embed"))
        x = x + MLP(self.config, name="mlp")(layers_lib.RMSNorm(self.config, name="mlp_norm")(x))
        return layers_lib.constrain(x, ("batch", "length", "embed")), new_cache

    def carried(self, carry, layer, positions, attn_mask, cache_index):
        """One step of the scanned decoder: the carry is (x, the whole cache [L, ...]).
        Scanning the cache as a per-layer input would slice it out and stack a new one
        every call (the whole cache read and written per decode step); carried, each layer
        updates only its new slots in place."""
        x, cache = carry
        return self(x, positions, attn_mask, cache, cache_index, layer), None


class Transformer(nn.Module):
    """The policy. Returns fp32 logits [B, T, V] (and the updated cache when given one)."""

    config: ModelConfig

    @nn.compact
    def __call__(
        self,
        tokens,
        positions,
        mask=None,
        *,
        cache=None,
        cache_index=None,
        kv_mask=None,
        return_hidden=False,
    ):
        # tokens, positions: [B, T] int32. Full forward: mask [B, T] marks valid tokens.
        # Step forward: cache (see init_cache), cache_index int32 scalar or [B] (first
        # slot written, for all rows or per row), kv_mask [B, S] marks valid cache slots
        # (False for prompt padding).
        # return_hidden: return the final-normed states [B, T, E] (compute dtype) in
        # place of the logits; `dense(hidden, output_head(params, config))` gives them.
        cfg = self.config
        b, t = tokens.shape
        embedding = layers_lib._param(
            self,
            "embedding",
            # d^-1/2: with a tied head, logits of a unit-RMS final state start at O(1)
            # rather than O(sqrt(d)), so the initial policy is not already peaked.
            nn.initializers.normal(stddev=cfg.d_model**-0.5),
            (cfg.vocab_size, cfg.d_model),
            ("vocab", "embed"),
            cfg,
        )
        x = jnp.take(embedding, tokens, axis=0).astype(cfg.jnp_dtype)
        x = layers_lib.constrain(x, ("batch", "length", "embed"))

        if cache is None:
            if mask is None:
                mask = jnp.ones((b, t), dtype=bool)
            if cfg.attention == "splash":
                attn_mask = mask  # [B, T]: the kernel applies the causal mask itself
            else:
                causal = jnp.tril(jnp.ones((t, t), dtype=bool))
                attn_mask = causal[None] & mask[:, None, :]  # [B, T, T]
        elif cfg.attention == "splash" and isinstance(cache_index, int) and cache_index == 0:
            # A prefill: the cache holds nothing before slot 0, so attending over it is
            # the causal self-attention of the T prompt tokens, which the kernel does.
            attn_mask = kv_mask[:, :t]  # [B, T]
        else:
            s = jax.tree_util.tree_leaves(cache)[0].shape[-2]
            # [T] with one cache_index for all rows, [B, T] with one per row.
            query_slot = jnp.asarray(cache_index)[..., None] + jnp.arange(t)
            causal = jnp.arange(s) <= query_slot[..., None]  # [T, S] or [B, T, S]
            attn_mask = jnp.broadcast_to(causal, (b, t, s)) & kv_mask[:, None, :]  # [B, T, S]

        block = Block
        if cfg.remat_policy != "none":
            # Under scan the loop already keeps XLA from merging the recomputation with
            # the forward pass, so the CSE barrier is needed only for unrolled layers.
            block = nn.remat(
                Block, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=not cfg.scan_layers
            )
        if cfg.scan_layers and cache is None:
            # x is the carry; the params are scanned over.
            layers = nn.scan(
                block,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                in_axes=(nn.broadcast, nn.broadcast),
                length=cfg.num_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, new_cache = layers(cfg, name="layers")(x, positions, attn_mask)
        elif cfg.scan_layers:
            # The carry is x and the cache ({'k', 'v'} of [L, B, KV, S, D]); the scanned
            # input is the layer index (Block.carried).
            layers = nn.scan(
                block,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast),
                length=cfg.num_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
                methods=["carried"],
            )
            layer_ids = jnp.arange(cfg.num_layers, dtype=jnp.int32)
            (x, new_cache), _ = layers(cfg, name="layers").carried(
                (x, cache), layer_ids, positions, attn_mask, cache_index
            )
        else:
            new_cache = []
            for i in range(cfg.num_layers):
                x, layer_cache = block(cfg, name=f"layer_{i}")(
                    x, positions, attn_mask, None if cache is None else cache[i], cache_index
                )
                new_cache.append(layer_cache)
        x = layers_lib.RMSNorm(cfg, name="final_norm")(x)  # [B, T, E]
        if cfg.tie_embeddings:
            head_params = {"embedding": embedding}
        else:
            head_params = {
                "lm_head": layers_lib._param(
                    self,
                    "lm_head",
                    nn.initializers.normal(stddev=cfg.d_model**-0.5),
                    (cfg.d_model, cfg.vocab_size),
                    ("embed", "vocab"),
                    cfg,
                )
            }
        if return_hidden:
            out = x
        else:
            head = output_head(head_params, cfg)  # [E, V]
            out = layers_lib.constrain(
                layers_lib.dense(x, head).astype(jnp.float32), ("batch", "length", "vocab")
            )
        if cache is None:
            return out
        return out, new_cache


def output_head(params, config: ModelConfig) -> jax.Array:
    """The output projection [E, V] in the compute dtype: the tied embedding transposed,
    or lm_head. params: the model's 'params' collection. Logits are
    `dense(hidden, output_head(params, config)).astype(float32)`."""
    if config.tie_embeddings:
        return params["embedding"].astype(config.jnp_dtype).T
    return params["lm_head"].astype(config.jnp_dtype)


def init_cache(
    config: ModelConfig, batch_size: int, cache_len: int | None = None, dtype: Any = None
) -> list[dict[str, jax.Array]] | dict[str, jax.Array]:
    """Zeroed KV cache, heads-major: one {'k', 'v'} of [B, KV, S, D] per layer, or with
    scan_layers a single {'k', 'v'} of [L, B, KV, S, D]. Either way the length axis is
    -2 and the batch axis -4 of every leaf."""
    cache_len = cache_len or config.max_len
    if cache_len > config.max_len:
        raise ValueError(f"cache length {cache_len} exceeds model.max_len={config.max_len}")
    shape = (batch_size, config.num_kv_heads, cache_len, config.head_dim)
    dtype = dtype or config.jnp_dtype
    if config.scan_layers:
        shape = (config.num_layers, *shape)
        return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
    return [
        {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
        for _ in range(config.num_layers)
    ]


CACHE_AXES = ("batch", "kv_heads", "length", "head_dim")


def cache_axes(config: ModelConfig) -> tuple[str, ...]:
    """Logical axes of every leaf of `init_cache(config, ...)`."""
    return ("layers", *CACHE_AXES) if config.scan_layers else CACHE_AXES


def stack_layers(params: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """Unrolled params (`layer_0` ... `layer_{L-1}`) -> scanned params: one `layers`
    subtree whose leaves stack the layers' on a leading [L] axis. Other entries are kept.
    Leaves may be numpy or jax arrays (numpy leaves stay numpy)."""
    names = [f"layer_{i}" for i in range(num_layers)]
    missing = [n for n in names if n not in params]
    if missing or f"layer_{num_layers}" in params:
        raise ValueError(f"params do not hold exactly layers layer_0..layer_{num_layers - 1}")

    def stack(*xs):
        return np.stack(xs) if all(isinstance(x, np.ndarray) for x in xs) else jnp.stack(xs)

    rest = {k: v for k, v in params.items() if k not in names}
    return {**rest, "layers": jax.tree_util.tree_map(stack, *[params[n] for n in names])}


def unstack_layers(params: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """The inverse of `stack_layers`: `layers` leaves [L, ...] -> `layer_i` leaves [...]."""
    if "layers" not in params:
        raise ValueError("params have no 'layers' entry (are they scanned params?)")
    for path, x in jax.tree_util.tree_leaves_with_path(params["layers"]):
        if x.shape[:1] != (num_layers,):
            key = "/".join(str(getattr(k, "key", k)) for k in path)
            raise ValueError(
                f"layers/{key} has shape {list(x.shape)}: expected [{num_layers}, ...]"
            )
    rest = {k: v for k, v in params.items() if k != "layers"}
    layers = {
        f"layer_{i}": jax.tree_util.tree_map(lambda x, i=i: x[i], params["layers"])
        for i in range(num_layers)
    }
    return {**rest, **layers}


def positions_from_mask(mask):
    """Positions for a left-padded batch: 0 at each row's first valid token. mask: [B, T]."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)
