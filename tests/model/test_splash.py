"""Splash attention on a mesh: the Pallas kernel (in its interpreter on CPU) under
`shard_map`, against the dot_product kernel, for the attention alone, the model's logits
and the sampler's prefill, on 4 simulated devices with rows and heads sharded."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from replax.core import sharding
from replax.model import attention
from replax.model import transformer as model_lib
from replax.model.config import ModelConfig
from replax.sampling import decode

# Rows over data x fsdp, heads over tensor: every way the rules split the kernel's inputs.
MESH_SHAPE = (1, 2, 2)


@pytest.fixture
def mesh():
    return sharding.make_mesh(MESH_SHAPE, devices=jax.devices()[:4])


def rules():
    return sharding.validate_rules(sharding.DEFAULT_RULES)


def test_splash_specs_follow_the_rules(mesh):
    q, kv, mask = attention.splash_specs(mesh, rules(), num_heads=4, num_kv_heads=2)
    assert q == P(("data", "fsdp"), None, "tensor", None)
    assert kv == P(("data", "fsdp"), "tensor", None, None)
    assert mask == P(("data", "fsdp"), None)
    # One kv head cannot be split two ways: heads stay whole, rows still split.
    q, kv, _ = attention.splash_specs(mesh, rules(), num_heads=4, num_kv_heads=1)
    assert q == P(("data", "fsdp"), None, None, None) and kv[1] is None


def test_block_size_is_the_largest_that_divides():
    assert [attention.splash_block_size(n) for n in (128, 256, 384, 512, 1024, 640)] == [
        128,
        256,
        128,
        512,
        512,
        128,
    ]


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_sharded_splash_matches_dot_product(mesh, kv_heads):
    b, t, h, d = 4, 20, 4, 16
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(b, kv_heads, t, d)), jnp.float32) for _ in range(2))
    lengths = np.array([20, 13, 1, 7])
    token_mask = jnp.asarray(np.arange(t)[None] >= t - lengths[:, None])  # left-padded
    causal = jnp.tril(jnp.ones((t, t), bool))
    with sharding.activation_rules(mesh, rules()):
        got = jax.jit(lambda *a: attention.splash_attention(*a, interpret=True))(
            q, k, v, token_mask
        )
    want = attention.dot_product_attention(q, k, v, causal[None] & token_mask[:, None, :])
    valid = np.asarray(token_mask)
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], atol=1e-5)


def tiny(attention_kind: str, scan: bool) -> ModelConfig:
    return ModelConfig(
        vocab_size=64,
        num_layers=2,
        d_model=32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        mlp_dim=64,
        max_len=48,
        attention=attention_kind,
        scan_layers=scan,
    )


def sharded_params(config, mesh):
    model = model_lib.Transformer(config)
    dummy = jnp.zeros((1, 4), jnp.int32)
    variables = model.init(jax.random.key(3), dummy, dummy)
    shardings = sharding.params_shardings(mesh, variables, rules())
    import flax.linen as nn

    return jax.device_put(nn.unbox(variables), nn.unbox(shardings))


@pytest.mark.parametrize("scan", [False, True])
def test_model_logits_with_splash_match_dot_product(mesh, scan):
    base = tiny("dot_product", scan)
    variables = sharded_params(base, mesh)
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(0, 64, size=(4, 24)), jnp.int32)
    mask = jnp.asarray(np.arange(24)[None] >= np.array([0, 5, 11, 20])[:, None])
    positions = model_lib.positions_from_mask(mask)

    def logits(config):
        model = model_lib.Transformer(config)
        with sharding.activation_rules(mesh, rules()):
            return jax.jit(lambda v, x, p, m: model.apply(v, x, p, m))(
                variables, tokens, positions, mask
            )

    got, want = logits(dataclasses.replace(base, attention="splash")), logits(base)
    valid = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], atol=1e-5)


def test_prefill_with_splash_fills_the_same_cache(mesh):
    base = tiny("dot_product", scan=True)
    variables = sharded_params(base, mesh)
    rng = np.random.default_rng(2)
    prompt_ids = jnp.asarray(rng.integers(0, 64, size=(4, 12)), jnp.int32)
    prompt_mask = jnp.asarray(np.arange(12)[None] >= np.array([0, 3, 8, 10])[:, None])
    positions = model_lib.positions_from_mask(prompt_mask)
    kv_mask = jnp.concatenate([prompt_mask, jnp.ones((4, 8), bool)], axis=1)

    def cache(config):
        model = model_lib.Transformer(config)
        prefill = lambda v, ids, pos, kv: decode._prefill(
            v,
            ids,
            pos,
            kv,
            model=model,
            cache_len=20,
            cache_dtype=None,
            num_samples=2,
            data_shards=2,
        )
        with sharding.activation_rules(mesh, rules()):
            return jax.jit(prefill)(variables, prompt_ids, positions, kv_mask)

    got, want = cache(dataclasses.replace(base, attention="splash")), cache(base)
    # Keys and values of valid prompt slots (the others are masked out when read).
    valid = np.repeat(np.asarray(prompt_mask[:, :-1]), 2, axis=0)  # [R, P - 1]
    for name in ("k", "v"):
        g = np.asarray(got[name])[:, :, :, :11]  # [L, R, KV, P - 1, D]
        w = np.asarray(want[name])[:, :, :, :11]
        np.testing.assert_allclose(
            g.transpose(1, 3, 0, 2, 4)[valid], w.transpose(1, 3, 0, 2, 4)[valid], atol=1e-5
        )
