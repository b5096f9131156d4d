"""Decoder-only transformer of the Llama / Qwen2 / Qwen3 family, in Flax linen.

One module serves learning and sampling:
  * `Transformer.__call__(tokens, positions, mask)` is the full-sequence forward used by
    the train step (causal attention restricted to valid, i.e. non-padding, keys);
  * `Transformer.__call__(tokens, positions, cache=..., cache_index=..., kv_mask=...)`
    is the step forward used by the sampler: it writes the new keys and values into
    the KV cache at `cache_index` and attends to every valid cache slot up to its own.

Every parameter and the main activations carry logical axis names (batch, length,
embed, heads, kv_heads, head_dim, mlp, vocab); `replax.sharding` maps them to mesh
axes through a rule table, so sharding is configuration, not code.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
ROPE_TYPES = ("default", "linear", "dynamic", "llama3")

# Large negative logit for masked attention scores: finite, so a row with no valid
# key (a padding query) yields a uniform distribution instead of NaN.
_MASK_VALUE = -1e30


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of the policy. Validates itself on construction."""

    vocab_size: int = 512
    num_layers: int = 4
    d_model: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    mlp_dim: int = 1024
    # Longest sequence (prompt + completion) the positions and the KV cache allow.
    max_len: int = 256
    tie_embeddings: bool = True
    # Qwen2 puts biases on the q/k/v projections; Qwen3 normalises q and k per head.
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_theta: float = 10_000.0
    # RoPE scaling as transformers computes it (modeling_rope_utils); see `rope_inv_freq`.
    # "default" (none), "linear", "dynamic" (NTK) or "llama3" (Llama 3.1 / 3.2 / 3.3).
    rope_type: str = "default"
    rope_factor: float = 1.0
    # llama3: wavelengths above rope_original_max_len / low_freq_factor are divided by
    # factor, those below rope_original_max_len / high_freq_factor kept, smoothed between.
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    # Context length the frequencies are anchored at: llama3's
    # original_max_position_embeddings; dynamic's max_position_embeddings (0: max_len).
    rope_original_max_len: int = 0
    norm_eps: float = 1e-6
    param_dtype: str = "float32"
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(
                    f"model.{name}={getattr(self, name)!r}: allowed are {sorted(DTYPES)}"
                )
        for name in (
            "vocab_size",
            "num_layers",
            "d_model",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "mlp_dim",
            "max_len",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name}={getattr(self, name)} must be >= 1")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"model.rope_type={self.rope_type!r}: allowed are {list(ROPE_TYPES)}")
        if self.head_dim % 2:
            raise ValueError(f"model.head_dim={self.head_dim} must be even (RoPE rotates pairs)")
        if self.rope_type != "default" and not self.rope_factor > 0:
            raise ValueError(f"model.rope_factor={self.rope_factor} must be > 0")
        if self.rope_original_max_len < 0:
            raise ValueError(
                f"model.rope_original_max_len={self.rope_original_max_len} must be >= 0"
            )
        if self.rope_type == "llama3":
            if not self.rope_high_freq_factor > self.rope_low_freq_factor > 0:
                raise ValueError(
                    f"model.rope_high_freq_factor={self.rope_high_freq_factor} and "
                    f"rope_low_freq_factor={self.rope_low_freq_factor}: llama3 RoPE needs "
                    "high > low > 0"
                )
            if self.rope_original_max_len < 1:
                raise ValueError("model.rope_original_max_len must be >= 1 for rope_type 'llama3'")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_kv_heads={self.num_kv_heads} must divide "
                f"model.num_heads={self.num_heads}"
            )

    @property
    def jnp_dtype(self):
        return DTYPES[self.dtype]

    @property
    def jnp_param_dtype(self):
        return DTYPES[self.param_dtype]


def _param(module: nn.Module, name: str, init, shape, axes, config: ModelConfig):
    return module.param(
        name, nn.with_logical_partitioning(init, axes), shape, config.jnp_param_dtype
    )


