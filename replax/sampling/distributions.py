"""The sampling distribution of one decode step: temperature, top-k, top-p, and the draw.

`sample_tokens(uniform, logits, config)` draws one token per row by inverting the CDF of
the filtered, renormalised distribution and returns its log-probability under it (the
behaviour log-prob that replay stores). top-p finds its cut among the `top_p_candidates`
most likely tokens (`lax.top_k`) and sorts the whole vocabulary only when, for some row,
they hold less than top_p. `mask_vocab` hides model rows past the tokenizer's vocabulary
from the sampler and, identically, from the train step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from replax.core import categorical
from replax.core.config_utils import ConfigError, number


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """The sampling distribution. temperature 0 is greedy (top_k / top_p then unused)."""

    temperature: float = 1.0
    # Keep the k most likely tokens; 0 keeps all.
    top_k: int = 0
    # Keep the smallest set of most likely tokens whose probability reaches top_p.
    top_p: float = 1.0
    # How many of the most likely tokens top-p looks among before it sorts the whole
    # vocabulary (only when, for some row, they hold less than top_p): the distribution
    # is the same either way, only the cost differs.
    top_p_candidates: int = 64
    # (token id, bias) pairs added to the logits before everything else, as vLLM's and
    # OpenAI's logit_bias: the behaviour log-probs are those of the biased distribution.
    # E.g. a bias on the stop token sets how long completions run (scripts/bench_engine.py).
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self):
        # Messages name a run's config key (rollout.*): a run's rollout section is this type.
        number("rollout.temperature", self.temperature, low=0)
        number("rollout.top_k", self.top_k, low=0, integer=True)
        number("rollout.top_p", self.top_p, low=0, low_open=True, high=1)
        number("rollout.top_p_candidates", self.top_p_candidates, low=1, integer=True)
        pairs = tuple(tuple(p) if isinstance(p, list | tuple) else p for p in self.logit_bias)
        for pair in pairs:
            ok = isinstance(pair, tuple) and len(pair) == 2
            if not (ok and isinstance(pair[0], int | np.integer) and pair[0] >= 0):
                raise ConfigError(
                    f"sampler.logit_bias={self.logit_bias!r}: allowed are (token id >= 0, "
                    "bias) pairs"
                )
        object.__setattr__(self, "logit_bias", tuple((int(i), float(b)) for i, b in pairs))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sampling_logits(logits, config: SamplingConfig):
    """Logits of the sampling distribution: scaled by 1/temperature, then filtered.

    logits: float32[..., V]. Filtered-out tokens get -inf, so `log_softmax` of the result
    is the renormalised distribution. Greedy decoding returns the raw logits (plus any
    logit_bias).
    """
    if config.logit_bias:
        ids = jnp.asarray([i for i, _ in config.logit_bias], jnp.int32)
        bias = jnp.asarray([b for _, b in config.logit_bias], logits.dtype)
        logits = logits.at[..., ids].add(bias)
    if config.greedy:
        return logits
    logits = logits / config.temperature
    if config.top_k and config.top_k < logits.shape[-1]:
        kth_largest = jax.lax.top_k(logits, config.top_k)[0][..., -1:]  # [..., 1]
        logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
    if config.top_p < 1.0:
        logits = jnp.where(logits < top_p_threshold(logits, config), -jnp.inf, logits)
    return logits


def _cut(sorted_logits, top_p: float, log_total):
    """The smallest logit top-p keeps, from the most likely logits in descending order.

    A token is kept when the probability of the strictly more likely tokens is below
    top_p; the most likely token is always kept. sorted_logits: [..., K] descending;
    log_total: [..., 1] log-sum-exp of all V logits. Returns ([..., 1] smallest kept
    logit, [...] probability mass of the K).
    """
    probs = jnp.exp(sorted_logits - log_total)  # [..., K]
    mass = jnp.cumsum(probs, axis=-1)
    num_kept = jnp.sum(mass - probs < top_p, axis=-1, keepdims=True)  # [..., 1], >= 1
    return jnp.take_along_axis(sorted_logits, num_kept - 1, axis=-1), mass[..., -1]


def top_p_threshold(logits, config: SamplingConfig):
    """float32[..., 1]: top-p keeps the logits >= this, ties with the last kept included.

    Sorting the whole vocabulary every step costs seconds at V = 152k on a CPU, so the cut
    is looked for among the `top_p_candidates` most likely tokens (one `lax.top_k`). When
    for some row they hold less than top_p, the cut lies past them and the whole
    vocabulary is sorted (for every row, under `lax.cond`): the kept set is always the one
    of the full sort.
    """
    vocab = logits.shape[-1]
    log_total = jax.nn.logsumexp(logits, axis=-1, keepdims=True)  # [..., 1]
    num_candidates = min(config.top_p_candidates, vocab)
    candidates = jax.lax.top_k(logits, num_candidates)[0]  # [..., K] descending
    threshold, candidate_mass = _cut(candidates, config.top_p, log_total)
    # The candidates hold every token left by a top-k no wider than them.
    if num_candidates == vocab or 0 < config.top_k <= num_candidates:
        return threshold

    def full_sort(_):
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]  # [..., V] descending
        return _cut(sorted_logits, config.top_p, log_total)[0]

    covered = jnp.all(candidate_mass >= config.top_p)
    return jax.lax.cond(covered, lambda _: threshold, full_sort, None)


# Kept over jnp.argmax: a 152k-vocabulary decode step takes a fifth less with it
# (scripts/bench.py --only=hand_tuned).
def _argmax(x):
    """First index of the maximum over the last axis: two plain reductions, which XLA:CPU
    runs several times faster than argmax's (value, index) reduction."""
    is_max = x == jnp.max(x, axis=-1, keepdims=True)
    return jnp.min(jnp.where(is_max, jnp.arange(x.shape[-1]), x.shape[-1]), axis=-1)


def sample_tokens(uniform, logits, config: SamplingConfig):
    """Draws one token per row by inverting the CDF of the sampling distribution.

    uniform: float32[B] in [0, 1) (unused when greedy); logits: float32[B, V].
    Returns (int32[B] tokens, float32[B] their log-probs under the sampling distribution).
    """
    logits = sampling_logits(logits, config)
    if config.greedy:
        tokens = _argmax(logits)
    else:
        probs = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))  # [B, V]
        # Kept over jax.random.categorical, whose B x V Gumbel draws double a 152k-vocabulary
        # decode (scripts/bench.py --only=hand_tuned).
        tokens = categorical.inverse_cdf(probs, uniform[:, None])[:, 0]
        # Rounding can land on a zero-probability (filtered) token: take the mode instead.
        picked = jnp.take_along_axis(probs, tokens[:, None], axis=-1)[:, 0]
        tokens = jnp.where(picked > 0, tokens, _argmax(logits))
    picked_logits = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
    token_logprobs = picked_logits - jax.nn.logsumexp(logits, axis=-1)
    return tokens.astype(jnp.int32), token_logprobs
