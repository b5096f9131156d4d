"""Tests for replax/model/logprobs.py: the chunked log-probs and entropy equal (in value and
gradient) those of the whole float32 logits, for chunk sizes that divide the predicting
positions or not, with a temperature and a masked vocabulary tail."""

import re

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

from replax.model import layers
from replax.model import logprobs as logprobs_lib
from replax.model.logprobs import chunked_token_logprobs_and_entropy, mask_vocab

# 11 positions predict the next token: chunks of 1, 4 (padded), 11 and 16 (one padded chunk).
BATCH, LENGTH, EMBED, VOCAB = 3, 12, 8, 10


def unchunked(hidden, head, tokens, scale, vocab_size):
    """Today's train step: the whole [B, T, V] logits, one log-softmax."""
    logits = layers.dense(hidden, head).astype(jnp.float32) * scale
    return logprobs_lib.token_logprobs_and_entropy(mask_vocab(logits, vocab_size), tokens)


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(BATCH, LENGTH, EMBED)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(EMBED, VOCAB)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, 8, (BATCH, LENGTH)), jnp.int32)
    return hidden, head, tokens


def test_against_numpy():
    hidden, head, tokens = inputs()
    logprobs, entropy = chunked_token_logprobs_and_entropy(
        hidden, head, tokens, 4, scale=1 / 0.7, vocab_size=8
    )
    logits = np.asarray(hidden, np.float64) @ np.asarray(head, np.float64) / 0.7
    logits = logits[:, :-1, :8]  # ids 8, 9 past the vocabulary: probability 0
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, np.asarray(tokens)[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(logprobs[:, 0], 0.0)
    np.testing.assert_allclose(logprobs[:, 1:], picked, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(entropy[:, 1:], -(np.exp(logp) * logp).sum(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 4, 11, 16])
@pytest.mark.parametrize("temperature, vocab_size", [(1.0, None), (0.7, 8)])
def test_values_and_gradients_equal_the_unchunked(chunk_size, temperature, vocab_size):
    hidden, head, tokens = inputs(chunk_size)
    scale = 1 / temperature
    # A loss that weighs both outputs, so both gradients are compared.
    weights = jnp.asarray(np.random.default_rng(1).normal(size=(2, BATCH, LENGTH)), jnp.float32)

    def loss(fn, hidden, head):
        logprobs, entropy = fn(hidden, head)
        return jnp.sum(weights[0] * logprobs + weights[1] * entropy), (logprobs, entropy)

    def chunked(hidden, head):
        return chunked_token_logprobs_and_entropy(
            hidden, head, tokens, chunk_size, scale=scale, vocab_size=vocab_size
        )

    def whole(hidden, head):
        return unchunked(hidden, head, tokens, scale, vocab_size)

    grad = lambda fn: jax.jit(jax.grad(lambda h, w: loss(fn, h, w), (0, 1), has_aux=True))
    (grads, (logprobs, entropy)) = grad(chunked)(hidden, head)
    (expected_grads, (expected_logprobs, expected_entropy)) = grad(whole)(hidden, head)
    assert logprobs.shape == entropy.shape == (BATCH, LENGTH)
    np.testing.assert_allclose(logprobs, expected_logprobs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(entropy, expected_entropy, rtol=1e-5, atol=1e-5)
    for got, expected in zip(grads, expected_grads):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_bfloat16_states_sum_the_head_gradient_in_float32():
    hidden, head, tokens = inputs()
    hidden, head = hidden.astype(jnp.bfloat16), head.astype(jnp.bfloat16)

    def head_grad(chunk_size):
        def loss(head):
            return chunked_token_logprobs_and_entropy(hidden, head, tokens, chunk_size)[0].sum()

        return jax.jit(jax.grad(loss))(head)

    chunked, whole = head_grad(1), head_grad(11)
    assert chunked.dtype == jnp.bfloat16
    # 11 chunks of one position each, summed in float32 then rounded once: one bf16 ulp.
    np.testing.assert_allclose(
        np.asarray(chunked, np.float32), np.asarray(whole, np.float32), rtol=1e-2, atol=1e-2
    )


def test_the_backward_pass_saves_no_logits(capsys):
    """The chunk body is rematerialised: nothing [B, C, V]-sized is stored for the
    backward pass, only the chunk's inputs."""
    hidden, head, tokens = inputs()
    loss = lambda h: chunked_token_logprobs_and_entropy(h, head, tokens, 4)[0].sum()
    jax.ad_checkpoint.print_saved_residuals(loss, hidden)
    shapes = re.findall(r"\[([\d,]+)\]", capsys.readouterr().out)
    assert f"{3},{BATCH},{4},{EMBED}" in shapes  # the chunks of hidden states
    assert not any(s.count(",") >= 2 and s.endswith(f",{VOCAB}") for s in shapes), shapes


def test_a_chunk_size_below_one_is_refused():
    hidden, head, tokens = inputs()
    with pytest.raises(ValueError, match="chunk_size=0 must be >= 1"):
        chunked_token_logprobs_and_entropy(hidden, head, tokens, 0)
