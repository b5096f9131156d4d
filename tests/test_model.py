"""The policy: cached step forward against the full forward, config checks, sharding."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from replax import model as model_lib
from replax import sharding

TINY = model_lib.ModelConfig(
    vocab_size=64,
    num_layers=2,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    max_len=16,
)
VARIANTS = {
    "base": {},
    "qkv_bias": {"qkv_bias": True},
    "qk_norm": {"qk_norm": True},
    "untied": {"tie_embeddings": False},
}


def init_params(config, seed=0):
    """Random params, with every parameter (biases and norm scales too) perturbed."""
    dummy = jnp.zeros((1, 1), jnp.int32)
    params = nn.unbox(model_lib.Transformer(config).init(jax.random.key(seed), dummy, dummy))
    leaves, treedef = jax.tree_util.tree_flatten(params["params"])
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    leaves = [x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def left_padded_batch():
    """Two rows of 8 slots: one without padding, one with 3 pad slots on the left."""
    tokens = np.array([[5, 9, 2, 33, 17, 8, 60, 4], [0, 0, 0, 12, 7, 7, 41, 3]], dtype=np.int32)
    mask = tokens != 0
    mask[0] = True
    return jnp.asarray(tokens), jnp.asarray(mask)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_steps_match_full_forward(variant):
    config = dataclasses.replace(TINY, **VARIANTS[variant])
    model = model_lib.Transformer(config)
    params = init_params(config)
    tokens, mask = left_padded_batch()
    positions = model_lib.positions_from_mask(mask)
    full = model.apply({"params": params}, tokens, positions, mask)  # [B, T, V]

    # Prefill three slots, then one token per call, into a cache longer than the input.
    prefill = 3
    cache = model_lib.init_cache(config, 2, cache_len=12)
    kv_mask = jnp.concatenate([mask, jnp.ones((2, 4), bool)], axis=1)  # [B, 12]
    step = jax.jit(
        lambda p, t, pos, c, i: model.apply(
            {"params": p}, t, pos, cache=c, cache_index=i, kv_mask=kv_mask
        )
    )
    logits, cache = step(params, tokens[:, :prefill], positions[:, :prefill], cache, 0)
    cached = [logits]
    for i in range(prefill, tokens.shape[1]):
        logits, cache = step(params, tokens[:, i : i + 1], positions[:, i : i + 1], cache, i)
        cached.append(logits)
    cached = jnp.concatenate(cached, axis=1)

    valid = np.asarray(mask)  # padding queries attend to nothing: their logits are unused
    np.testing.assert_allclose(
        np.asarray(cached)[valid], np.asarray(full)[valid], rtol=1e-5, atol=1e-5
    )
    assert cache[0]["k"].shape == (2, config.num_kv_heads, 12, config.head_dim)


def test_left_padding_does_not_change_logits():
    params = init_params(TINY)
    model = model_lib.Transformer(TINY)
    tokens, mask = left_padded_batch()
    unpadded = tokens[1:, 3:]
    logits_padded = model.apply(
        {"params": params}, tokens[1:], model_lib.positions_from_mask(mask[1:]), mask[1:]
    )
    no_padding = jnp.ones(unpadded.shape, bool)
    logits = model.apply({"params": params}, unpadded, model_lib.positions_from_mask(no_padding))
    np.testing.assert_allclose(logits_padded[:, 3:], logits, rtol=1e-5, atol=1e-5)


def test_dense_is_the_contraction_of_the_trailing_axes():
    x = jax.random.normal(jax.random.key(0), (2, 3, 4, 5))
    w = jax.random.normal(jax.random.key(1), (4, 5, 6))
    np.testing.assert_allclose(
        model_lib.dense(x, w, in_dims=2), jnp.einsum("btkd,kde->bte", x, w), rtol=1e-5
    )
    np.testing.assert_allclose(
        model_lib.dense(x, w[0], in_dims=1), jnp.einsum("btkd,de->btke", x, w[0]), rtol=1e-5
    )


def test_swiglu_gradient_matches_autodiff_of_silu_times_up():
    gate, up, grad = jax.random.normal(jax.random.key(0), (3, 4, 16)) * 3
    plain = lambda g, u: jnp.sum(jax.nn.silu(g) * u * grad)
    fused = lambda g, u: jnp.sum(model_lib.swiglu(g, u) * grad)
    np.testing.assert_allclose(fused(gate, up), plain(gate, up), rtol=1e-6)
    for got, want in zip(jax.grad(fused, (0, 1))(gate, up), jax.grad(plain, (0, 1))(gate, up)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"num_heads": 4, "num_kv_heads": 3}, "num_kv_heads"),
        ({"dtype": "float64"}, "model.dtype"),
        ({"param_dtype": "int8"}, "model.param_dtype"),
        ({"d_model": 0}, "model.d_model"),
    ],
)
def test_invalid_config_raises(overrides, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **overrides)


def test_bfloat16_matches_float32_within_bfloat16_rounding():
    config = dataclasses.replace(TINY, dtype="bfloat16")
    params = init_params(TINY)  # float32 parameters, used by both
    tokens, mask = left_padded_batch()
    positions = model_lib.positions_from_mask(mask)
    want = model_lib.Transformer(TINY).apply({"params": params}, tokens, positions, mask)
    model = model_lib.Transformer(config)
    full = model.apply({"params": params}, tokens, positions, mask)
    cache = model_lib.init_cache(config, 2, cache_len=8)
    assert cache[0]["k"].dtype == jnp.bfloat16
    cached, _ = model.apply(
        {"params": params}, tokens, positions, cache=cache, cache_index=0, kv_mask=mask
    )
    valid = np.asarray(mask)  # padding queries attend to nothing: their logits are unused
    want = np.asarray(want)[valid]  # logits of about unit scale, up to ~4 here
    for logits in (full, cached):
        assert logits.dtype == jnp.float32
        got = np.asarray(logits)[valid]
        assert np.isfinite(got).all()
        # bfloat16 keeps 8 significant bits (relative rounding 2^-9 per operation); two
        # layers of it move these logits by a few hundredths, and do move them.
        np.testing.assert_allclose(got, want, atol=0.15)
        assert np.abs(got - want).max() > 1e-3


def test_sharded_params_and_forward_match_one_device():
    config = dataclasses.replace(TINY, qkv_bias=True, qk_norm=True)
    model = model_lib.Transformer(config)
    dummy = jnp.zeros((1, 1), jnp.int32)
    init = lambda rng: model.init(rng, dummy, dummy)  # noqa: E731
    rng = jax.random.key(0)
    params_1 = nn.unbox(jax.jit(init)(rng))["params"]

    mesh = sharding.make_mesh((2, 2, 2))
    rules = sharding.DEFAULT_RULES
    shardings = sharding.params_shardings(mesh, jax.eval_shape(init, rng), rules)
    with sharding.activation_rules(mesh, rules):
        params_8 = nn.unbox(jax.jit(init, out_shardings=shardings)(rng))["params"]

    # The shardings come from the logical axes: vocab -> tensor, embed -> fsdp, ...
    assert params_8["embedding"].sharding.spec == P("tensor", "fsdp")
    assert params_8["layer_0"]["attn"]["q"].sharding.spec == P("fsdp", "tensor", None)
    assert params_8["layer_0"]["attn"]["k_bias"].sharding.spec == P("tensor", None)
    assert params_8["layer_0"]["mlp"]["down"].sharding.spec == P("tensor", "fsdp")
    assert len(params_8["layer_0"]["mlp"]["up"].sharding.device_set) == 8
    for a, b in zip(jax.tree_util.tree_leaves(params_1), jax.tree_util.tree_leaves(params_8)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 64, (4, 8)), jnp.int32)
    mask = jnp.asarray(np.arange(8)[None, :] >= np.array([0, 2, 0, 5])[:, None])
    positions = model_lib.positions_from_mask(mask)
    forward = lambda p, t, pos, m: model.apply({"params": p}, t, pos, m)  # noqa: E731
    logits_1 = jax.jit(forward)(params_1, tokens, positions, mask)
    batch = sharding.named(mesh, ("batch", None), rules)
    with sharding.activation_rules(mesh, rules):
        logits_8 = jax.jit(
            forward,
            in_shardings=(shardings["params"], batch, batch, batch),
            out_shardings=sharding.named(mesh, ("batch", None, "vocab"), rules),
        )(params_8, tokens, positions, mask)
    assert logits_8.sharding.spec == P(("data", "fsdp"), None, "tensor")
    np.testing.assert_allclose(np.asarray(logits_8), np.asarray(logits_1), rtol=1e-5, atol=1e-5)


def test_mesh_shape_must_match_device_count():
    with pytest.raises(ValueError, match="mesh.shape"):
        sharding.validate_mesh_shape((2, 2, 1), 8)
    with pytest.raises(ValueError, match="mesh.shape"):
        sharding.make_mesh((3, -1, 1))
    assert sharding.validate_mesh_shape((2, -1, 2), 8) == (2, 2, 2)


def test_unknown_axes_in_rules_raise():
    with pytest.raises(ValueError, match="unknown logical axis 'sequence'"):
        sharding.validate_rules([("sequence", "data")])
    with pytest.raises(ValueError, match="unknown mesh axis 'model'"):
        sharding.validate_rules([("heads", "model")])
