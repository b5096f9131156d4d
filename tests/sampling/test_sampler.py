"""The sampler against a plain reference: the full forward re-run on prompt + prefix."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY, count_compilations

from replax.core import sharding
from replax.model import transformer as model_lib
from replax.sampling import distributions as sampling
from replax.sampling import sampler as sampler_lib

CONFIG = dataclasses.replace(TINY, qkv_bias=True)
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


def sampling_of(settings):
    """The SamplingConfig of a sampler's settings, taken out of them."""
    names = [f.name for f in dataclasses.fields(sampling.SamplingConfig)]
    return sampling.SamplingConfig(**{k: settings.pop(k) for k in names if k in settings})


def make(**kwargs):
    settings = dict(
        max_prompt_len=PROMPT_LEN, max_new_tokens=NEW_TOKENS, stop_ids=(EOS,), pad_id=PAD
    )
    settings.update(kwargs)
    return sampler_lib.make_sampler(CONFIG, sampling_of(settings), **settings)


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


@pytest.mark.parametrize("mesh_shape", [None, (2, 2, 2)])
def test_prefill_once_per_prompt_gives_the_repeated_prompts_completions(params, mesh_shape):
    """num_samples=G prefills the B prompts once and decodes B x G rows: the same tokens
    (greedy, and sampled at fp32 under the same rng) as B x G repeated prompts. On the
    (2, 2, 2) mesh the 4 data shards do not divide B = 2 prompts (they divide B x G = 8):
    the prefill runs on the prompts padded to 4."""
    ids, mask = prompts()
    ids, mask = ids[[0, 3]], mask[[0, 3]]  # prompts of 6 and 3 tokens
    mesh = None if mesh_shape is None else sharding.make_mesh(mesh_shape)
    for temperature, top_p in ((0.0, 1.0), (1.0, 1.0), (0.8, 0.7)):
        sampler = make(temperature=temperature, top_p=top_p, mesh=mesh)
        once = sampler.generate(params, ids, mask, jax.random.key(5), num_samples=4)
        repeated = sampler.generate(
            params, np.repeat(ids, 4, axis=0), np.repeat(mask, 4, axis=0), jax.random.key(5)
        )
        np.testing.assert_array_equal(np.asarray(once.tokens), np.asarray(repeated.tokens))
        np.testing.assert_array_equal(np.asarray(once.mask), np.asarray(repeated.mask))
        np.testing.assert_allclose(once.logprobs, repeated.logprobs, rtol=1e-5, atol=1e-5)
    if mesh is not None:
        assert once.tokens.sharding.spec[0] == ("data", "fsdp")


def _flops(params, batch, num_samples, prompt_len):
    """Compiled FLOPs of a greedy generate of one new token."""
    sampler = make(temperature=0.0, max_prompt_len=prompt_len, max_new_tokens=1)
    ids, mask = prompts()
    ids = np.resize(ids[:, -prompt_len:], (batch, prompt_len))
    mask = np.resize(mask[:, -prompt_len:], (batch, prompt_len))
    args = (params, ids, mask, jax.random.key(0), 0, sampler.sampling, num_samples, (0, 1))
    cost = sampler._jitted.lower(*args).compile().cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


def test_prefill_flops_scale_with_prompts_not_samples(params):
    """The prefill's FLOPs (those of a 12-token prompt less those of a 2-token one, at one
    new token) scale with the prompts: G = 8 samples of 4 prompts cost what 4 prompts do,
    where 32 repeated prompts cost 8 times that."""
    prefill = lambda b, g: _flops(params, b, g, 12) - _flops(params, b, g, 2)
    one, once, repeated = prefill(4, 1), prefill(4, 8), prefill(32, 1)
    print(
        f"prefill flops: 4 prompts {one:.3g}, 4 x 8 samples {once:.3g}, 32 prompts {repeated:.3g}"
    )
    assert once < 1.25 * one
    assert repeated > 6 * one


