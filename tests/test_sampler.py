"""The sampler against a plain reference: the full forward re-run on prompt + prefix."""

import contextlib
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replax import model as model_lib
from replax import sampler as sampler_lib
from replax import sharding

CONFIG = model_lib.ModelConfig(
    vocab_size=64,
    num_layers=2,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    max_len=16,
    qkv_bias=True,
)
PROMPT_LEN, NEW_TOKENS, EOS, PAD = 6, 5, 63, 0


@pytest.fixture(scope="module")
def params():
    """Random params; the q/k/v biases perturbed away from their zero init."""
    dummy = jnp.zeros((1, 1), jnp.int32)
    variables = jax.jit(model_lib.Transformer(CONFIG).init)(jax.random.key(3), dummy, dummy)
    leaves, treedef = jax.tree_util.tree_flatten(nn.unbox(variables)["params"])
    keys = jax.random.split(jax.random.key(4), len(leaves))
    leaves = [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def prompts():
    """Four left-padded prompts of lengths 6, 4, 1 and 3 (token ids 1..62)."""
    lengths = np.array([6, 4, 1, 3])
    mask = np.arange(PROMPT_LEN)[None, :] >= PROMPT_LEN - lengths[:, None]
    ids = np.random.default_rng(0).integers(1, EOS, (4, PROMPT_LEN))
    return np.where(mask, ids, PAD).astype(np.int32), mask


def make(**kwargs):
    settings = dict(
        max_prompt_len=PROMPT_LEN, max_new_tokens=NEW_TOKENS, stop_ids=(EOS,), pad_id=PAD
    )
    settings.update(kwargs)
    return sampler_lib.make_sampler(CONFIG, **settings)


@jax.jit
def _full_forward(params, ids, positions, mask):
    return model_lib.Transformer(CONFIG).apply({"params": params}, ids, positions, mask)


def reference_logits(params, prompt_ids, prompt_mask, completion):
    """Full-forward logits [B, N, V] predicting each completion token from its prefix."""
    ids = np.concatenate([prompt_ids, completion], axis=1)
    mask = np.concatenate([prompt_mask, np.ones_like(completion, bool)], axis=1)
    logits = _full_forward(params, ids, model_lib.positions_from_mask(mask), mask)
    p = prompt_ids.shape[1]
    return np.asarray(logits[:, p - 1 : -1], np.float64)


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def at(x, tokens):
    return np.take_along_axis(x, tokens[..., None], axis=-1)[..., 0]


@contextlib.contextmanager
def count_compilations():
    """Counts XLA compilations (backend_compile events) inside the block."""
    events = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def test_greedy_is_argmax_of_full_forward(params):
    ids, mask = prompts()
    out = make(temperature=0.0).generate(params, ids, mask, jax.random.key(0))
    tokens = np.asarray(out.tokens)
    assert tokens.shape == (4, NEW_TOKENS) and tokens.dtype == np.int32
    # Step by step: re-run the full forward on prompt + generated prefix.
    for t in range(NEW_TOKENS):
        logits = reference_logits(params, ids, mask, tokens[:, : t + 1])[:, t]
        live = np.asarray(out.mask)[:, t]
        np.testing.assert_array_equal(tokens[live, t], logits.argmax(-1)[live])
        np.testing.assert_allclose(
            np.asarray(out.logprobs)[live, t],
            at(log_softmax(logits), tokens[:, t])[live],
            rtol=1e-5,
            atol=1e-5,
        )


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (5, 1.0), (0, 0.6)])
def test_behaviour_logprobs_are_those_of_the_sampling_distribution(params, top_k, top_p):
    ids, mask = prompts()
    temperature = 0.7
    out = make(temperature=temperature, top_k=top_k, top_p=top_p).generate(
        params, ids, mask, jax.random.key(1)
    )
    tokens, live = np.asarray(out.tokens), np.asarray(out.mask)
    scaled = reference_logits(params, ids, mask, tokens) / temperature  # [B, N, V]
    # numpy reference of the filters: top-k by rank; top-p keeps the most likely tokens
    # until the probability before them reaches top_p.
    order = np.argsort(-scaled, axis=-1)
    ranks = np.argsort(order, axis=-1)
    keep = np.ones_like(scaled, bool)
    if top_k:
        keep &= ranks < top_k
    if top_p < 1:
        sorted_probs = np.exp(log_softmax(np.take_along_axis(scaled, order, -1)))
        mass_before = np.cumsum(sorted_probs, -1) - sorted_probs
        keep &= np.take_along_axis(mass_before < top_p, ranks, -1)
    expected = at(log_softmax(np.where(keep, scaled, -np.inf)), tokens)
    assert at(keep, tokens)[live].all()  # every sampled token is inside the filter
    np.testing.assert_allclose(np.asarray(out.logprobs)[live], expected[live], atol=1e-5)
    assert (np.asarray(out.logprobs)[~live] == 0).all()


