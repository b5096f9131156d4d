"""Categorical draws from given uniform numbers, shared by the sampler and the replay buffer.

`inverse_cdf` turns uniform numbers into indices of unnormalised weights by inverting
their cumulative distribution in two levels: a block of about sqrt(n) entries by the
blocks' totals, then an entry of that block. Each level sums only ~sqrt(n) terms, so the
work is O(n + k sqrt(n)) for k draws from one row of n weights, where a Gumbel-max draw
(jax.random.categorical) needs k x n random numbers, and float32 rounding moves an
entry's probability by about sqrt(n) 2^-24 at most, relative.
"""

import math

import jax.numpy as jnp


def inverse_cdf(weights, uniform, inner_uniform=None):
    """Draws indices of the last axis of `weights`, each with probability proportional to
    its weight.

    weights: float32[..., n] >= 0, each row with a positive total.
    uniform: float32[..., k] in [0, 1): k draws from each row of weights (the leading
      axes of weights and uniform broadcast: one row [n] serves any number of draws).
    inner_uniform: optional float32[..., k] in [0, 1). Without it each draw uses one
      number, `uniform` x total, searched first among the blocks' running totals and then
      among the entries' running totals (the exact inverse CDF: the index grows with
      `uniform`). With it, `uniform` picks the block and `inner_uniform` the entry within
      the block, two independent numbers per draw.

    Returns int32[..., k] indices in [0, n). A zero weight is never drawn, except that with
    one number per draw, rounding can carry the search past a block's last positive weight
    (the block's total and its entries' running sum round differently); callers with zero
    weights check the weight drawn.
    """
    n = weights.shape[-1]
    width = math.isqrt(n - 1) + 1  # block length, ceil(sqrt(n))
    num_blocks = -(-n // width)
    padding = [(0, 0)] * (weights.ndim - 1) + [(0, num_blocks * width - n)]
    blocks = jnp.pad(weights, padding).reshape(*weights.shape[:-1], num_blocks, width)

    block_cdf = jnp.cumsum(jnp.sum(blocks, axis=-1), axis=-1)  # [..., num_blocks]
    target = uniform * block_cdf[..., -1:]  # [..., k]
    block = jnp.sum(block_cdf[..., None, :] <= target[..., None], axis=-1, dtype=jnp.int32)
    block = jnp.minimum(block, num_blocks - 1)  # [..., k]
    inner = jnp.take_along_axis(blocks, block[..., None], axis=-2)  # [..., k, width]
    inner_cdf = jnp.cumsum(inner, axis=-1)
    if inner_uniform is None:
        # The same target, offset by the mass of the blocks before the chosen one.
        before = jnp.take_along_axis(block_cdf, jnp.maximum(block - 1, 0), axis=-1)
        inner_cdf = jnp.where(block > 0, before, 0.0)[..., None] + inner_cdf
    else:
        target = inner_uniform * inner_cdf[..., -1]
    within = jnp.sum(inner_cdf <= target[..., None], axis=-1, dtype=jnp.int32)
    return jnp.minimum(block * width + jnp.minimum(within, width - 1), n - 1)
