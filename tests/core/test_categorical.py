"""Tests for replax/core/categorical.py: the two-level inverse CDF against numpy references."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replax.core import categorical


def integer_weights(rng, shape):
    """Weights 0..7, about a third of them zero and the first of each row positive. Their
    running sums are exact in float32, so a float64 numpy reference sees the same CDF."""
    weights = rng.integers(1, 8, shape).astype(np.float32)
    weights[rng.random(shape) < 0.3] = 0.0
    weights[..., 0] += 1.0
    return weights


def target(uniform, total):
    """uniform x total rounded to float32, as the draw computes it."""
    return np.float32(uniform) * np.float32(total)


@pytest.mark.parametrize("n", [1, 7, 64, 130])
def test_one_uniform_per_draw_is_the_inverse_cdf(n):
    rng = np.random.default_rng(n)
    weights = integer_weights(rng, (50, n))
    uniform = rng.random((50, 3)).astype(np.float32)  # three draws per row
    drawn = np.asarray(categorical.inverse_cdf(jnp.asarray(weights), jnp.asarray(uniform)))
    cdf = np.cumsum(weights.astype(np.float64), axis=-1)
    expected = [
        [np.searchsorted(c, target(u, c[-1]), side="right") for u in row]
        for c, row in zip(cdf, uniform)
    ]
    np.testing.assert_array_equal(drawn, expected)
    assert (np.take_along_axis(weights, drawn, -1) > 0).all()


@pytest.mark.parametrize("n", [1, 8, 1000])
def test_two_uniforms_pick_a_block_then_an_entry_of_it(n):
    rng = np.random.default_rng(n)
    weights = integer_weights(rng, (n,))
    uniform, inner_uniform = rng.random((2, 200)).astype(np.float32)
    drawn = categorical.inverse_cdf(
        jnp.asarray(weights), jnp.asarray(uniform), inner_uniform=jnp.asarray(inner_uniform)
    )
    # numpy reference: blocks of ceil(sqrt(n)) entries (the last one padded with zeros).
    width = math.isqrt(n - 1) + 1
    blocks = np.pad(weights, (0, -n % width)).reshape(-1, width).astype(np.float64)
    block_cdf = np.cumsum(blocks.sum(axis=1))
    expected = []
    for u, v in zip(uniform, inner_uniform):
        block = np.searchsorted(block_cdf, target(u, block_cdf[-1]), side="right")
        inner_cdf = np.cumsum(blocks[block])
        expected.append(
            block * width + np.searchsorted(inner_cdf, target(v, inner_cdf[-1]), "right")
        )
    np.testing.assert_array_equal(drawn, expected)


def test_draws_follow_the_weights_and_skip_zero_weights():
    # 1000 entries (not a square: the last block is padded), every third one of weight zero.
    weights = np.where(np.arange(1000) % 3 == 0, 0.0, 1.0 + np.arange(1000) % 7)
    uniform = jax.random.uniform(jax.random.key(0), (2, 400_000))
    draw = jax.jit(categorical.inverse_cdf)
    for inner_uniform in (None, uniform[1]):
        drawn = np.asarray(draw(jnp.asarray(weights, jnp.float32), uniform[0], inner_uniform))
        assert not np.isin(drawn, np.flatnonzero(weights == 0)).any()
        frequencies = np.bincount(drawn, minlength=1000) / drawn.size
        assert 0.5 * np.abs(frequencies - weights / weights.sum()).sum() < 0.03
    # The largest float32 below 1 lands on the last entry of positive weight (998).
    top = jnp.full((1,), 1 - 2.0**-24)
    assert int(categorical.inverse_cdf(jnp.asarray(weights, jnp.float32), top, top)[0]) == 998
    assert int(categorical.inverse_cdf(jnp.asarray(weights, jnp.float32), top)[0]) == 998