def test_eos_stops_a_row_and_the_rest_is_pad(params):
    ids, mask = prompts()
    greedy = make(temperature=0.0).generate(params, ids, mask, jax.random.key(0))
    # Make the token row 0 emits at step 2 the EOS: row 0 then stops there.
    eos = int(greedy.tokens[0, 2])
    out = make(temperature=0.0, stop_ids=(eos,), pad_id=PAD if eos != PAD else 1).generate(
        params, ids, mask, jax.random.key(0)
    )
    tokens, live = np.asarray(out.tokens), np.asarray(out.mask)
    first_eos = int(np.argmax(tokens[0] == eos))
    assert first_eos <= 2 and int(out.lengths[0]) == first_eos + 1  # EOS itself counted
    np.testing.assert_array_equal(live[0], np.arange(NEW_TOKENS) <= first_eos)
    assert (tokens[0, first_eos + 1 :] == (PAD if eos != PAD else 1)).all()
    assert (np.asarray(out.logprobs)[0, first_eos + 1 :] == 0).all()
    np.testing.assert_array_equal(np.asarray(out.lengths), live.sum(1))
    # Before EOS the completion is the same as without it.
    np.testing.assert_array_equal(tokens[0, : first_eos + 1], greedy.tokens[0, : first_eos + 1])

    # Every row done: the loop exits early and unvisited columns are pad.
    one_row = make(temperature=0.0, stop_ids=(eos,)).generate(
        params, ids[:1], mask[:1], jax.random.key(0)
    )
    assert int(one_row.lengths[0]) == first_eos + 1
    assert (np.asarray(one_row.tokens)[0, first_eos + 1 :] == PAD).all()


def test_left_padding_gives_the_same_completion(params):
    ids, mask = prompts()
    prompt = ids[1, 2:]  # the 4-token prompt, without its padding
    base = make(temperature=0.0, max_prompt_len=4).generate(
        params, prompt[None], np.ones((1, 4), bool), jax.random.key(0)
    )
    padded = make(temperature=0.0).generate(params, ids, mask, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(padded.tokens)[1], np.asarray(base.tokens)[0])
    np.testing.assert_allclose(padded.logprobs[1], base.logprobs[0], rtol=1e-5, atol=1e-5)


def test_same_outputs_on_one_device_and_on_a_mesh(params):
    ids, mask = prompts()
    mesh = sharding.make_mesh((2, 2, 2))
    for temperature in (0.0, 1.0):
        one = make(temperature=temperature).generate(params, ids, mask, jax.random.key(2))
        eight = make(temperature=temperature, mesh=mesh).generate(
            params, ids, mask, jax.random.key(2)
        )
        assert eight.tokens.sharding.spec[0] == ("data", "fsdp")
        assert len(eight.tokens.sharding.device_set) == 8
        np.testing.assert_array_equal(np.asarray(eight.tokens), np.asarray(one.tokens))
        np.testing.assert_array_equal(np.asarray(eight.mask), np.asarray(one.mask))
        np.testing.assert_allclose(eight.logprobs, one.logprobs, rtol=1e-5, atol=1e-5)


def test_second_call_compiles_nothing(params):
    ids, mask = prompts()
    sampler = make(temperature=1.0)
    sampler.generate(params, ids, mask, jax.random.key(0))  # compiles
    device_ids, device_mask = jnp.asarray(ids), jnp.asarray(mask)
    with count_compilations() as compiled:
        sampler.generate(params, ids, mask, jax.random.key(1))
        sampler.generate(params, device_ids, device_mask, jax.random.key(2))
        # A shorter prompt is left-padded to max_prompt_len: the same program again.
        sampler.generate(params, ids[:, 2:], mask[:, 2:], jax.random.key(3))
    assert compiled == []
    # Greedy through the same sampler compiles once more, and only once.
    with count_compilations() as compiled:
        sampler.generate(params, ids, mask, jax.random.key(0), temperature=0.0)
        sampler.generate(params, ids, mask, jax.random.key(1), temperature=0.0)
    assert len(compiled) == 1


