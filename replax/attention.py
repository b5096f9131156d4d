"""Rotary position embedding and the attention kernels of `replax.model`.

Every kernel takes queries q [B, T, H, D] and keys / values heads-major, k, v [B, KV, S, D]
(as the KV cache stores them; KV divides H: grouped-query attention), and returns
[B, T, H, D] in q's dtype. `model.attention` picks one for full-sequence forwards:
  * 'einsum': two einsums around a float32 softmax over the whole [T, S] score matrix,
    the reference (and, bit for bit, what replax computed before the others existed);
  * 'dot_product': `jax.nn.dot_product_attention` (XLA's fused attention where the
    backend has one), scores accumulated in float32;
  * 'splash': the Pallas TPU splash (flash) attention kernel, which never stores the
    [T, T] scores and skips the blocks above the causal diagonal. TPU only
    (`check_attention_backend`); the decode step (a KV cache) uses 'dot_product'.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

ATTENTION_KINDS = ("einsum", "dot_product", "splash")

# Large negative logit for masked attention scores: finite, so a row with no valid key
# (a padding query) yields a uniform distribution instead of NaN.
MASK_VALUE = -1e30

# Splash attention's tile: sequences are padded up to a multiple of it.
SPLASH_BLOCK = 128


def check_attention_backend(config, backend: str) -> None:
    """Raises a one-line ValueError when `config.attention` cannot run on `backend`
    (jax.default_backend(): 'cpu', 'gpu', 'tpu'). Call it before compiling."""
    if config.attention == "splash" and backend != "tpu":
        raise ValueError(
            f"model.attention='splash' needs a TPU (backend is {backend!r}): use "
            "'dot_product' or 'einsum'"
        )


def rope_inv_freq(config) -> jax.Array:
    """RoPE inverse frequencies float32[head_dim / 2], as transformers' ROPE_INIT_FUNCTIONS
    compute them (float32 arithmetic in the same order). config: a `model.ModelConfig`.

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


def einsum_attention(q, k, v, attn_mask):
    """q [B, T, H, D], k / v [B, KV, S, D], attn_mask [B, T, S] (True = may attend)."""
    b, t, h, d = q.shape
    kv = k.shape[1]
    q = q.reshape(b, t, kv, h // kv, d)  # [B, T, KV, G, D]
    scores = jnp.einsum("btkgd,bksd->bkgts", q, k).astype(jnp.float32) * d**-0.5
    scores = jnp.where(attn_mask[:, None, None, :, :], scores, MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)  # [B, KV, G, T, S]
    out = jnp.einsum("bkgts,bksd->bkgtd", probs, v)  # [B, KV, G, T, D]
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(b, t, h, d)


def dot_product_attention(q, k, v, attn_mask):
    """As `einsum_attention`, through jax.nn.dot_product_attention (which takes keys and
    values [B, S, KV, D] and fewer kv heads than query heads)."""
    return jax.nn.dot_product_attention(
        q,
        jnp.swapaxes(k, 1, 2),
        jnp.swapaxes(v, 1, 2),
        mask=attn_mask[:, None, :, :],  # [B, 1, T, S]: the same for every head
        scale=q.shape[-1] ** -0.5,
    )


def splash_attention(q, k, v, token_mask, *, interpret: bool = False):
    """Causal self-attention of a full sequence through the Pallas splash kernel.

    q [B, T, H, D], k / v [B, KV, T, D], token_mask [B, T] (True = a valid token). Valid
    queries attend to the valid keys at or before them, as with the [B, T, T] mask of the
    other kernels; a padding query attends to the padding keys before it (its output is
    unused either way). T is padded to a multiple of SPLASH_BLOCK. interpret: run the
    kernel in the Pallas interpreter (any backend, slowly; for tests).
    """
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel,
        splash_attention_mask,
    )

    b, t, h, d = q.shape
    padded = -(-t // SPLASH_BLOCK) * SPLASH_BLOCK
    pad = padded - t
    # The kernel applies no scale: fold 1/sqrt(D) into q.
    q = jnp.swapaxes(q * jnp.asarray(d**-0.5, q.dtype), 1, 2)  # [B, H, T, D]
    q = jnp.pad(q, ((0, 0), (0, 0), (0, pad), (0, 0)))
    k = jnp.pad(k, ((0, 0), (0, 0), (0, pad), (0, 0)))
    v = jnp.pad(v, ((0, 0), (0, 0), (0, pad), (0, 0)))
    # Segment 1: valid tokens, 0: padding (left or appended); a query sees only keys of
    # its own segment, within the causal mask.
    segments = jnp.pad(token_mask.astype(jnp.int32), ((0, 0), (0, pad)))  # [B, T']

    causal = splash_attention_mask.CausalMask((padded, padded))
    block = min(SPLASH_BLOCK, padded)
    sizes = splash_attention_kernel.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    kernel = splash_attention_kernel.make_splash_mha(
        splash_attention_mask.MultiHeadMask([causal] * h),
        block_sizes=sizes,
        head_shards=1,
        q_seq_shards=1,
        interpret=interpret,
    )

    def one_row(q, k, v, segment):  # [H, T', D], [KV, T', D], [KV, T', D], [T']
        ids = splash_attention_kernel.SegmentIds(q=segment, kv=segment)
        return kernel(q, k, v, segment_ids=ids)

    out = jax.vmap(one_row)(q, k, v, segments)  # [B, H, T', D]
    return jnp.swapaxes(out[:, :, :t], 1, 2).astype(v.dtype)  # [B, T, H, D]