def dense(x, w, in_dims: int = 1):
    """x [..., *in] times w [*in, *out] (the last in_dims axes of x contracted with the
    first in_dims of w) as one 2-D matmul [rows, in] @ [in, out], reshaped back.

    The same contraction written over [B, T, ...] activations makes XLA:CPU transpose the
    activations for the weight gradient, fused with the elementwise ops that produce them
    (strided, several times the matmul's own cost); 2-D matmuls keep every operand of the
    forward and backward pass in its row-major layout.
    """
    lead, contracted = x.shape[: x.ndim - in_dims], x.shape[x.ndim - in_dims :]
    k = math.prod(contracted)
    y = x.reshape(-1, k) @ w.reshape(k, -1)
    return y.reshape(*lead, *w.shape[in_dims:])


def constrain(x, axes):
    """Activation sharding by logical axis names; a no-op outside a rules context."""
    return nn.with_logical_constraint(x, axes)


class RMSNorm(nn.Module):
    config: ModelConfig
    axis_name: str = "embed"

    @nn.compact
    def __call__(self, x):
        dim = x.shape[-1]
        scale = _param(self, "scale", nn.initializers.ones, (dim,), (self.axis_name,), self.config)
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(
            jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.config.norm_eps
        )
        return (x32 * scale.astype(jnp.float32)).astype(self.config.jnp_dtype)


def rope_inv_freq(config: ModelConfig) -> jax.Array:
    """RoPE inverse frequencies float32[head_dim / 2], as transformers' ROPE_INIT_FUNCTIONS
    compute them (float32 arithmetic in the same order).

    linear: every frequency divided by factor. llama3: long wavelengths (> original /
    low_freq_factor) divided by factor, short ones (< original / high_freq_factor) kept,
    interpolated between. dynamic (NTK): theta grows to theta * (factor * L / original -
    factor + 1) ** (D / (D - 2)) for a sequence of L tokens, L = max(L, original).
    transformers recomputes that for each batch's length; replax fixes L = max_len. The two
    are the same for every sequence when max_len <= original (max_position_embeddings),
    where the frequencies are the unscaled ones; beyond it replax's are those transformers
    uses for a max_len-token sequence.
    """
    dim, half = config.head_dim, config.head_dim // 2
    base = float(config.rope_theta)
    original = config.rope_original_max_len or config.max_len
    if config.rope_type == "dynamic":
        seq_len = max(config.max_len, original)
        scale = config.rope_factor * seq_len / original - (config.rope_factor - 1)
        base = base * scale ** (dim / (dim - 2))
    # In the graph, as XLA computes float32 powers: the unscaled frequencies stay exactly
    # those every earlier replax checkpoint was trained with.
    inv_freq = 1.0 / (base ** (jnp.arange(half, dtype=jnp.float32) / half))
    if config.rope_type == "linear":
        inv_freq = inv_freq / config.rope_factor
    elif config.rope_type == "llama3":
        factor, low, high = (
            config.rope_factor,
            config.rope_low_freq_factor,
            config.rope_high_freq_factor,
        )
        wavelen = 2 * math.pi / inv_freq
        scaled = jnp.where(wavelen > original / low, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < original / high) & ~(wavelen > original / low)
        inv_freq = jnp.where(medium, smoothed, scaled)
    return inv_freq