def test_sample_k_repeats_each_prompt(params):
    ids, mask = prompts()
    sampler = make(temperature=1.0)
    # Greedy: each of the k completions of a prompt is the prompt's greedy completion.
    greedy = sampler.sample_k(params, ids[:2], mask[:2], jax.random.key(0), k=3, temperature=0.0)
    single = sampler.generate(params, ids[:2], mask[:2], jax.random.key(0), temperature=0.0)
    for field in ("tokens", "mask", "logprobs", "lengths"):
        want = np.repeat(np.asarray(getattr(single, field))[:, None], 3, axis=1)
        np.testing.assert_allclose(getattr(greedy, field), want, rtol=1e-6, atol=1e-6)
    # Sampled: row (i, j) is the j-th copy of prompt i in one batch of repeated prompts,
    # each copy drawn with its own random numbers.
    out = sampler.sample_k(params, ids[:2], mask[:2], jax.random.key(1), k=3)
    assert out.tokens.shape == (2, 3, NEW_TOKENS)
    repeated = sampler.generate(
        params, np.repeat(ids[:2], 3, axis=0), np.repeat(mask[:2], 3, axis=0), jax.random.key(1)
    )
    np.testing.assert_array_equal(np.asarray(out.tokens).reshape(6, -1), repeated.tokens)
    np.testing.assert_array_equal(np.asarray(out.lengths).reshape(6), repeated.lengths)
    assert len({tuple(row) for row in np.asarray(out.tokens)[0]}) > 1


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"max_prompt_len": 12}, "max_prompt_len \\+ max_new_tokens"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 65}, "top_k"),
        ({"temperature": -0.5}, "temperature"),
        ({"cache_dtype": "float64"}, "cache_dtype"),
        ({"stop_ids": (64,)}, "stop_ids"),
        ({"stop_ids": ()}, "stop_ids"),
        ({"vocab_size": 65}, "vocab_size"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_bad_settings_raise(settings, message):
    with pytest.raises(ValueError, match=message):
        make(**settings)


def test_bad_inputs_raise_before_compiling(params):
    ids, mask = prompts()
    sampler = make(mesh=sharding.make_mesh((2, 2, 2)))
    long_ids = np.ones((4, PROMPT_LEN + 1), np.int32)
    with count_compilations() as compiled:
        with pytest.raises(ValueError, match="exceeds sampler.max_prompt_len=6"):
            sampler.generate(params, long_ids, long_ids > 0, jax.random.key(0))
        with pytest.raises(ValueError, match="not divisible by the 4 data-parallel shards"):
            sampler.generate(params, ids[:3], mask[:3], jax.random.key(0))
        with pytest.raises(ValueError, match="prompt_ids dtype"):
            sampler.generate(params, ids.astype(np.float32), mask, jax.random.key(0))
        with pytest.raises(ValueError, match="same shape"):
            sampler.generate(params, ids, mask[:, 1:], jax.random.key(0))
        with pytest.raises(ValueError, match="top_p"):
            sampler.generate(params, ids, mask, jax.random.key(0), top_p=2.0)
    assert compiled == []


def test_sampled_frequencies_follow_the_distribution():
    logits = jnp.log(jnp.array([0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0]))
    config = sampler_lib.SamplingConfig(temperature=1.0)
    uniform = jax.random.uniform(jax.random.key(0), (20_000,))
    tokens, logprobs = sampler_lib.sample_tokens(
        uniform, jnp.broadcast_to(logits, (20_000, 6)), config
    )
    frequencies = np.bincount(np.asarray(tokens), minlength=6) / 20_000
    np.testing.assert_allclose(frequencies, np.exp(logits), atol=0.01)
    np.testing.assert_allclose(logprobs, logits[tokens], rtol=1e-6)


def test_sampling_config_is_frozen_and_hashable():
    config = sampler_lib.SamplingConfig(temperature=0.5, top_k=3)
    assert hash(config) == hash(dataclasses.replace(config))
    assert not config.greedy and sampler_lib.SamplingConfig(temperature=0.0).greedy


def test_a_row_stops_at_the_first_of_several_stop_ids(params):
    """Qwen2.5-Instruct ends a turn with either of two ids: each row stops at whichever
    of the stop ids it emits first."""
    ids, mask = prompts()
    greedy = np.asarray(make(temperature=0.0).generate(params, ids, mask, jax.random.key(0)).tokens)
    stops = (int(greedy[0, 1]), int(greedy[1, 3]))
    out = make(temperature=0.0, stop_ids=stops).generate(params, ids, mask, jax.random.key(0))
    for row in range(4):
        hits = np.flatnonzero(np.isin(greedy[row], stops))
        end = hits[0] + 1 if hits.size else NEW_TOKENS
        assert int(out.lengths[row]) == end
        np.testing.assert_array_equal(np.asarray(out.tokens)[row, :end], greedy[row, :end])


def test_rows_past_the_tokenizers_vocabulary_are_never_sampled(params):
    """A checkpoint's vocabulary may be padded past the tokenizer's ids: with vocab_size
    the sampler draws from (and scores under) the first vocab_size logits alone."""
    ids, mask = prompts()
    limit = 40
    full = make(temperature=0.0).generate(params, ids, mask, jax.random.key(0))
    assert (np.asarray(full.tokens)[np.asarray(full.mask)] >= limit).any()  # it would
    for temperature in (0.0, 1.0):
        out = make(temperature=temperature, vocab_size=limit, stop_ids=(1,)).generate(
            params, np.repeat(ids, 8, 0), np.repeat(mask, 8, 0), jax.random.key(1)
        )
        live = np.asarray(out.mask)
        assert (np.asarray(out.tokens)[live] < limit).all()
    # Greedy log-probs are the log-softmax over the kept logits of the first token.
    out = make(temperature=0.0, vocab_size=limit, stop_ids=(1,)).generate(
        params, ids, mask, jax.random.key(0)
    )
    positions = model_lib.positions_from_mask(mask)
    logits = np.asarray(_full_forward(params, ids, positions, mask))[:, -1, :limit]
    logits = logits.astype(np.float64)
    top = logits.max(1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(1, keepdims=True))
    first = np.asarray(out.tokens)[:, 0]
    np.testing.assert_array_equal(first, logits.argmax(1))
    np.testing.assert_allclose(np.asarray(out.logprobs)[:, 0], logp[np.arange(4), first], atol=1e-5)
