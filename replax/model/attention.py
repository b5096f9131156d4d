"""Rotary position embedding and the attention kernels of `replax.model.transformer`.

Every kernel takes queries q [B, T, H, D] and keys / values heads-major, k, v [B, KV, S, D]
(as the KV cache stores them; KV divides H: grouped-query attention), and returns
[B, T, H, D] in q's dtype. `model.attention` picks one for full-sequence forwards:
  * 'einsum': two einsums around a float32 softmax over the whole [T, S] score matrix,
    the reference (and, bit for bit, what replax computed before the others existed);
  * 'dot_product': `jax.nn.dot_product_attention` (XLA's fused attention where the
    backend has one), scores accumulated in float32;
  * 'splash': the Pallas TPU splash (flash) attention kernel, which never stores the
    [T, T] scores and skips the blocks above the causal diagonal. TPU only
    (`check_attention_backend`), for full forwards and the sampler's prefill; the decode
    step (one token against a KV cache) uses 'dot_product'. A Mosaic kernel cannot be
    partitioned by XLA, so on a mesh it runs under `shard_map`, each device on its own
    rows and heads (`splash_attention`).
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from replax.core import sharding

ATTENTION_KINDS = ("einsum", "dot_product", "splash")

# Large negative logit for masked attention scores: finite, so a row with no valid key
# (a padding query) yields a uniform distribution instead of NaN.
MASK_VALUE = -1e30

# Splash attention's tile: sequences are padded up to a multiple of it.
SPLASH_BLOCK = 128
# The kernel's block sizes, largest first: 512 is what the kernel's authors tune for on
# v5e / v5p at head_dim 64-128; a padded length takes the largest that divides it.
SPLASH_BLOCK_CHOICES = (512, 256, 128)


def target_platform() -> str:
    """The platform of the program being traced: that of the mesh in context (a TPU
    topology's when a CPU host compiles ahead of time for it), else jax's default backend."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else getattr(mesh, "abstract_device", None)
    return device.platform if device is not None else jax.default_backend()


def check_attention_backend(config, backend: str) -> None:
    """Raises a one-line ValueError when `config.attention` cannot run on `backend`
    ('cpu', 'gpu', 'tpu': `target_platform()`, or the devices a run compiles for). Call it
    before compiling."""
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


def splash_block_size(padded_len: int) -> int:
    """The kernel's block for a sequence padded to `padded_len` (a multiple of 128)."""
    return next(b for b in SPLASH_BLOCK_CHOICES if padded_len % b == 0)


def _splash_local(q, k, v, token_mask, *, interpret: bool):
    """The kernel on arrays a device holds whole: q [B, T, H, D], k / v [B, KV, T, D],
    token_mask [B, T]."""
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
    block = splash_block_size(padded)
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


def _mesh_axes(spec_entry) -> tuple[str, ...]:
    if spec_entry is None:
        return ()
    return (spec_entry,) if isinstance(spec_entry, str) else tuple(spec_entry)


def splash_specs(mesh, rules, num_heads: int, num_kv_heads: int):
    """(q, kv, token mask) PartitionSpecs of the kernel's shard_map: rows over the mesh
    axes of the `batch` rule, heads over those of `heads` when they also divide the kv
    heads (a device then holds whole groups of query heads with their kv head), else
    heads whole. Length and head_dim stay whole: the kernel needs every key of a row."""
    batch = sharding.logical_to_spec(("batch",), rules)[0]
    heads = _mesh_axes(sharding.logical_to_spec(("heads",), rules)[0])
    size = int(np.prod([mesh.shape[a] for a in heads])) if heads else 1
    if size == 1 or num_heads % size or num_kv_heads % size:
        heads = ()
    head_entry = None if not heads else (heads[0] if len(heads) == 1 else heads)
    return P(batch, None, head_entry, None), P(batch, head_entry, None, None), P(batch, None)


def splash_attention(q, k, v, token_mask, *, interpret: bool = False):
    """Causal self-attention of a full sequence through the Pallas splash kernel.

    q [B, T, H, D], k / v [B, KV, T, D], token_mask [B, T] (True = a valid token). Valid
    queries attend to the valid keys at or before them, as with the [B, T, T] mask of the
    other kernels; a padding query attends to the padding keys before it (its output is
    unused either way). T is padded to a multiple of SPLASH_BLOCK. interpret: run the
    kernel in the Pallas interpreter (any backend, slowly; for tests).

    Under a mesh in context (`sharding.activation_rules`) the kernel runs in `shard_map`
    over the mesh axes the logical-axis rules give rows and heads (`splash_specs`): a
    Mosaic kernel cannot be partitioned automatically, and each row's attention needs
    only its own row, each query head only its own kv head.
    """
    kernel = functools.partial(_splash_local, interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return kernel(q, k, v, token_mask)
    rules = nn.get_logical_axis_rules()
    q_spec, kv_spec, mask_spec = splash_specs(mesh, rules, q.shape[2], k.shape[1])
    return jax.shard_map(
        kernel,
        mesh=mesh,
        in_specs=(q_spec, kv_spec, kv_spec, mask_spec),
        out_specs=q_spec,
        # The interpreter's and Mosaic's outputs carry no varying-axes annotation.
        check_vma=False,
    )(q, k, v, token_mask)
