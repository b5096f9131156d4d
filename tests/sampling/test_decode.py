"""Tests for replax/sampling/decode.py's own functions, called directly: the loop's
segments, the valid cache slots, the prefill's cache (against the prompts fed one token
at a time), a decode over two segments of a growing KV cache against the model's full
forward without a cache, rows that stop at their first stop token, and row blocks that
draw the whole batch's random numbers. (tests/sampling/test_sampler.py checks the jitted
sampler over one segment: filters, left padding, meshes, compilations.)"""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY, numpy_params

from replax.core import sharding
from replax.model import transformer as model_lib
from replax.sampling import decode as decode_lib
from replax.sampling.distributions import SamplingConfig

# TINY with room for a prompt of 6 and 20 new tokens: a loop of two segments (16, 20).
CONFIG = dataclasses.replace(TINY, max_len=32)
MODEL = model_lib.Transformer(CONFIG)
PROMPT_LEN, NEW_TOKENS = 6, 20
# The tests that need no second segment decode fewer tokens: a smaller program to compile.
SHORT = 8
# Ids >= 60 are never sampled: 63 as the stop token lets every row run the whole loop,
# and pad 61 cannot be mistaken for a generated token.
VOCAB, UNREACHABLE_STOP, PAD = 60, 63, 61
GREEDY = SamplingConfig(temperature=0.0)


def random_params(seed):
    return numpy_params(MODEL, seed, scale=0.3)


@pytest.fixture(scope="module")
def params():
    return random_params(0)


def prompts(lengths=(6, 4, 2)):
    """Left-padded prompts of the given lengths (ids 1..59), padding 0."""
    lengths = np.asarray(lengths)
    mask = np.arange(PROMPT_LEN)[None, :] >= PROMPT_LEN - lengths[:, None]
    ids = np.random.default_rng(len(lengths)).integers(1, VOCAB, (len(lengths), PROMPT_LEN))
    return np.where(mask, ids, 0).astype(np.int32), mask


@functools.cache
def jitted_decode(stop_ids, max_new_tokens=NEW_TOKENS):
    decode = functools.partial(
        decode_lib.decode,
        model=MODEL,
        max_new_tokens=max_new_tokens,
        stop_ids=stop_ids,
        pad_id=PAD,
        vocab_size=VOCAB,
        cache_dtype=None,
        data_shards=1,
    )
    return jax.jit(decode, static_argnums=(5, 6, 7))


@jax.jit
def full_forward(params, ids, mask):
    positions = model_lib.positions_from_mask(mask)
    return MODEL.apply({"params": params}, ids, positions, mask)


def reference_logprobs(params, prompt_ids, prompt_mask, completion, temperature=1.0):
    """float64 [R, N, V]: log-softmax over ids < VOCAB of the full forward's logits (no
    cache) / temperature predicting each completion token from the prompt and the
    completion before it."""
    ids = np.concatenate([prompt_ids, completion], axis=1)
    mask = np.concatenate([prompt_mask, np.ones(completion.shape, bool)], axis=1)
    logits = np.asarray(full_forward(params, ids, mask), np.float64)[:, PROMPT_LEN - 1 : -1]
    logits = logits[..., :VOCAB] / temperature
    logits -= logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def at(x, tokens):
    return np.take_along_axis(x, tokens[..., None], axis=-1)[..., 0]


# ---------------------------------------------------------------- segments and slots