def full_sort_top_p(logits, top_p):
    """The top-p filter as replax computed it before candidates: a sort of the whole
    vocabulary every step."""
    sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
    sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    num_kept = jnp.sum(mass_before < top_p, axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(sorted_logits, num_kept - 1, axis=-1)
    return jnp.where(logits < threshold, -jnp.inf, logits)


def test_top_p_among_candidates_equals_the_full_sort():
    """Rows whose 8 most likely tokens hold top_p (peaked), rows where they do not (flat:
    the full sort runs), and ties at the cut (all tied tokens kept, as the full sort
    does): the kept set is the full sort's every time."""
    rng = np.random.default_rng(0)
    vocab, top_p = 1000, 0.9
    peaked = rng.normal(size=(6, vocab)) * 4.0  # a few tokens hold most of the mass
    flat = rng.normal(size=(2, vocab)) * 0.3
    ties = np.full((2, vocab), -10.0)
    ties[0, :3] = [2.0, 1.0, 1.0]  # the cut falls inside the tie of the two 1.0s
    ties[1, :12] = 1.0  # twelve tied: more than the candidates, all kept
    jitted = jax.jit(sampling.sampling_logits, static_argnums=1)
    for rows in (peaked, ties[:1], np.concatenate([peaked, flat]), ties[1:], ties):
        rows = jnp.asarray(rows, jnp.float32)
        config = sampling.SamplingConfig(top_p=top_p, top_p_candidates=8)
        got = jitted(rows, config)
        want = full_sort_top_p(rows, top_p)
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
        np.testing.assert_array_equal(
            np.where(np.isfinite(got), got, 0), np.where(np.isfinite(want), want, 0)
        )
        # The renormalised distribution, as the behaviour log-probs see it.
        np.testing.assert_allclose(
            jax.nn.log_softmax(got)[np.isfinite(got)],
            jax.nn.log_softmax(want)[np.isfinite(want)],
            atol=1e-6,
        )
    assert np.isfinite(np.asarray(jitted(jnp.asarray(ties), config)))[1].sum() == 12
    # With top-k no wider than the candidates no row can need the full sort.
    config = sampling.SamplingConfig(top_k=5, top_p=top_p, top_p_candidates=8)
    rows = jnp.asarray(np.concatenate([peaked, flat]), jnp.float32)
    topk_then_sort = full_sort_top_p(jitted(rows, dataclasses.replace(config, top_p=1.0)), top_p)
    np.testing.assert_array_equal(np.isfinite(jitted(rows, config)), np.isfinite(topk_then_sort))


TP_CONFIG = dataclasses.replace(CONFIG, num_kv_heads=4)


@pytest.fixture(scope="module")
def fsdp_params():
    """TP_CONFIG params as training holds them: float32, sharded over fsdp (1, 8, 1)."""
    mesh = sharding.make_mesh((1, 8, 1))
    model = model_lib.Transformer(TP_CONFIG)
    dummy = jnp.zeros((1, 1), jnp.int32)
    abstract = jax.eval_shape(model.init, jax.random.key(0), dummy, dummy)
    shardings = sharding.params_shardings(mesh, abstract, sharding.DEFAULT_RULES)["params"]
    variables = jax.jit(model.init)(jax.random.key(7), dummy, dummy)
    leaves, treedef = jax.tree_util.tree_flatten(nn.unbox(variables)["params"])
    keys = jax.random.split(jax.random.key(8), len(leaves))
    leaves = [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    return mesh, jax.device_put(jax.tree_util.tree_unflatten(treedef, leaves), shardings)


def make_tp(**kwargs):
    settings = dict(
        max_prompt_len=PROMPT_LEN, max_new_tokens=NEW_TOKENS, stop_ids=(EOS,), pad_id=PAD
    )
    settings = {**settings, **kwargs}
    return sampler_lib.make_sampler(TP_CONFIG, sampling_of(settings), **settings)


def test_tensor_parallel_sampler_mesh_matches_the_training_mesh(fsdp_params):
    """Training keeps FSDP float32 params on (1, 8, 1); the sampler decodes on its own
    (2, 1, 4) mesh, heads / mlp / vocab over 4 tensor shards: the params are resharded
    (and cast) once per call, the greedy tokens are the training-mesh sampler's, and the
    second call compiles nothing."""
    train_mesh, params = fsdp_params
    ids, mask = prompts()
    on_train_mesh = make_tp(temperature=0.0, mesh=train_mesh).generate(
        params, ids, mask, jax.random.key(0), num_samples=2
    )
    tp = make_tp(temperature=0.0, mesh=sharding.make_mesh((2, 1, 4)))
    out = tp.generate(params, ids, mask, jax.random.key(0), num_samples=2)
    q = tp.prepare_params(params)["layer_0"]["attn"]["q"]  # [E, H, D]: heads over tensor
    assert q.sharding.mesh.shape["tensor"] == 4 and q.sharding.spec[1] == "tensor"
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(on_train_mesh.tokens))
    np.testing.assert_allclose(out.logprobs, on_train_mesh.logprobs, rtol=1e-5, atol=1e-5)
    with count_compilations() as compiled:
        tp.generate(params, ids, mask, jax.random.key(1), num_samples=2)
        tp.generate(params, ids, mask, jax.random.key(2), num_samples=2)
    assert compiled == []


def test_bfloat16_sampler_logprobs_are_close_to_float32(fsdp_params):
    """A bfloat16 sampler (weights cast once per call, cache bfloat16 by default) on the
    tensor-parallel mesh: its behaviour log-probs, where its tokens so far are the
    float32 sampler's, are within 0.05 of them."""
    train_mesh, params = fsdp_params
    ids, mask = prompts()
    tp_mesh = sharding.make_mesh((2, 1, 4))
    fp32 = make_tp(mesh=tp_mesh).generate(params, ids, mask, jax.random.key(3), num_samples=2)
    bf16_sampler = make_tp(mesh=tp_mesh, dtype="bfloat16")
    bf16 = bf16_sampler.generate(params, ids, mask, jax.random.key(3), num_samples=2)
    assert bf16_sampler.prepare_params(params)["embedding"].dtype == jnp.bfloat16
    same_so_far = np.cumprod(np.asarray(bf16.tokens) == np.asarray(fp32.tokens), axis=1) > 0
    same_so_far &= np.asarray(fp32.mask)
    assert same_so_far[:, 0].all() and same_so_far.mean() > 0.5
    gap = np.abs(np.asarray(bf16.logprobs) - np.asarray(fp32.logprobs))[same_so_far]
    print(f"bf16 vs fp32 behaviour log-probs: max gap {gap.max():.4f}, mean {gap.mean():.4f}")
    assert gap.max() < 0.05
    with count_compilations() as compiled:
        bf16_sampler.generate(params, ids, mask, jax.random.key(4), num_samples=2)
    assert compiled == []


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
        ({"top_p_candidates": 0}, "top_p_candidates=0: must be an integer >= 1"),
        ({"dtype": "float64"}, "sampler.dtype='float64'"),
        ({"mesh": (1, 1, 8)}, "sampler.mesh"),
    ],
)
def test_bad_settings_raise(settings, message):
    with pytest.raises(ValueError, match=message):
        make(**settings)


