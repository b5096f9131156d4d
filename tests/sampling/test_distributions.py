"""Tests for replax/sampling/distributions.py: the sampling distribution (temperature, top-k, top-p)
against numpy, the top-p cut past its candidates, token draws and the vocabulary mask."""

import jax.numpy as jnp
import numpy as np
import pytest

from replax.model.logprobs import mask_vocab
from replax.sampling.distributions import (
    SamplingConfig,
    sample_tokens,
    sampling_logits,
    top_p_threshold,
)

# Probabilities 0.5, 0.25, 0.125, 0.125 (log2 logits): cuts are checkable by hand.
LOGITS = jnp.log(jnp.array([[0.125, 0.5, 0.125, 0.25]], jnp.float32))


def kept(config):
    return np.isfinite(np.asarray(sampling_logits(LOGITS, config)))[0].tolist()


def test_greedy_returns_the_raw_logits_and_temperature_scales():
    np.testing.assert_array_equal(sampling_logits(LOGITS, SamplingConfig(temperature=0)), LOGITS)
    np.testing.assert_allclose(
        sampling_logits(LOGITS, SamplingConfig(temperature=2.0)), LOGITS / 2, rtol=1e-6
    )


def test_top_k_and_top_p_keep_the_sets_computed_by_hand():
    assert kept(SamplingConfig(top_k=2)) == [False, True, False, True]
    # Mass before each token, most likely first: 0, 0.5, 0.75, 0.875.
    assert kept(SamplingConfig(top_p=0.5)) == [False, True, False, False]
    assert kept(SamplingConfig(top_p=0.6)) == [False, True, False, True]
    # 0.8: the two tokens of probability 0.125 tie for the last place; both are kept.
    assert kept(SamplingConfig(top_p=0.8)) == [True, True, True, True]


def test_the_top_p_cut_past_the_candidates_is_that_of_the_full_sort():
    """With 2 candidates (mass 0.75 < 0.8) the cut lies past them: the full sort finds it."""
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(3, 50)), jnp.float32)
    for top_p in (0.3, 0.9):
        few = top_p_threshold(logits, SamplingConfig(top_p=top_p, top_p_candidates=2))
        every = top_p_threshold(logits, SamplingConfig(top_p=top_p, top_p_candidates=50))
        np.testing.assert_array_equal(few, every)
        # numpy reference: the smallest logit whose strictly more likely mass is < top_p.
        probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        order = np.argsort(-np.asarray(logits), axis=-1)
        for row in range(3):
            p = probs[row, order[row]]
            num_kept = int(np.sum(np.cumsum(p) - p < top_p))
            assert float(every[row, 0]) == pytest.approx(logits[row, order[row][num_kept - 1]])


def test_sample_tokens_inverts_the_cdf_and_returns_the_log_prob():
    # CDF 0.125, 0.625, 0.75, 1.0: u = 0.1 -> token 0, 0.5 -> 1, 0.7 -> 2, 0.9 -> 3.
    logits = jnp.repeat(LOGITS, 4, axis=0)
    uniform = jnp.array([0.1, 0.5, 0.7, 0.9], jnp.float32)
    tokens, logprobs = sample_tokens(uniform, logits, SamplingConfig())
    assert tokens.tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(logprobs, np.log([0.125, 0.5, 0.125, 0.25]), rtol=1e-5)
    # Renormalised after top-k = 2: probabilities 0, 2/3, 0, 1/3, CDF 0, 2/3, 2/3, 1.
    tokens, logprobs = sample_tokens(uniform, logits, SamplingConfig(top_k=2))
    assert tokens.tolist() == [1, 1, 3, 3]
    np.testing.assert_allclose(logprobs, np.log([2 / 3, 2 / 3, 1 / 3, 1 / 3]), rtol=1e-5)
    greedy, greedy_lp = sample_tokens(uniform, logits, SamplingConfig(temperature=0))
    assert greedy.tolist() == [1] * 4
    np.testing.assert_allclose(greedy_lp, np.log([0.5] * 4), rtol=1e-5)


def test_mask_vocab_zeroes_the_rows_past_the_tokenizer():
    masked = mask_vocab(LOGITS, 2)
    probs = np.asarray(jnp.exp(masked) / jnp.exp(masked).sum(-1, keepdims=True))[0]
    np.testing.assert_allclose(probs, [0.2, 0.8, 0.0, 0.0], rtol=1e-6)
    assert mask_vocab(LOGITS, None) is LOGITS and mask_vocab(LOGITS, 4) is LOGITS


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("temperature", -1.0, "temperature"),
        ("top_k", -1, "top_k"),
        ("top_p", 0.0, "top_p"),
        ("top_p_candidates", 0, "top_p_candidates"),
    ],
)
def test_bad_settings_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**{field: value})
