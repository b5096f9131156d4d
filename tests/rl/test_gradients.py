"""Tests for replax/rl/gradients.py's `make_gradient_fn` on one device: the loss against
numpy, the gradient against the slope of the loss; the same gradient and metrics from
microbatches (one of them with no valid token) and from chunked log-probs; padding that
changes nothing. (tests/rl/test_train_step.py checks these options through the sharded
train step; each compile here costs seconds, so the file keeps to three.)"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY, numpy_params

from replax.model import flops
from replax.model import transformer as model_lib
from replax.rl import gradients, objectives

MODEL = model_lib.Transformer(TINY)
# 4 rows of 12 tokens: prompts of up to 4 tokens left-padded, completions after them.
BATCH, LENGTH, PROMPT = 4, 12, 4
TEMPERATURE, VOCAB = 0.7, 60  # ids >= 60 are never sampled: masked out of the log-probs
LOSS = objectives.LossConfig(name="ppo", kl_coef=0.5, entropy_coef=0.05)


def make_batch(seed, prompt_lengths=(4, 2, 3, 1), completion_lengths=(6, 3, 8, 5)):
    """Rollouts as the train step takes them; behaviour log-probs near the policy's (so
    some ratios fall inside the clip range, some outside) and unequal importance weights."""
    rng = np.random.default_rng(seed)
    column = np.arange(LENGTH)[None, :]
    prompt_len, completion_len = np.array(prompt_lengths), np.array(completion_lengths)
    prompt = (column < PROMPT) & (column >= PROMPT - prompt_len[:, None])
    completion = (column >= PROMPT) & (column < PROMPT + completion_len[:, None])
    mask = prompt | completion
    return {
        "tokens": np.where(mask, rng.integers(1, VOCAB, (BATCH, LENGTH)), 0).astype(np.int32),
        "attention_mask": mask,
        "loss_mask": completion.astype(np.float32),
        "behaviour_logprobs": (-rng.uniform(3.5, 4.5, (BATCH, LENGTH)) * completion).astype(
            np.float32
        ),
        "advantage": rng.normal(size=BATCH).astype(np.float32),
        "reward": rng.integers(0, 2, BATCH).astype(np.float32),
        "baseline": np.full(BATCH, 0.5, np.float32),
        "importance_weights": rng.uniform(0.5, 1.5, BATCH).astype(np.float32),
    }


def random_params(seed):
    return numpy_params(MODEL, seed, scale=0.2)


@pytest.fixture(scope="module")
def params():
    """(policy params, reference params): a random model and one near it."""
    policy, noise = random_params(0), random_params(1)
    return policy, jax.tree.map(lambda p, n: p + 0.1 * (n - np.round(n)), policy, noise)


@functools.cache
def gradient_fn(loss=LOSS, **options):
    """The jitted (params, reference_params, batch) -> (grads, metrics), one per setting."""
    options = {"temperature": TEMPERATURE, "vocab_size": VOCAB, **options}
    return jax.jit(gradients.make_gradient_fn(MODEL, loss, **options))


def assert_same(got, expected, rtol=1e-5, atol=1e-6):
    (grads, metrics), (expected_grads, expected_metrics) = got, expected
    assert metrics.keys() == expected_metrics.keys()
    for key in metrics:
        np.testing.assert_allclose(
            metrics[key], expected_metrics[key], rtol=rtol, atol=atol, err_msg=key
        )
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=rtol, atol=atol), grads, expected_grads
    )


# ---------------------------------------------------------------- references


@jax.jit
def policy_logits(params, batch):
    positions = model_lib.positions_from_mask(batch["attention_mask"])
    return MODEL.apply({"params": params}, batch["tokens"], positions, batch["attention_mask"])


def numpy_logprobs_and_entropy(params, batch):
    """float64 [B, L] log-prob of each token given those before it (0 at t = 0) and the
    entropy of the distribution it was drawn from: logits / temperature over ids < VOCAB."""
    logits = np.asarray(policy_logits(params, batch), np.float64)[:, :-1] / TEMPERATURE
    logits[..., VOCAB:] = -np.inf
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, batch["tokens"][:, 1:, None], -1)[..., 0]
    probs = np.exp(logp)
    entropy = -np.sum(probs * np.where(probs > 0, logp, 0.0), -1)
    pad = lambda x: np.pad(x, ((0, 0), (1, 0)))  # noqa: E731
    return pad(picked), pad(entropy)


def near_policy(params, batch):
    """Behaviour log-probs 0.3 nats about the policy's: some ratios clipped, some not."""
    logprobs, _ = numpy_logprobs_and_entropy(params, batch)
    noise = np.random.default_rng(0).normal(0, 0.3, logprobs.shape)
    return ((logprobs + noise) * batch["loss_mask"]).astype(np.float32)