def rotary(x, positions, inv_freq):
    """Rotary position embedding (rotate-half form). x: [B, T, H, D], positions: [B, T],
    inv_freq: [D/2] (`rope_inv_freq`)."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
    sin = jnp.sin(angles)[:, :, None, :]  # [B, T, 1, D/2]
    cos = jnp.cos(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention with optional q/k/v bias, q/k norm and a KV cache."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x, positions, attn_mask, layer_cache=None, cache_index=None):
        # x: [B, T, E]; positions: [B, T]; attn_mask: [B, T, S] (True = may attend).
        cfg = self.config
        h, kv, d, e = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_model
        init = nn.initializers.normal(stddev=e**-0.5)
        wq = _param(self, "q", init, (e, h, d), ("embed", "heads", "head_dim"), cfg)
        wk = _param(self, "k", init, (e, kv, d), ("embed", "kv_heads", "head_dim"), cfg)
        wv = _param(self, "v", init, (e, kv, d), ("embed", "kv_heads", "head_dim"), cfg)
        wo = _param(
            self,
            "o",
            nn.initializers.normal(stddev=(h * d) ** -0.5),
            (h, d, e),
            ("heads", "head_dim", "embed"),
            cfg,
        )
        dt = cfg.jnp_dtype
        q = dense(x, wq.astype(dt))  # [B, T, H, D]
        k = dense(x, wk.astype(dt))  # [B, T, KV, D]
        v = dense(x, wv.astype(dt))
        if cfg.qkv_bias:
            zeros = nn.initializers.zeros
            q = q + _param(self, "q_bias", zeros, (h, d), ("heads", "head_dim"), cfg).astype(dt)
            k = k + _param(self, "k_bias", zeros, (kv, d), ("kv_heads", "head_dim"), cfg).astype(dt)
            v = v + _param(self, "v_bias", zeros, (kv, d), ("kv_heads", "head_dim"), cfg).astype(dt)
        if cfg.qk_norm:
            q = RMSNorm(cfg, axis_name="head_dim", name="q_norm")(q)
            k = RMSNorm(cfg, axis_name="head_dim", name="k_norm")(k)
        inv_freq = rope_inv_freq(cfg)
        q = rotary(q, positions, inv_freq)
        k = rotary(k, positions, inv_freq)
        q = constrain(q, ("batch", "length", "heads", "head_dim"))
        # Keys and values heads-major, [B, KV, S, D], as the KV cache stores them: both
        # attention contractions are then batched matmuls over (B, KV) that read the
        # cache in place (a [B, S, KV, D] cache would be transposed on every step).
        k = jnp.swapaxes(k, 1, 2)
        v = jnp.swapaxes(v, 1, 2)

        new_cache = None
        if layer_cache is not None:
            # Write this call's keys/values at slots [cache_index, cache_index + T) and
            # attend over the whole cache; the mask hides empty and padding slots.
            k = jax.lax.dynamic_update_slice(
                layer_cache["k"], k.astype(layer_cache["k"].dtype), (0, 0, cache_index, 0)
            )
            v = jax.lax.dynamic_update_slice(
                layer_cache["v"], v.astype(layer_cache["v"].dtype), (0, 0, cache_index, 0)
            )
            new_cache = {"k": k, "v": v}
            k, v = k.astype(dt), v.astype(dt)

        b, t = x.shape[:2]
        q = q.reshape(b, t, kv, h // kv, d)  # [B, T, KV, G, D]
        scores = jnp.einsum("btkgd,bksd->bkgts", q, k).astype(jnp.float32) * d**-0.5
        scores = jnp.where(attn_mask[:, None, None, :, :], scores, _MASK_VALUE)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt)  # [B, KV, G, T, S]
        out = jnp.einsum("bkgts,bksd->bkgtd", probs, v)  # [B, KV, G, T, D]
        out = jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(b, t, h, d)
        out = dense(out, wo.astype(dt), in_dims=2)  # [B, T, E]
        return out, new_cache


@jax.custom_vjp
def swiglu(gate, up):
    """silu(gate) * up, differentiated by hand: the backward pass keeps only gate and up
    (recomputing the sigmoid), so the forward is one elementwise pass instead of three
    that each store an intermediate [B, T, mlp] array for the backward."""
    return jax.nn.silu(gate) * up


def _swiglu_forward(gate, up):
    return swiglu(gate, up), (gate, up)


def _swiglu_backward(residuals, grad):
    gate, up = residuals
    sigmoid = jax.nn.sigmoid(gate)
    # d silu(g) / dg = sigmoid(g) (1 + g (1 - sigmoid(g))).
    return grad * up * sigmoid * (1 + gate * (1 - sigmoid)), grad * gate * sigmoid


swiglu.defvjp(_swiglu_forward, _swiglu_backward)


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        init = nn.initializers.normal(stddev=cfg.d_model**-0.5)
        gate = _param(self, "gate", init, (cfg.d_model, cfg.mlp_dim), ("embed", "mlp"), cfg)
        up = _param(self, "up", init, (cfg.d_model, cfg.mlp_dim), ("embed", "mlp"), cfg)
        down = _param(
            self,
            "down",
            nn.initializers.normal(stddev=cfg.mlp_dim**-0.5),
            (cfg.mlp_dim, cfg.d_model),
            ("mlp", "embed"),
            cfg,
        )
        dt = cfg.jnp_dtype
        hidden = swiglu(dense(x, gate.astype(dt)), dense(x, up.astype(dt)))
        hidden = constrain(hidden, ("batch", "length", "mlp"))
        return dense(hidden, down.astype(dt))


class Block(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x, positions, attn_mask, layer_cache=None, cache_index=None):
        attn_out, new_cache = Attention(self.config, name="attn")(
            RMSNorm(self.config, name="attn_norm")(x),
            positions,
            attn_mask,
            layer_cache,
            cache_index,
        )
        x = constrain(x + attn_out, ("batch", "length", "embed"))
        x = x + MLP(self.config, name="mlp")(RMSNorm(self.config, name="mlp_norm")(x))
        return constrain(x, ("batch", "length", "embed")), new_cache


class Transformer(nn.Module):
    """The policy. Returns fp32 logits [B, T, V] (and the updated cache when given one)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, tokens, positions, mask=None, *, cache=None, cache_index=None, kv_mask=None):
        # tokens, positions: [B, T] int32. Full forward: mask [B, T] marks valid tokens.
        # Step forward: cache (see init_cache), cache_index scalar int32 (first slot
        # written), kv_mask [B, S] marks valid cache slots (False for prompt padding).
        cfg = self.config
        b, t = tokens.shape
        embedding = _param(
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
        x = constrain(x, ("batch", "length", "embed"))

        if cache is None:
            if mask is None:
                mask = jnp.ones((b, t), dtype=bool)
            causal = jnp.tril(jnp.ones((t, t), dtype=bool))
            attn_mask = causal[None] & mask[:, None, :]  # [B, T, T]
        else:
            s = cache[0]["k"].shape[2]
            query_slot = cache_index + jnp.arange(t)  # [T]
            causal = jnp.arange(s)[None, :] <= query_slot[:, None]  # [T, S]
            attn_mask = causal[None] & kv_mask[:, None, :]  # [B, T, S]

        new_cache = []
        for i in range(cfg.num_layers):
            x, layer_cache = Block(cfg, name=f"layer_{i}")(
                x, positions, attn_mask, None if cache is None else cache[i], cache_index
            )
            new_cache.append(layer_cache)
        x = RMSNorm(cfg, name="final_norm")(x)
        if cfg.tie_embeddings:
            logits = dense(x, embedding.astype(cfg.jnp_dtype).T)
        else:
            head = _param(
                self,
                "lm_head",
                nn.initializers.normal(stddev=cfg.d_model**-0.5),
                (cfg.d_model, cfg.vocab_size),
                ("embed", "vocab"),
                cfg,
            )
            logits = dense(x, head.astype(cfg.jnp_dtype))
        logits = constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))
        if cache is None:
            return logits
        return logits, new_cache


