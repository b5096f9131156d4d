"""Tests for replax/model/attention.py: RoPE frequencies and rotation against numpy, the two
CPU attention kernels against a numpy reference with grouped kv heads, backend checks."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from replax.model import attention
from replax.model.config import ModelConfig


def config(**kwargs):
    return ModelConfig(**{"head_dim": 8, "max_len": 16, **kwargs})


def test_default_rope_frequencies():
    # theta ** (-2i / D) for i < D / 2: with theta 10_000 and D = 8, 1, 0.1, 0.01, 0.001.
    np.testing.assert_allclose(
        attention.rope_inv_freq(config()), [1.0, 0.1, 0.01, 0.001], rtol=1e-6
    )
    np.testing.assert_allclose(
        attention.rope_inv_freq(config(rope_type="linear", rope_factor=4.0)),
        [0.25, 0.025, 0.0025, 0.00025],
        rtol=1e-6,
    )


def test_dynamic_rope_within_the_original_context_is_unscaled():
    dynamic = config(rope_type="dynamic", rope_factor=2.0, rope_original_max_len=16)
    np.testing.assert_allclose(
        attention.rope_inv_freq(dynamic), attention.rope_inv_freq(config()), rtol=1e-6
    )


def test_llama3_rope_against_numpy():
    cfg = config(
        rope_type="llama3",
        rope_factor=8.0,
        rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0,
        rope_original_max_len=64,
    )
    inv = 1.0 / 10_000.0 ** (np.arange(4) / 4)
    wavelen = 2 * math.pi / inv  # 6.3, 63, 628, 6283: kept, smoothed, divided, divided
    smooth = (64 / wavelen - 1.0) / (4.0 - 1.0)
    want = np.where(wavelen > 64, inv / 8, inv)
    medium = (wavelen >= 16) & (wavelen <= 64)
    want = np.where(medium, (1 - smooth) * inv / 8 + smooth * inv, want)
    np.testing.assert_allclose(attention.rope_inv_freq(cfg), want, rtol=1e-5)


def test_rotary_rotates_each_pair_by_its_angle():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 3, 2, 4)), jnp.float32)
    positions = jnp.array([[0, 1, 5]])
    inv_freq = jnp.array([1.0, 0.5])
    out = np.asarray(attention.rotary(x, positions, inv_freq))
    np.testing.assert_allclose(out[:, 0], x[:, 0], rtol=1e-6)  # position 0: no rotation
    # Rotate-half: pair (x[j], x[j + D/2]) turns by position * inv_freq[j].
    for t, pos in enumerate((0, 1, 5)):
        for j in range(2):
            a = pos * float(inv_freq[j])
            x1, x2 = np.asarray(x[0, t, :, j]), np.asarray(x[0, t, :, j + 2])
            np.testing.assert_allclose(out[0, t, :, j], x1 * np.cos(a) - x2 * np.sin(a), atol=1e-6)
            np.testing.assert_allclose(
                out[0, t, :, j + 2], x2 * np.cos(a) + x1 * np.sin(a), atol=1e-6
            )
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


def numpy_attention(q, k, v, mask):
    """q [B, T, H, D], k / v [B, KV, S, D]: query head h reads kv head h // (H / KV)."""
    b, t, h, d = q.shape
    group = h // k.shape[1]
    out = np.zeros_like(q)
    for head in range(h):
        kh, vh = k[:, head // group], v[:, head // group]  # [B, S, D]
        scores = np.einsum("btd,bsd->bts", q[:, :, head], kh) / math.sqrt(d)
        scores = np.where(mask, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out[:, :, head] = np.einsum("bts,bsd->btd", probs, vh)
    return out


@pytest.mark.parametrize("kernel", [attention.einsum_attention, attention.dot_product_attention])
def test_kernels_match_numpy_with_grouped_kv_heads(kernel):
    rng = np.random.default_rng(1)
    q = rng.normal(size=(2, 3, 4, 8)).astype(np.float32)
    k, v = (rng.normal(size=(2, 2, 5, 8)).astype(np.float32) for _ in range(2))
    mask = np.tril(np.ones((3, 5), bool), k=2)[None].repeat(2, axis=0)  # causal at offset 2
    mask[1, :, 0] = False  # a padded key
    got = kernel(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(mask))
    np.testing.assert_allclose(got, numpy_attention(q, k, v, mask), rtol=1e-5, atol=1e-5)


def test_splash_attention_needs_a_tpu():
    attention.check_attention_backend(config(attention="splash"), "tpu")
    attention.check_attention_backend(config(attention="einsum"), "cpu")
    with pytest.raises(ValueError, match="model.attention='splash' needs a TPU"):
        attention.check_attention_backend(config(attention="splash"), "cpu")
