"""The policy: cached step forward against the full forward, config checks, sharding,
and the layouts and kernels that must compute the same function (scan vs unrolled, remat
policies, attention kernels)."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY
from jax.sharding import PartitionSpec as P

from replax.core import sharding
from replax.model import layers
from replax.model import transformer as model_lib

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


def test_sharded_scanned_params_carry_the_layers_axis():
    config = dataclasses.replace(TINY, qkv_bias=True, scan_layers=True)
    dummy = jnp.zeros((1, 1), jnp.int32)
    abstract = jax.eval_shape(
        lambda: model_lib.Transformer(config).init(jax.random.key(0), dummy, dummy)
    )
    q = abstract["params"]["layers"]["attn"]["q"]
    assert q.names == ("layers", "embed", "heads", "head_dim") and q.value.shape == (2, 32, 4, 8)
    mesh = sharding.make_mesh((2, 2, 2))
    shardings = sharding.params_shardings(mesh, abstract, sharding.DEFAULT_RULES)["params"]
    assert shardings["layers"]["attn"]["q"].spec == P(None, "fsdp", "tensor", None)
    assert shardings["layers"]["mlp"]["down"].spec == P(None, "tensor", "fsdp")
    assert model_lib.cache_axes(config) == ("layers", *model_lib.CACHE_AXES)


# ---------------------------------------------------------------------------------------
# Layouts, remat and attention kernels: the same function as the default model.


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hidden_states_times_output_head_are_the_logits(scan_layers, dtype):
    for variant in ("base", "untied"):
        config = dataclasses.replace(
            TINY, dtype=dtype, scan_layers=scan_layers, **VARIANTS[variant]
        )
        params = init_params(config)
        tokens, mask = left_padded_batch()
        positions = model_lib.positions_from_mask(mask)
        model = model_lib.Transformer(config)
        logits = model.apply({"params": params}, tokens, positions, mask)
        hidden = model.apply({"params": params}, tokens, positions, mask, return_hidden=True)
        head = model_lib.output_head(params, config)
        assert hidden.shape == (2, 8, 32) and hidden.dtype == config.jnp_dtype
        assert head.shape == (32, 64) and head.dtype == config.jnp_dtype
        rebuilt = layers.dense(hidden, head).astype(jnp.float32)
        np.testing.assert_array_equal(np.asarray(rebuilt), np.asarray(logits))


def test_stack_and_unstack_layers_convert_between_layouts():
    params = init_params(TINY)
    stacked = model_lib.stack_layers(params, 2)
    assert "layer_0" not in stacked and stacked["embedding"] is params["embedding"]
    assert stacked["layers"]["mlp"]["up"].shape == (2, 32, 64)
    np.testing.assert_array_equal(stacked["layers"]["mlp"]["up"][1], params["layer_1"]["mlp"]["up"])
    back = model_lib.unstack_layers(stacked, 2)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(a, b)
    host = jax.tree_util.tree_map(np.asarray, params)  # numpy leaves stay numpy
    assert isinstance(model_lib.stack_layers(host, 2)["layers"]["attn"]["q"], np.ndarray)
    with pytest.raises(ValueError, match="layer_0..layer_2"):
        model_lib.stack_layers(params, 3)
    with pytest.raises(ValueError, match=r"expected \[3, ...\]"):
        model_lib.unstack_layers(stacked, 3)


def _loss_and_grads(config, params):
    """Logits and gradients of a loss that weighs every vocabulary entry differently."""
    tokens, mask = left_padded_batch()
    positions = model_lib.positions_from_mask(mask)
    model = model_lib.Transformer(config)

    def loss(p):
        logits = model.apply({"params": p}, tokens, positions, mask)
        return jnp.sum(jax.nn.log_softmax(logits) * jnp.linspace(-1, 1, 64)), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    if config.scan_layers:
        grads = model_lib.unstack_layers(grads, config.num_layers)
    return logits, grads


def _assert_trees_close(a, b, tol=1e-5):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


@pytest.mark.parametrize("remat_policy", list(model_lib.REMAT_POLICIES))
@pytest.mark.parametrize("scan_layers", [False, True])
def test_scan_and_remat_give_the_logits_and_gradients_of_the_unrolled_model(
    scan_layers, remat_policy
):
    config = dataclasses.replace(TINY, qkv_bias=True, qk_norm=True)
    params = init_params(config)
    want_logits, want_grads = _loss_and_grads(config, params)
    changed = dataclasses.replace(config, scan_layers=scan_layers, remat_policy=remat_policy)
    logits, grads = _loss_and_grads(
        changed, model_lib.stack_layers(params, 2) if scan_layers else params
    )
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want_logits), rtol=1e-5, atol=1e-5)
    _assert_trees_close(grads, want_grads)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_dot_product_attention_matches_einsum_full_and_cached(scan_layers):
    config = dataclasses.replace(TINY, qkv_bias=True)
    params = init_params(config)
    want_logits, want_grads = _loss_and_grads(config, params)
    changed = dataclasses.replace(config, scan_layers=scan_layers, attention="dot_product")
    if scan_layers:
        params = model_lib.stack_layers(params, 2)
    logits, grads = _loss_and_grads(changed, params)
    valid = np.asarray(left_padded_batch()[1])
    np.testing.assert_allclose(
        np.asarray(logits)[valid], np.asarray(want_logits)[valid], rtol=1e-5, atol=1e-5
    )
    _assert_trees_close(grads, want_grads)

    # The step forward: prefill 3 slots of a 12-slot cache, then one token per call.
    tokens, mask = left_padded_batch()
    positions = model_lib.positions_from_mask(mask)
    cache = model_lib.init_cache(changed, 2, cache_len=12)
    kv_mask = jnp.concatenate([mask, jnp.ones((2, 4), bool)], axis=1)  # [B, 12]
    step = jax.jit(
        lambda c, t, pos, i: model_lib.Transformer(changed).apply(
            {"params": params}, t, pos, cache=c, cache_index=i, kv_mask=kv_mask
        )
    )
    logits, cache = step(cache, tokens[:, :3], positions[:, :3], 0)
    cached = [logits]
    for i in range(3, 8):
        logits, cache = step(cache, tokens[:, i : i + 1], positions[:, i : i + 1], i)
        cached.append(logits)
    cached = np.asarray(jnp.concatenate(cached, axis=1))
    np.testing.assert_allclose(cached[valid], np.asarray(want_logits)[valid], rtol=1e-5, atol=1e-5)
    if scan_layers:  # one stacked cache: [L, B, KV, S, D]
        assert set(cache) == {"k", "v"} and cache["k"].shape == (2, 2, 2, 12, 8)
    else:
        assert len(cache) == 2 and cache[0]["k"].shape == (2, 2, 12, 8)


def test_scanned_cached_steps_match_full_forward_with_einsum():
    config = dataclasses.replace(TINY, qk_norm=True, scan_layers=True)
    params = init_params(config)
    model = model_lib.Transformer(config)
    tokens, mask = left_padded_batch()
    positions = model_lib.positions_from_mask(mask)
    full = model.apply({"params": params}, tokens, positions, mask)
    cache = model_lib.init_cache(config, 2, cache_len=8)
    cached, cache = model.apply(
        {"params": params}, tokens, positions, cache=cache, cache_index=0, kv_mask=mask
    )
    valid = np.asarray(mask)
    np.testing.assert_allclose(
        np.asarray(cached)[valid], np.asarray(full)[valid], rtol=1e-5, atol=1e-5
    )


def test_mixed_precision_computes_in_bfloat16_in_every_layout():
    base = dataclasses.replace(TINY, param_dtype="float32", dtype="bfloat16")
    params = init_params(base)  # float32 parameters
    tokens, mask = left_padded_batch()
    positions = model_lib.positions_from_mask(mask)
    want = model_lib.Transformer(base).apply({"params": params}, tokens, positions, mask)
    config = dataclasses.replace(
        base, scan_layers=True, remat_policy="save_dots", attention="dot_product"
    )
    model = model_lib.Transformer(config)
    stacked = model_lib.stack_layers(params, 2)
    hidden = model.apply({"params": stacked}, tokens, positions, mask, return_hidden=True)
    assert hidden.dtype == jnp.bfloat16
    got = model.apply({"params": stacked}, tokens, positions, mask)
    valid = np.asarray(mask)
    # bfloat16 both, rounded in a different order (float32 scores in dot_product): a few
    # bfloat16 steps apart, as in test_bfloat16_matches_float32_within_bfloat16_rounding.
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], atol=0.15)
    jaxpr = str(
        jax.make_jaxpr(lambda p: model.apply({"params": p}, tokens, positions, mask))(stacked)
    )
    assert "bf16[" in jaxpr and "dot_general" in jaxpr


@pytest.mark.parametrize(
    "field, value", [("remat_policy", "x"), ("attention", "flash"), ("scan_layers", 1)]
)
def test_invalid_layout_and_kernel_options_raise_one_line(field, value):
    with pytest.raises(ValueError, match=f"model.{field}={value!r}: allowed are") as error:
        dataclasses.replace(TINY, **{field: value})
    assert "\n" not in str(error.value)


def test_splash_is_refused_off_tpu():
    # A run's checks refuse it (tests/config/test_build.py runs them on a config); the
    # model itself, traced off a TPU, runs the kernel in the Pallas interpreter.
    config = dataclasses.replace(TINY, attention="splash")
    with pytest.raises(ValueError, match="model.attention='splash' needs a TPU"):
        model_lib.check_attention_backend(config, "cpu")
    model_lib.check_attention_backend(config, "tpu")
    model_lib.check_attention_backend(TINY, "cpu")


def test_splash_attention_in_the_pallas_interpreter_matches_einsum():
    # The TPU kernel run by the Pallas interpreter on CPU (slow: one scanned layer, one
    # 128-token block). Valid queries must see exactly what the [B, T, T] mask allows.
    config = dataclasses.replace(TINY, scan_layers=True, qkv_bias=True)
    params = init_params(config)
    tokens, mask = left_padded_batch()
    positions = model_lib.positions_from_mask(mask)
    want = model_lib.Transformer(config).apply({"params": params}, tokens, positions, mask)
    splash = dataclasses.replace(config, attention="splash")
    got = jax.jit(
        lambda p: model_lib.Transformer(splash).apply({"params": p}, tokens, positions, mask)
    )(params)
    valid = np.asarray(mask)
    np.testing.assert_allclose(
        np.asarray(got)[valid], np.asarray(want)[valid], rtol=1e-5, atol=1e-5
    )


def test_swiglu_keeps_one_mlp_activation_a_layer_fewer_for_the_backward(monkeypatch):
    # The reason the custom VJP exists: silu(gate) * up under autodiff stores an extra
    # [B, T, mlp] intermediate per layer for the backward pass. Compared as a slope over
    # depth (the last layer's is freed at once either way).
    batch, length = 8, 64
    tokens = jnp.ones((batch, length), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(length), (batch, length))

    def temp_bytes(num_layers):
        config = dataclasses.replace(TINY, num_layers=num_layers, mlp_dim=256, max_len=length)
        model = model_lib.Transformer(config)
        loss = lambda p: jnp.sum(model.apply({"params": p}, tokens, positions) ** 2)
        compiled = jax.jit(jax.grad(loss)).lower(init_params(config)).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    fused = {layers: temp_bytes(layers) for layers in (2, 4)}
    monkeypatch.setattr(layers, "swiglu", lambda g, u: jax.nn.silu(g) * u)
    plain = {layers: temp_bytes(layers) for layers in (2, 4)}
    saved_per_layer = ((plain[4] - fused[4]) - (plain[2] - fused[2])) / 2
    assert saved_per_layer >= batch * length * 256 * 4, (plain, fused)  # one f32 activation


def test_scanned_decode_with_per_row_slots_matches_unrolled():
    # The rollout engine's step: each row writes at its own slot (cache_index int32[B]).
    # The scanned decoder carries the whole [L, ...] cache and writes one layer's slots
    # at a time; it must give the unrolled decoder's logits and cache, row by row.
    config = dataclasses.replace(TINY, qkv_bias=True)
    params = init_params(config)
    scanned = dataclasses.replace(config, scan_layers=True)
    stacked = model_lib.stack_layers(params, 2)
    rng = np.random.default_rng(0)
    cache = [
        {n: jnp.asarray(rng.normal(size=(2, 2, 12, 8)), jnp.float32) for n in ("k", "v")}
        for _ in range(2)
    ]
    stacked_cache = {n: jnp.stack([c[n] for c in cache]) for n in ("k", "v")}
    tokens = jnp.asarray([[5], [9]], jnp.int32)
    slots = jnp.asarray([3, 7], jnp.int32)
    kv_mask = jnp.arange(12)[None] <= slots[:, None]

    def step(cfg, p, c):
        return model_lib.Transformer(cfg).apply(
            {"params": p}, tokens, slots[:, None], cache=c, cache_index=slots, kv_mask=kv_mask
        )

    want_logits, want_cache = jax.jit(step, static_argnums=0)(config, params, cache)
    logits, new_cache = jax.jit(step, static_argnums=0)(scanned, stacked, stacked_cache)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want_logits), rtol=1e-5, atol=1e-5)
    for layer in range(2):
        for n in ("k", "v"):
            np.testing.assert_allclose(
                np.asarray(new_cache[n][layer]), np.asarray(want_cache[layer][n]), atol=1e-6
            )
    # Only the rows' own slots changed.
    changed = np.asarray(new_cache["k"] != stacked_cache["k"]).any(axis=(2, 4))  # [L, B, S]
    assert changed[:, 0].nonzero()[1].tolist() == [3, 3] and changed[:, 1].nonzero()[
        1
    ].tolist() == [7, 7]
