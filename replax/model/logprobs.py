"""Log-probs of the taken tokens and the entropy, a chunk of positions at a time.

The logits of a batch are float32 [B, T, V]: 40 GiB at B = 64, T = 1024 and Qwen's
151,936-token vocabulary. `chunked_token_logprobs_and_entropy` scans over chunks of C
positions of the final hidden states [B, T, E] instead, so that only one float32
[B, C, V] block of logits lives at a time, in the forward and in the backward pass (the
chunk body is rematerialised: the backward recomputes a chunk's logits rather than
saving them). The batch axis stays whole in every chunk, so its sharding is kept.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from replax.model import layers


def _chunk_logprobs_and_entropy(hidden, targets, head, *, scale, vocab_size, with_entropy):
    """One chunk: hidden [B, C, E], targets int[B, C], head float32 [E, V] ->
    (log-prob of each target [B, C], entropy of each next-token distribution [B, C], or
    None without with_entropy)."""
    # Cast here, not outside the scan: the head's gradient then sums over chunks in float32.
    logits = layers.dense(hidden, head.astype(hidden.dtype)).astype(jnp.float32)
    logits = layers.constrain(logits, ("batch", "length", "vocab"))  # [B, C, V]
    logits = mask_vocab(logits * scale, vocab_size)  # the distribution the sampler draws from
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    if not with_entropy:
        return picked, None
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return picked, entropy


def chunked_token_logprobs_and_entropy(
    hidden,
    head,
    tokens,
    chunk_size: int,
    *,
    scale: float = 1.0,
    vocab_size: int | None = None,
    with_entropy: bool = True,
):
    """`token_logprobs_and_entropy` of the logits `dense(hidden, head) * scale`
    (vocab-masked like the sampler), computed chunk_size positions at a time.

    hidden: [B, T, E] final-normed states (`Transformer(..., return_hidden=True)`), in
      the compute dtype; head: [E, V] (`model.output_head`); tokens: int[B, T].
    chunk_size: positions per chunk; one that does not divide the T - 1 predicting
      positions is handled by zero-padding the last chunk (padding is dropped).
    scale: 1 / temperature. vocab_size: see `mask_vocab`.
    with_entropy: False skips the entropy (None in its place): a pass that needs only the
      log-probs (the covariance options' ranking, `replax.rl.gradients`) reads the [B, C, V]
      log-probs once less.
    Returns (logprobs [B, T], entropy [B, T] or None), float32, 0 at t = 0.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    batch, length, embed = hidden.shape
    predicting = length - 1  # position t predicts tokens[:, t + 1]
    chunk = max(min(chunk_size, predicting), 1)
    num_chunks = -(-predicting // chunk)
    padded = num_chunks * chunk  # in [T - 1, T - 1 + chunk)
    targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, padded - predicting)))  # [B, padded]
    if padded <= length:
        hidden = hidden[:, :padded]
    else:
        hidden = jnp.pad(hidden, ((0, 0), (0, padded - length), (0, 0)))  # zeros: finite
    # Chunk-major, the batch axis whole (and sharded) in every chunk.
    hidden = hidden.reshape(batch, num_chunks, chunk, embed).swapaxes(0, 1)  # [N, B, C, E]
    hidden = layers.constrain(hidden, (None, "batch", "length", "embed"))
    targets = targets.reshape(batch, num_chunks, chunk).swapaxes(0, 1)  # [N, B, C]
    head = head.astype(jnp.float32)

    body = jax.checkpoint(
        functools.partial(
            _chunk_logprobs_and_entropy,
            scale=scale,
            vocab_size=vocab_size,
            with_entropy=with_entropy,
        ),
        prevent_cse=False,  # scan already keeps the recomputation apart
    )

    def scan_body(carry, chunk_inputs):
        chunk_hidden, chunk_targets = chunk_inputs
        chunk_hidden = layers.constrain(chunk_hidden, ("batch", "length", "embed"))
        return carry, body(chunk_hidden, chunk_targets, head)

    _, (picked, entropy) = jax.lax.scan(scan_body, None, (hidden, targets))  # [N, B, C] each

    def unchunk(x):  # [N, B, C] -> [B, T], 0 at t = 0
        x = x.swapaxes(0, 1).reshape(batch, padded)[:, :predicting]
        return jnp.pad(x, ((0, 0), (1, 0)))

    return unchunk(picked), None if entropy is None else unchunk(entropy)


def token_logprobs_and_entropy(logits, tokens):
    """token_logprobs and the entropy of each next-token distribution (aligned the same
    way: 0 at t = 0), from one log-softmax over [B, T - 1, V]."""
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return jnp.pad(picked, ((0, 0), (1, 0))), jnp.pad(entropy, ((0, 0), (1, 0)))


def token_logprobs(logits, tokens):
    """log p(tokens[t] | tokens[<t]) for t >= 1, and 0 at t = 0. logits: [B, T, V]."""
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.pad(picked, ((0, 0), (1, 0)))


def mask_vocab(logits, vocab_size: int | None):
    """logits [..., V] with the ids >= vocab_size (None: none) far below any other: their
    probability is exactly 0, and p log p stays finite (0, where -inf would give NaN)."""
    if vocab_size is None or vocab_size >= logits.shape[-1]:
        return logits
    return jnp.where(jnp.arange(logits.shape[-1]) < vocab_size, logits, -1e9)