def test_loss_and_metrics_match_numpy(params):
    policy, reference = params
    batch = make_batch(0)
    batch["behaviour_logprobs"] = near_policy(policy, batch)
    logprobs, entropy = numpy_logprobs_and_entropy(policy, batch)
    _, metrics = gradient_fn()(policy, reference, batch)
    reference_logprobs, _ = numpy_logprobs_and_entropy(reference, batch)
    mask, advantage = batch["loss_mask"], batch["advantage"][:, None]
    ratio = np.exp(logprobs - batch["behaviour_logprobs"])
    ppo = -np.minimum(ratio * advantage, np.clip(ratio, 0.8, 1.2) * advantage)
    kl = np.exp(reference_logprobs - logprobs) - (reference_logprobs - logprobs) - 1
    token_loss = ppo + 0.5 * kl - 0.05 * entropy
    weighted = token_loss * mask * batch["importance_weights"][:, None]
    token_mean = lambda x: (x * mask).sum() / mask.sum()  # noqa: E731
    np.testing.assert_allclose(metrics["loss"], weighted.sum() / mask.sum(), rtol=1e-5)
    np.testing.assert_allclose(metrics["kl"], token_mean(kl), rtol=1e-4)
    np.testing.assert_allclose(metrics["entropy"], token_mean(entropy), rtol=1e-5)
    np.testing.assert_allclose(metrics["is_ratio_mean"], token_mean(ratio), rtol=1e-5)
    outside = (ratio < 0.8) | (ratio > 1.2)
    assert 0 < token_mean(outside) < 1  # the batch has clipped and unclipped tokens
    # Entropy is larger than a vocabulary of one and below a uniform one over ids < 60.
    assert 0 < float(metrics["entropy"]) < np.log(VOCAB)


