"""Tests for replax/model/layers.py: the contraction, the custom-VJP SwiGLU, RMSNorm, and a
projection's LoRA term."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from conftest import TINY

from replax.model import layers


def test_dense_is_the_contraction_of_the_trailing_axes():
    x = jax.random.normal(jax.random.key(0), (2, 3, 4, 5))
    w = jax.random.normal(jax.random.key(1), (4, 5, 6))
    np.testing.assert_allclose(
        layers.dense(x, w, in_dims=2), jnp.einsum("btkd,kde->bte", x, w), rtol=1e-5
    )
    np.testing.assert_allclose(
        layers.dense(x, w[0], in_dims=1), jnp.einsum("btkd,de->btke", x, w[0]), rtol=1e-5
    )


def test_swiglu_gradient_matches_autodiff_of_silu_times_up():
    gate, up, grad = jax.random.normal(jax.random.key(0), (3, 4, 16)) * 3
    plain = lambda g, u: jnp.sum(jax.nn.silu(g) * u * grad)
    fused = lambda g, u: jnp.sum(layers.swiglu(g, u) * grad)
    np.testing.assert_allclose(fused(gate, up), plain(gate, up), rtol=1e-6)
    for got, want in zip(jax.grad(fused, (0, 1))(gate, up), jax.grad(plain, (0, 1))(gate, up)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_rms_norm_scales_each_vector_to_unit_root_mean_square():
    x = jax.random.normal(jax.random.key(0), (2, 3, TINY.d_model)) * 5
    norm = layers.RMSNorm(TINY)
    params = norm.init(jax.random.key(1), x)
    y = norm.apply(params, x)
    want = x / np.sqrt(np.mean(np.square(np.asarray(x)), axis=-1, keepdims=True) + TINY.norm_eps)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_projection_adds_its_lora_term_scaled_by_alpha_over_rank():
    import flax.linen as nn

    config = dataclasses.replace(TINY, lora_rank=2, lora_alpha=4.0, lora_targets=("q",))
    x = jax.random.normal(jax.random.key(0), (2, 3, config.d_model))
    w = jax.random.normal(jax.random.key(1), (config.d_model, 4))

    class Proj(nn.Module):
        @nn.compact
        def __call__(self, x):
            return layers.project(self, "q", x, w, ("embed",), ("mlp",), config)

    variables = nn.unbox(Proj().init(jax.random.key(2), x))["params"]
    np.testing.assert_array_equal(Proj().apply({"params": variables}, x), layers.dense(x, w))
    a, b = variables["q_lora_a"], jax.random.normal(jax.random.key(3), variables["q_lora_b"].shape)
    got = Proj().apply({"params": {**variables, "q_lora_b": b}}, x)
    want = layers.dense(x, w) + (x @ a @ b) * (config.lora_alpha / config.lora_rank)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