def test_a_mesh_that_does_not_divide_the_params_raises():
    # CONFIG's 2 kv heads over 4 tensor shards.
    with pytest.raises(ValueError, match="is not divisible by the 4 shards of mesh axes"):
        make(mesh=sharding.make_mesh((2, 1, 4)))


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
    config = sampling.SamplingConfig(temperature=1.0)
    uniform = jax.random.uniform(jax.random.key(0), (20_000,))
    tokens, logprobs = sampling.sample_tokens(
        uniform, jnp.broadcast_to(logits, (20_000, 6)), config
    )
    frequencies = np.bincount(np.asarray(tokens), minlength=6) / 20_000
    np.testing.assert_allclose(frequencies, np.exp(logits), atol=0.01)
    np.testing.assert_allclose(logprobs, logits[tokens], rtol=1e-6)


def test_sampling_config_is_frozen_and_hashable():
    config = sampling.SamplingConfig(temperature=0.5, top_k=3)
    assert hash(config) == hash(dataclasses.replace(config))
    assert not config.greedy and sampling.SamplingConfig(temperature=0.0).greedy


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


def test_a_block_of_the_batch_samples_as_in_the_whole_batch(params):
    """row_block (i, n): a process decoding its block of prompts alone gets the tokens of
    those rows of the whole batch under the same rng."""
    sampler = make()
    ids, mask = prompts()
    key = jax.random.key(3)
    whole = sampler.generate(params, ids, mask, key, num_samples=2)
    half = len(ids) // 2
    for i in range(2):
        block = slice(i * half, (i + 1) * half)
        part = sampler.generate(
            params, ids[block], mask[block], key, num_samples=2, row_block=(i, 2)
        )
        rows = slice(2 * block.start, 2 * block.stop)
        np.testing.assert_array_equal(np.asarray(part.tokens), np.asarray(whole.tokens)[rows])
        np.testing.assert_allclose(
            np.asarray(part.logprobs), np.asarray(whole.logprobs)[rows], rtol=1e-5, atol=1e-6
        )
    other = sampler.generate(params, ids[:half], mask[:half], key, num_samples=2)
    assert not np.array_equal(np.asarray(other.tokens), np.asarray(whole.tokens)[: 2 * half])