def tree_dot(a, b):
    return sum(np.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_gradient_is_the_slope_of_the_loss(params):
    """The loss's slope along the gradient is the gradient's norm, and along another
    direction its dot product with the gradient: central differences of the loss the
    function reports, a step of 1e-3 each way."""
    policy, reference = params
    batch = make_batch(1, completion_lengths=(6, 0, 8, 2))  # a row with nothing to learn
    batch["behaviour_logprobs"] = near_policy(policy, batch)
    grads = jax.device_get(gradient_fn()(policy, reference, batch)[0])
    norm = np.sqrt(tree_dot(grads, grads))
    assert norm > 1e-2  # a gradient worth checking
    rng = np.random.default_rng(7)
    other = jax.tree.map(lambda x: rng.normal(size=x.shape), policy)
    other = jax.tree.map(lambda x: x / np.sqrt(tree_dot(other, other)), other)
    along_gradient = jax.tree.map(lambda g: g / norm, grads)
    step = 1e-3
    # Along the gradient the slope is large and the difference exact to ~1e-3; along a
    # random direction it is small, and a missing part of the gradient (the entropy
    # bonus's, say) moves it by ~10%.
    checks = ((along_gradient, norm, 5e-3), (other, tree_dot(grads, other), 0.05))
    for direction, slope, rtol in checks:

        def loss_at(sign, direction=direction):
            moved = jax.tree.map(
                lambda p, d: (p + sign * step * d).astype(np.float32), policy, direction
            )
            return float(gradient_fn()(moved, reference, batch)[1]["loss"])

        central = (loss_at(1) - loss_at(-1)) / (2 * step)
        np.testing.assert_allclose(central, slope, rtol=rtol, atol=1e-5 * norm)


# ---------------------------------------------------------------- memory options


def test_microbatches_give_the_one_batch_gradient_and_metrics(params):
    """Microbatch j takes rows j, j + 2, ...: rows 1 and 3 have no completion token, so
    one microbatch has no valid token (it adds nothing, and the other's share is all the
    batch's tokens); then uneven ones, rows 0 and 2 (14 tokens) against 1 and 3 (3)."""
    policy, reference = params
    for seed, completion_lengths in ((2, (6, 0, 8, 0)), (3, (6, 1, 8, 2))):
        batch = make_batch(seed, completion_lengths=completion_lengths)
        one = gradient_fn()(policy, reference, batch)
        split = gradient_fn(num_microbatches=2)(policy, reference, batch)
        assert split[0]["embedding"].dtype == jnp.float32  # accumulated in float32
        assert_same(split, one, rtol=1e-4, atol=1e-5)


def test_chunked_logprobs_give_the_unchunked_gradient(params):
    """11 predicting positions in chunks of 3, the last one padded; temperature and the
    vocabulary mask applied in each chunk as on the whole logits."""
    policy, reference = params
    batch = make_batch(4)
    assert_same(
        gradient_fn(logits_chunk_size=3)(policy, reference, batch),
        gradient_fn()(policy, reference, batch),
        rtol=1e-4,
        atol=1e-5,
    )


def test_padding_and_positions_outside_the_loss_change_nothing(params):
    """Padding tokens (outside the attention mask) and the behaviour log-probs of tokens
    outside the loss mask are not read: changing them leaves the loss, every metric and
    the gradient as they were. A completion token, by contrast, moves them."""
    policy, reference = params
    batch = make_batch(5)
    expected = jax.device_get(gradient_fn()(policy, reference, batch))
    rng = np.random.default_rng(0)
    changed = dict(batch)
    pad = ~batch["attention_mask"]
    assert pad[:, :PROMPT].any() and pad[:, PROMPT:].any()  # left and right padding
    changed["tokens"] = np.where(
        pad, rng.integers(0, TINY.vocab_size, pad.shape), batch["tokens"]
    ).astype(np.int32)
    outside = batch["loss_mask"] == 0
    changed["behaviour_logprobs"] = np.where(
        outside, rng.normal(size=outside.shape) * 5, batch["behaviour_logprobs"]
    ).astype(np.float32)
    assert_same(jax.device_get(gradient_fn()(policy, reference, changed)), expected, atol=1e-7)

    moved = dict(batch)
    moved["tokens"] = batch["tokens"].copy()
    moved["tokens"][0, PROMPT + 2] = (batch["tokens"][0, PROMPT + 2] % (VOCAB - 1)) + 1
    grads, metrics = gradient_fn()(policy, reference, moved)
    assert abs(float(metrics["loss"]) - float(expected[1]["loss"])) > 1e-6
    assert not np.allclose(grads["embedding"], expected[0]["embedding"], atol=1e-6)


# ---------------------------------------------------------------- covariance options' passes


def without_passes(result):
    grads, metrics = result
    return grads, {k: v for k, v in metrics.items() if not k.endswith("_passes")}


@pytest.mark.parametrize(
    "loss",
    [
        objectives.LossConfig(name="ppo", kl_cov_frac=0.02, kl_cov_coef=5.0),
        objectives.LossConfig(name="ppo", cov_cut_frac=0.035, aggregation="sequence_mean"),
        # A band wide enough for the test batch's small covariances.
        objectives.LossConfig(
            name="tis", clip_cov_ratio=0.001, clip_cov_low=0.0, clip_cov_high=100.0
        ),
    ],
    ids=["kl_cov", "cov_cut", "clip_cov"],
)
def test_microbatches_add_the_covariance_part_afterwards(params, loss):
    """With few tokens to choose (one of the 32 valid here, at most one of the 48 any batch
    of 4 x 12 can hold) the microbatches take the loss without the option, and a forward
    and backward of the one row that holds the chosen token adds the option's part: the
    single pass's gradient and metrics, and a quarter of the batch more in each direction."""
    policy, _ = params
    batch = make_batch(6, completion_lengths=(8, 8, 8, 8))
    batch["behaviour_logprobs"] = near_policy(policy, batch)
    how = gradients.covariance_pass(loss, num_microbatches=2, rows=BATCH, length=LENGTH)
    assert how == "correction"
    key = jax.random.key(3)
    one = gradient_fn(loss)(policy, None, batch, key)
    split = gradient_fn(loss, num_microbatches=2)(policy, None, batch, key)
    option = loss.covariance_option
    assert float(one[1][option]) == 1 / 32  # the option acted on one token
    assert_same(without_passes(split), without_passes(one), rtol=1e-4, atol=1e-5)
    assert (float(one[1]["forward_passes"]), float(one[1]["backward_passes"])) == (1.0, 1.0)
    assert (float(split[1]["forward_passes"]), float(split[1]["backward_passes"])) == (1.25, 1.25)


def matmul_flops(jaxpr, while_trips: int) -> float:
    """The FLOPs of a jaxpr's dot_generals, a scan's body counted `length` times and a while
    loop's body while_trips times (the loop's bound is known only when it runs)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contracting, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            out = eqn.outvars[0].aval.shape
            total += 2.0 * np.prod(out) * np.prod([lhs[d] for d in contracting])
            continue
        times = {"scan": eqn.params.get("length"), "while": while_trips}.get(eqn.primitive.name)
        for name, value in eqn.params.items():
            if name == "cond_jaxpr":
                continue
            for sub in value if isinstance(value, tuple) else (value,):
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's own
                if isinstance(sub, jax.extend.core.Jaxpr):
                    total += (times or 1) * matmul_flops(sub, while_trips)
    return total


def test_the_counted_passes_are_the_matmuls_the_step_runs(params):
    """flops.train_flops of train_passes against the matmul FLOPs in the gradient's own
    program (loops multiplied out): the plain loss in 2 microbatches (3 forwards' worth),
    KL-Cov ranking a fifth of the tokens first (a whole forward more: 4), KL-Cov ranking one
    token afterwards (a forward and backward of its row, 1 of 4, more: 3.75)."""
    policy, _ = params
    batch = make_batch(7, completion_lengths=(8, 8, 8, 8))
    cases = {
        "plain": (objectives.LossConfig(name="ppo"), 0, 3.0),
        "forward": (objectives.LossConfig(name="ppo", kl_cov_frac=0.2), 0, 4.0),
        "correction": (objectives.LossConfig(name="ppo", kl_cov_frac=0.02), 1, 3.75),
    }
    per_pass = BATCH * LENGTH * flops.forward_flops_per_token(TINY, LENGTH)
    for name, (loss, trips, forwards) in cases.items():
        gradient = gradients.make_gradient_fn(
            MODEL, loss, temperature=TEMPERATURE, vocab_size=VOCAB, num_microbatches=2
        )
        program = jax.make_jaxpr(gradient)(policy, None, batch, None)
        passes = gradients.train_passes(
            loss, num_microbatches=2, rows=BATCH, length=LENGTH, corrected_rows=trips
        )
        counted = flops.train_flops(TINY, BATCH, LENGTH, passes)
        assert counted == forwards * per_pass, name
        np.testing.assert_allclose(matmul_flops(program.jaxpr, trips), counted, err_msg=name)
