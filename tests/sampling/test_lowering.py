"""Tests for replax/sampling/lowering.py: the decode program and the prefill lowered from
abstract inputs on a mesh, compiled and run, give what the sampler's own call gives."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_sampler import CONFIG, make, params, prompts  # noqa: F401 - the params fixture

from replax.core import sharding
from replax.model import attention
from replax.model import transformer as model_lib
from replax.sampling import decode as decode_lib
from replax.sampling import lowering


def _sampler():
    mesh = sharding.make_mesh((4, 1, 2))
    return make(mesh=mesh, rules=sharding.DEFAULT_RULES, temperature=0.0)


def _abstract(params):  # noqa: F811 - the fixture's value
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)


def test_the_lowered_decode_program_computes_what_generate_does(params):  # noqa: F811
    sampler = _sampler()
    ids, mask = prompts()
    key = jax.random.key(5)
    abstract = _abstract(params)
    args = lowering.abstract_inputs(sampler, 4, abstract)
    assert [a.shape for a in args[1:3]] == [ids.shape, mask.shape]
    compiled = lowering.lower(sampler, abstract, 4, num_samples=2).compile()
    placed = [
        jax.device_put(x, a.sharding) for x, a in zip((ids, mask, key, np.int32(0)), args[1:])
    ]
    got = compiled(sampler.prepare_params(params), *placed)
    want = sampler.generate(params, ids, mask, key, num_samples=2)
    for name in ("tokens", "mask", "logprobs"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)


def test_the_lowered_prefill_fills_the_cache_the_decode_loop_starts_from(params):  # noqa: F811
    sampler = _sampler()
    ids, mask = prompts()
    compiled = lowering.lower_prefill(sampler, _abstract(params), 4, num_samples=1).compile()
    got = compiled(sampler.prepare_params(params), jnp.asarray(ids), jnp.asarray(mask))
    want = decode_lib.prefill_prompts(
        sampler.prepare_params(params),
        jnp.asarray(ids),
        jnp.asarray(mask),
        model=sampler.model,
        max_new_tokens=sampler.max_new_tokens,
        cache_dtype=sampler._cache_dtype,
        num_samples=1,
        data_shards=sampler.data_shards,
    )
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


def test_without_a_mesh_there_is_nothing_to_lower_for():
    with pytest.raises(ValueError, match="no mesh"):
        lowering.abstract_inputs(make(), 4, {})


def test_the_decode_head_is_split_by_vocabulary_over_the_whole_mesh(params, monkeypatch):  # noqa: F811
    # Training splits the output head over the embedding (fsdp), which a decode step would
    # gather whole into every device each step (on a TPU slice, the largest item of a
    # real config's step). decode_head lays it out by vocabulary over every mesh axis, once
    # a generation; a vocabulary that does not divide keeps the training layout.
    monkeypatch.setattr(attention, "target_platform", lambda: "tpu")  # CPU keeps it whole
    mesh = sharding.make_mesh((2, 4, 1))
    placed = jax.device_put(params, sharding.params_shardings(mesh, params, sharding.DEFAULT_RULES))
    with sharding.activation_rules(mesh, sharding.DEFAULT_RULES):
        head = jax.jit(lambda p: decode_lib.decode_head(p, CONFIG))(placed)
        odd = dataclasses.replace(CONFIG, vocab_size=60)
        cut = jax.tree_util.tree_map(lambda x: x, dict(placed, embedding=placed["embedding"][:60]))
        kept = jax.jit(lambda p: decode_lib.decode_head(p, odd))(cut)
    assert head.shape == (CONFIG.d_model, CONFIG.vocab_size)
    assert head.sharding.spec == jax.sharding.PartitionSpec(None, ("data", "fsdp"))
    assert head.sharding.shard_shape(head.shape) == (CONFIG.d_model, CONFIG.vocab_size // 8)
    np.testing.assert_array_equal(np.asarray(head), np.asarray(params["embedding"]).T)
    assert kept.sharding.shard_shape(kept.shape)[1] == 60


def test_on_a_tensor_parallel_mesh_the_step_logits_are_split_by_rows(params, monkeypatch):  # noqa: F811
    # The logical batch is not split over a tensor axis: without a row split over every
    # axis each tensor-parallel device would hold (and sort, for top-p) all rows' V
    # logits, on a real config more HBM traffic than the rest of a decode step.
    monkeypatch.setattr(attention, "target_platform", lambda: "tpu")  # CPU keeps it whole
    mesh = sharding.make_mesh((4, 1, 2))  # tensor 2: the tiny model has 2 key-value heads
    model = make(mesh=mesh, rules=sharding.DEFAULT_RULES).model
    placed = jax.device_put(params, sharding.params_shardings(mesh, params, sharding.DEFAULT_RULES))
    tokens = jnp.arange(16, dtype=jnp.int32).reshape(16, 1) % CONFIG.vocab_size
    positions = jnp.zeros((16, 1), jnp.int32)

    def logits(p, rows):
        head = decode_lib.decode_head(p, CONFIG)
        cache = model_lib.init_cache(CONFIG, rows, 4)
        kv_mask = jnp.ones((rows, 4), bool)
        return decode_lib.step_logits(
            model,
            p,
            head,
            tokens[:rows],
            positions[:rows],
            cache=cache,
            cache_index=0,
            kv_mask=kv_mask,
        )[0]

    with sharding.activation_rules(mesh, sharding.DEFAULT_RULES):
        split = jax.jit(lambda p: logits(p, 16))(placed)
        odd = jax.jit(lambda p: logits(p, 12))(placed)  # 12 rows: not over all 8
    assert split.sharding.shard_shape(split.shape) == (2, 1, CONFIG.vocab_size)
    assert odd.sharding.shard_shape(odd.shape) == (3, 1, CONFIG.vocab_size)  # the batch's
    want = np.asarray(model.apply({"params": params}, tokens, positions))  # a full forward
    np.testing.assert_allclose(np.asarray(split), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(odd), want[:12], rtol=1e-5, atol=1e-5)