def reference_segment_ends(num_steps):
    """At most 4 segments of equal length, at least 16 steps each; the last one ends at
    num_steps (and may be shorter)."""
    length = max(16, -(-num_steps // 4))
    ends, end = [], length
    while end < num_steps:
        ends.append(end)
        end += length
    return tuple(ends) + (num_steps,)


def test_segment_ends():
    assert decode_lib._segment_ends(64) == (16, 32, 48, 64)
    assert decode_lib._segment_ends(20) == (16, 20)
    assert decode_lib._segment_ends(100) == (25, 50, 75, 100)
    for n in range(1, 300):
        ends = decode_lib._segment_ends(n)
        assert ends == reference_segment_ends(n), n
        assert ends[-1] == n and 1 <= len(ends) <= 4
        lengths = np.diff((0,) + ends)
        assert (lengths > 0).all() and (lengths[:-1] >= 16).all()
        assert len(set(lengths[:-1])) <= 1  # equal segments but the last
        assert len(ends) == 1 or n > 16


def test_kv_mask_is_the_prompt_mask_then_every_completion_slot():
    _, mask = prompts()
    kv_mask = np.asarray(decode_lib._kv_mask(mask, NEW_TOKENS))
    assert kv_mask.shape == (3, PROMPT_LEN + NEW_TOKENS - 1)
    np.testing.assert_array_equal(kv_mask[:, :PROMPT_LEN], mask)
    assert kv_mask[:, PROMPT_LEN:].all()


# ---------------------------------------------------------------- prefill


@functools.partial(jax.jit, static_argnames=("num_samples", "data_shards"))
def prefill(params, ids, mask, *, num_samples, data_shards):
    return decode_lib.prefill_prompts(
        params,
        ids,
        mask,
        model=MODEL,
        max_new_tokens=NEW_TOKENS,
        cache_dtype=None,
        num_samples=num_samples,
        data_shards=data_shards,
    )


@jax.jit
def feed_one(params, cache, token, position, slot, kv_mask):
    """The model fed one token per row at cache slot `slot`: its updated cache."""
    _, cache = MODEL.apply(
        {"params": params},
        token[:, None],
        position[:, None],
        cache=cache,
        cache_index=slot,
        kv_mask=kv_mask,
    )
    return cache


def test_prefill_holds_each_prompts_keys_repeated_for_its_samples(params):
    ids, mask = prompts((6, 4))
    first_length = PROMPT_LEN - 1 + 16  # the first segment's slots
    cache = prefill(params, ids, mask, num_samples=3, data_shards=1)
    assert len(cache) == CONFIG.num_layers
    # Reference: the prompt tokens fed one at a time into an empty cache.
    kv_mask = np.asarray(decode_lib._kv_mask(mask, NEW_TOKENS))[:, :first_length]
    positions = np.asarray(model_lib.positions_from_mask(mask))
    reference = model_lib.init_cache(CONFIG, 2, first_length)
    for slot in range(PROMPT_LEN - 1):
        reference = feed_one(
            params, reference, ids[:, slot], positions[:, slot], jnp.int32(slot), kv_mask
        )
    for layer, reference_layer in zip(cache, reference):
        for name in ("k", "v"):
            got, want = np.asarray(layer[name]), np.asarray(reference_layer[name])
            assert got.shape == (6, CONFIG.num_kv_heads, first_length, CONFIG.head_dim)
            # Rows of one prompt are consecutive copies of its cache.
            np.testing.assert_array_equal(got, np.repeat(got[::3], 3, axis=0))
            # The prompt's own slots (not its padding) are those of the fed tokens; the
            # last prompt token and the completion's slots are not written yet.
            valid = mask[:, : PROMPT_LEN - 1]  # [B, P - 1]
            for row in range(2):
                slots = np.flatnonzero(valid[row])
                np.testing.assert_allclose(
                    got[3 * row][:, slots], want[row][:, slots], rtol=1e-5, atol=1e-6
                )
            assert (got[:, :, PROMPT_LEN - 1 :] == 0).all()


def test_a_one_token_prompt_prefills_nothing():
    ids = np.array([[5], [7]], np.int32)
    cache = decode_lib.prefill_prompts(
        None,  # never read: there is nothing to prefill
        ids,
        np.ones((2, 1), bool),
        model=MODEL,
        max_new_tokens=40,
        cache_dtype=None,
        num_samples=2,
        data_shards=1,
    )
    for layer in cache:
        for x in layer.values():  # [R, KV, first segment of 16 steps + P - 1 = 16, D]
            assert x.shape == (4, CONFIG.num_kv_heads, 16, CONFIG.head_dim)
            assert not np.asarray(x).any()


# ---------------------------------------------------------------- the decode loop


@pytest.fixture(scope="module")
def greedy(params):
    """Greedy decode of 3 prompts over both segments, no row stopping."""
    ids, mask = prompts()
    out = jitted_decode((UNREACHABLE_STOP,))(params, ids, mask, jax.random.key(0), 0, GREEDY, 1)
    return ids, mask, jax.device_get(out)


def test_greedy_decode_over_two_segments_is_the_full_forward_argmax(params, greedy):
    ids, mask, out = greedy
    tokens = np.asarray(out.tokens)
    assert tokens.shape == (3, NEW_TOKENS) and tokens.dtype == np.int32
    assert out.mask.all() and (out.lengths == NEW_TOKENS).all()
    assert (tokens < VOCAB).all()  # the ids past the vocabulary are never sampled
    logprobs = reference_logprobs(params, ids, mask, tokens)  # [3, N, V]
    # Every step, in both segments (steps 0-15 and 16-19), picks the argmax of the
    # model's own next-token distribution given the prompt and the tokens before it,
    # and reports its log-probability.
    np.testing.assert_array_equal(tokens, logprobs.argmax(-1))
    np.testing.assert_allclose(out.logprobs, at(logprobs, tokens), rtol=1e-4, atol=1e-4)
    assert len({tuple(row) for row in tokens}) == 3  # the prompts lead different ways


def test_rows_stop_at_their_first_stop_token_and_the_rest_is_pad(params, greedy):
    """Stop tokens taken from the greedy completions: each row stops where the first of
    them occurs in its completion (EOS included), before the last step, so the loop ends
    early with every row done; before it the completion is the greedy one."""
    ids, mask, full = greedy
    full_tokens = np.asarray(full.tokens)[:, :SHORT]
    full_logprobs = np.asarray(full.logprobs)[:, :SHORT]
    stop_ids = tuple(
        sorted({int(full_tokens[0, 5]), int(full_tokens[1, 3]), int(full_tokens[2, 6])})
    )
    is_stop = np.isin(full_tokens, stop_ids)
    assert is_stop.any(axis=1).all()
    first = is_stop.argmax(axis=1)  # [3] step of each row's first stop token
    assert first.max() < SHORT - 1 and first.min() < first.max()  # before the end, apart
    out = jitted_decode(stop_ids, SHORT)(params, ids, mask, jax.random.key(0), 0, GREEDY, 1)
    expected_mask = np.arange(SHORT)[None, :] <= first[:, None]
    np.testing.assert_array_equal(out.mask, expected_mask)
    np.testing.assert_array_equal(out.lengths, first + 1)
    np.testing.assert_array_equal(out.tokens, np.where(expected_mask, full_tokens, PAD))
    np.testing.assert_allclose(
        out.logprobs, np.where(expected_mask, full_logprobs, 0.0), rtol=1e-5, atol=1e-6
    )
    assert (np.asarray(out.logprobs)[~expected_mask] == 0).all()


def test_row_blocks_draw_the_whole_batchs_random_numbers(params):
    """4 prompts x 2 samples at temperature 1 decoded as one batch of 8 rows, then as two
    blocks of 2 prompts (row_block (0, 2) and (1, 2)): each block's rows, tokens and
    behaviour log-probs, are those rows of the whole batch."""
    ids, mask = prompts((6, 3, 5, 1))
    decode = jitted_decode((UNREACHABLE_STOP,), SHORT)
    sampled = SamplingConfig(temperature=1.0)
    whole = jax.device_get(decode(params, ids, mask, jax.random.key(3), 0, sampled, 2))
    assert whole.tokens.shape == (8, SHORT)
    for block in range(2):
        rows = slice(4 * block, 4 * block + 4)
        part = decode(
            params, ids[2 * block : 2 * block + 2], mask[2 * block : 2 * block + 2],
            jax.random.key(3), 0, sampled, 2, (block, 2),
        )  # fmt: skip
        np.testing.assert_array_equal(part.tokens, whole.tokens[rows])
        np.testing.assert_allclose(part.logprobs, whole.logprobs[rows], rtol=1e-5, atol=1e-6)
    # Each prompt's two samples differ: each row draws its own random numbers.
    assert all((whole.tokens[2 * i] != whole.tokens[2 * i + 1]).any() for i in range(4))
    assert (whole.tokens < VOCAB).all()


def test_a_decode_step_on_an_fsdp_mesh_moves_rows_not_weights():
    """On a mesh that splits the weights over fsdp (1, 8, 1), a decode step keeps every
    weight on its devices (the weight-stationary rules): what it gathers is the rows'
    activations, never a weight matrix, and its logits are the unsharded step's."""
    cfg = dataclasses.replace(CONFIG, d_model=256, mlp_dim=1024, num_heads=8, num_kv_heads=8)
    cfg = dataclasses.replace(cfg, head_dim=32, scan_layers=True)
    model = model_lib.Transformer(cfg)
    params = numpy_params(model, 0, scale=0.3)
    rows, cache_len = 16, 24
    rng = np.random.default_rng(0)
    cache = jax.tree_util.tree_map(
        lambda x: rng.normal(size=x.shape).astype(np.float32),
        model_lib.init_cache(cfg, rows, cache_len, jnp.float32),
    )
    tokens = rng.integers(0, VOCAB, (rows, 1)).astype(np.int32)
    index = rng.integers(0, cache_len, rows).astype(np.int32)
    kv_mask = np.arange(cache_len)[None] <= index[:, None]

    def step(params, cache, tokens, index, kv_mask):
        head = decode_lib.decode_head(params, cfg)
        logits, _ = decode_lib.step_logits(
            model, params, head, tokens, tokens, cache=cache, cache_index=index, kv_mask=kv_mask
        )
        return logits

    expected = jax.jit(step)(params, cache, tokens, index, kv_mask)
    mesh, rules = sharding.make_mesh((1, 8, 1)), sharding.validate_rules(sharding.DEFAULT_RULES)
    with sharding.activation_rules(mesh, rules):
        put = lambda tree, shardings: jax.device_put(tree, shardings)
        ids = jnp.zeros((1, 1), jnp.int32)
        abstract = jax.eval_shape(model.init, jax.random.key(0), ids, ids)
        params = put(params, sharding.params_shardings(mesh, abstract, rules)["params"])
        assert tuple(params["embedding"].sharding.spec) == ("tensor", "fsdp")  # split over fsdp
        cache = put(cache, sharding.named(mesh, model_lib.cache_axes(cfg), rules))
        row = lambda ndim: sharding.named(mesh, ("batch",) + (None,) * (ndim - 1), rules)
        args = [put(x, row(x.ndim)) for x in (tokens, index, kv_mask)]
        jitted = jax.jit(step)
        text = jitted.lower(params, cache, *args).compile().as_text()
        logits = jitted(params, cache, *args)
    np.testing.assert_allclose(logits, expected, atol=2e-5, rtol=2e-5)
    gathered = [
        int(np.prod([int(d) for d in dims.split(",") if d]))
        for dims in re.findall(r"= \w+\[([\d,]*)\]\{[^}]*\} all-gather", text)
    ]
    # Splitting the rows over fsdp instead gathers every [256, 1024] MLP matrix each step.
    smallest_weight = cfg.d_model * cfg.num_heads * cfg.head_dim
    assert gathered and max(gathered) < smallest_weight, gathered