def init_cache(
    config: ModelConfig, batch_size: int, cache_len: int | None = None, dtype: Any = None
) -> list[dict[str, jax.Array]]:
    """Zeroed KV cache: one {'k', 'v'} of [B, KV, S, D] (heads-major) per layer."""
    cache_len = cache_len or config.max_len
    if cache_len > config.max_len:
        raise ValueError(f"cache length {cache_len} exceeds model.max_len={config.max_len}")
    shape = (batch_size, config.num_kv_heads, cache_len, config.head_dim)
    dtype = dtype or config.jnp_dtype
    return [
        {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
        for _ in range(config.num_layers)
    ]


CACHE_AXES = ("batch", "kv_heads", "length", "head_dim")


def positions_from_mask(mask):
    """Positions for a left-padded batch: 0 at each row's first valid token. mask: [B, T]."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def token_logprobs_and_entropy(logits, tokens):
    """token_logprobs and the entropy of each next-token distribution (aligned the same
    way: 0 at t = 0), from one log-softmax over [B, T - 1, V]."""
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return jnp.pad(picked, ((0, 0), (1, 0))), jnp.pad(entropy, ((0, 0), (1, 0)))


def token_logprobs(logits, tokens):
    """log p(tokens[t] | tokens[<t]) for t >= 1, and 0 at t = 0. logits: [B, T, V]."""
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.pad(picked, ((0, 0), (1, 0)))
