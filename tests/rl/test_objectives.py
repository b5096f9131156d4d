"""Tests for replax/rl/objectives.py against plain numpy references on a hand-made batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replax.rl.objectives import LossConfig, covariance_selection, group_advantages, policy_loss

# Three sequences of four tokens. log_ratio = log pi - log mu puts tokens on both sides
# of the clip range [0.8, 1.2]: exp(0.3) = 1.35, exp(-0.4) = 0.67, exp(1.2) = 3.3.
LOGPROBS = np.array(
    [[-1.0, -0.5, -2.0, -0.1], [-0.3, -1.2, -0.7, -0.9], [-2.5, -0.2, -1.0, -0.4]], np.float32
)
LOG_RATIO = np.array(
    [[0.3, -0.1, 0.0, 0.5], [-0.4, 0.1, 0.25, -0.05], [1.2, -0.3, 0.05, -0.02]], np.float32
)
BEHAVIOUR = LOGPROBS - LOG_RATIO
MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], np.float32)
ADVANTAGES = np.array([1.0, -0.5, -2.0], np.float32)
REWARDS = np.array([1.0, 0.0, 0.0], np.float32)
BASELINES = np.array([0.4, 0.6, 0.5], np.float32)


def numpy_token_loss(config, proximal=None):
    """Per-token loss [B, L] written directly from the formulas."""
    lp, mu, a = LOGPROBS, BEHAVIOUR, ADVANTAGES[:, None]
    ratio = np.exp(lp - mu)
    low, high = 1 - config.epsilon_low, 1 + config.epsilon_high

    def ppo(r):
        loss = -np.minimum(r * a, np.clip(r, low, high) * a)
        if config.dual_clip:  # 0: off
            loss = np.where(a < 0, np.minimum(loss, -config.dual_clip * a), loss)
        return loss

    if config.name == "reinforce":
        return -a * lp
    if config.name == "ppo":
        return ppo(ratio)
    if config.name == "tis":
        return -np.minimum(ratio, config.rho_max) * a * lp
    if config.name == "topr":
        return -np.where(a >= 0, 1.0, np.clip(ratio, 0, 1)) * a * lp
    if config.name == "asymre":
        return -(REWARDS - (BASELINES + config.asymre_delta_v))[:, None] * lp
    if config.name == "decoupled_ppo":
        proximal = lp if proximal is None else proximal
        return np.minimum(np.exp(proximal - mu), config.rho_max) * ppo(np.exp(lp - proximal))
    assert config.name == "m2po"
    return -ratio * a * numpy_m2po_keep(lp - mu, config.m2po_tau)


def numpy_m2po_keep(log_ratio, tau):
    """Greedy: drop the largest squared log ratio until the mean of the rest is <= tau."""
    keep = MASK.copy()
    while keep.sum() and (log_ratio**2 * keep).sum() / keep.sum() > tau:
        keep.flat[np.argmax(np.where(keep > 0, log_ratio**2, -1))] = 0
    return keep


def numpy_token_mean(x):
    return (x * MASK).sum() / MASK.sum()


def run_loss(config, logprobs_override=None, **kwargs):
    kwargs.setdefault("rewards", REWARDS)
    kwargs.setdefault("baselines", BASELINES)
    logprobs = LOGPROBS if logprobs_override is None else logprobs_override
    return policy_loss(logprobs, BEHAVIOUR, MASK, ADVANTAGES, config=config, **kwargs)


# ---------------------------------------------------------------- advantages


def test_group_advantages_match_numpy():
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0], np.float32)
    advantages, baseline = group_advantages(jnp.asarray(rewards), 4)
    groups = rewards.reshape(2, 4)
    mean, std = groups.mean(1, keepdims=True), groups.std(1, keepdims=True)
    np.testing.assert_allclose(advantages, ((groups - mean) / (std + 1e-6)).reshape(-1), rtol=1e-5)
    np.testing.assert_allclose(baseline, [0.5] * 4 + [0.75] * 4)
    dr_grpo, _ = group_advantages(jnp.asarray(rewards), 4, normalize_std=False)
    np.testing.assert_allclose(dr_grpo, [0.5, -0.5, -0.5, 0.5, 0.25, 0.25, -0.75, 0.25])
    constant, _ = group_advantages(jnp.ones(4), 2)
    np.testing.assert_array_equal(constant, 0.0)


def test_group_advantages_reject_bad_groups():
    with pytest.raises(ValueError, match="group_size > 1"):
        group_advantages(jnp.ones(4), 1)
    with pytest.raises(ValueError, match="5 rewards.*groups of 2"):
        group_advantages(jnp.ones(5), 2)
    advantages, baseline = group_advantages(jnp.array([1.0, 3.0]), 1, normalize_std=False)
    np.testing.assert_array_equal(advantages, 0.0)


# ---------------------------------------------------------------- losses vs numpy


@pytest.mark.parametrize(
    "config",
    [
        LossConfig("reinforce"),
        LossConfig("ppo"),
        LossConfig("ppo", epsilon_low=0.1, epsilon_high=0.28, dual_clip=3.0),
        LossConfig("tis", rho_max=1.3),
        LossConfig("topr"),
        LossConfig("asymre", asymre_delta_v=-0.1),
        LossConfig("decoupled_ppo", rho_max=1.3),
        LossConfig("m2po", m2po_tau=0.04),
        LossConfig("ppo", aggregation="sequence_mean"),
    ],
    ids=lambda c: f"{c.name}-{c.aggregation}-dual{c.dual_clip}",
)
def test_loss_and_metrics_match_numpy(config):
    loss, metrics = run_loss(config)
    token_loss = numpy_token_loss(config)
    if config.aggregation == "token_mean":
        expected = numpy_token_mean(token_loss)
    else:
        expected = ((token_loss * MASK).sum(1) / MASK.sum(1)).mean()
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"], expected, rtol=1e-5)

    ratio, a = np.exp(LOG_RATIO), ADVANTAGES[:, None]
    np.testing.assert_allclose(metrics["is_ratio_mean"], numpy_token_mean(ratio), rtol=1e-5)
    np.testing.assert_allclose(metrics["is_ratio_max"], np.exp(1.2), rtol=1e-5)
    w = np.exp((LOG_RATIO * MASK).sum(1))
    np.testing.assert_allclose(metrics["is_ess"], w.sum() ** 2 / (3 * (w**2).sum()), rtol=1e-5)
    if config.name == "ppo":
        low = numpy_token_mean((a < 0) & (ratio < 1 - config.epsilon_low))
        high = numpy_token_mean((a > 0) & (ratio > 1 + config.epsilon_high))
        assert low > 0 and high > 0  # the batch exercises both sides
        np.testing.assert_allclose(metrics["clip_frac_low"], low, rtol=1e-6)
        np.testing.assert_allclose(metrics["clip_frac_high"], high, rtol=1e-6)
        np.testing.assert_allclose(metrics["clip_frac"], low + high, rtol=1e-6)
    if config.name == "tis":
        np.testing.assert_allclose(
            metrics["clip_frac_high"], numpy_token_mean(ratio > config.rho_max), rtol=1e-6
        )
    if config.name == "m2po":
        keep = numpy_m2po_keep(LOG_RATIO, config.m2po_tau)
        assert 0 < keep.sum() < MASK.sum()  # some tokens masked, some kept
        np.testing.assert_allclose(metrics["m2po_mask_frac"], 1 - keep.sum() / MASK.sum())


def test_decoupled_ppo_with_a_given_proximal_policy():
    proximal = BEHAVIOUR + 0.5 * LOG_RATIO  # halfway between mu and pi
    config = LossConfig("decoupled_ppo", rho_max=1.3)
    loss, _ = run_loss(config, proximal_logprobs=proximal)
    expected = numpy_token_mean(numpy_token_loss(config, proximal=proximal))
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_kl_entropy_and_sample_weights_enter_the_loss():
    reference = LOGPROBS + 0.2 * LOG_RATIO[::-1]
    entropy = np.linspace(0.5, 2.0, 12, dtype=np.float32).reshape(3, 4)
    weights = np.array([0.5, 1.0, 2.0], np.float32)
    config = LossConfig("reinforce", kl_coef=0.1, entropy_coef=0.01)
    loss, metrics = run_loss(
        config, reference_logprobs=reference, entropy=entropy, sample_weights=weights
    )
    kl = np.exp(reference - LOGPROBS) - (reference - LOGPROBS) - 1
    token_loss = numpy_token_loss(config) + 0.1 * kl - 0.01 * entropy
    np.testing.assert_allclose(loss, numpy_token_mean(token_loss * weights[:, None]), rtol=1e-5)
    np.testing.assert_allclose(metrics["kl"], numpy_token_mean(kl), rtol=1e-5)
    np.testing.assert_allclose(metrics["entropy"], numpy_token_mean(entropy), rtol=1e-5)


@pytest.mark.parametrize("name", ["ppo", "asymre", "reinforce"])
def test_positive_weight_scales_the_policy_term_of_positive_sequences_only(name):
    # W-REINFORCE: positives (sequence 0: A = 1, and r - (b + dV) = 0.7 for asymre) weigh
    # lambda; negatives and the KL term are unchanged.
    reference = LOGPROBS + 0.2 * LOG_RATIO[::-1]
    weighted = LossConfig(name, positive_weight=0.1, kl_coef=0.1)
    loss, _ = run_loss(weighted, reference_logprobs=reference)
    kl = np.exp(reference - LOGPROBS) - (reference - LOGPROBS) - 1
    lam = np.array([0.1, 1.0, 1.0], np.float32)[:, None]
    expected = numpy_token_mean(lam * numpy_token_loss(weighted) + 0.1 * kl)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    plain, _ = run_loss(LossConfig(name, kl_coef=0.1), reference_logprobs=reference)
    assert abs(float(plain) - float(loss)) > 1e-3  # the weight changed the loss
    with pytest.raises(
        ValueError, match=r"^loss.positive_weight=0.0: must be a finite number > 0$"
    ):
        LossConfig(name, positive_weight=0.0)


def test_aggregation_modes_differ_as_specified():
    # Sequence 0 has 3 tokens, sequence 1 has 1: token_mean weighs tokens equally,
    # sequence_mean weighs sequences equally.
    logprobs = jnp.array([[-1.0, -1.0, -1.0], [-4.0, 0.0, 0.0]])
    mask = jnp.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    advantages = jnp.ones(2)

    def loss(aggregation):
        config = LossConfig("reinforce", aggregation=aggregation)
        return float(policy_loss(logprobs, logprobs, mask, advantages, config=config)[0])

    assert loss("token_mean") == pytest.approx((3 * 1.0 + 4.0) / 4)
    assert loss("sequence_mean") == pytest.approx((1.0 + 4.0) / 2)


def test_dual_clip_bounds_the_loss_of_stale_negative_tokens():
    logprobs = jnp.array([[-0.1, -0.2]])
    behaviour = logprobs - jnp.array([[6.0, 0.0]])  # ratio 403 on the first token
    mask, advantages = jnp.ones((1, 2)), jnp.array([-2.0])

    def loss(config, lp=logprobs):
        return policy_loss(lp, behaviour, mask, advantages, config=config)[0]

    unbounded = loss(LossConfig("ppo"))
    bounded = loss(LossConfig("ppo", dual_clip=3.0))
    assert unbounded == pytest.approx((np.exp(6.0) * 2.0 + 2.0) / 2, rel=1e-5)
    assert bounded == pytest.approx((3.0 * 2.0 + 2.0) / 2, rel=1e-5)
    # The bounded token passes no gradient; the ratio-1 token still does.
    grad = jax.grad(loss, argnums=1)(LossConfig("ppo", dual_clip=3.0), logprobs)
    np.testing.assert_allclose(grad, [[0.0, 2.0 / 2]], rtol=1e-6)


# ---------------------------------------------------------------- gradients


ON_POLICY_LOSSES = ["ppo", "tis", "topr", "decoupled_ppo", "m2po"]


@pytest.mark.parametrize("name", ON_POLICY_LOSSES)
def test_on_policy_gradient_equals_reinforce_wrt_logprobs(name):
    def loss(config, logprobs):
        return policy_loss(logprobs, LOGPROBS, MASK, ADVANTAGES, config=config)[0]

    grad = jax.grad(loss, argnums=1)(LossConfig(name), jnp.asarray(LOGPROBS))
    reinforce = jax.grad(loss, argnums=1)(LossConfig("reinforce"), jnp.asarray(LOGPROBS))
    np.testing.assert_allclose(grad, reinforce, rtol=1e-6)
    np.testing.assert_allclose(reinforce, -ADVANTAGES[:, None] * MASK / MASK.sum(), rtol=1e-6)


def test_on_policy_gradient_equals_reinforce_through_a_linear_softmax_policy():
    vocab, features = 5, 3
    kx, kw, kt = jax.random.split(jax.random.key(0), 3)
    inputs = jax.random.normal(kx, (3, 4, features))  # [B, L, D]
    weights = jax.random.normal(kw, (vocab, features))  # [V, D], the policy's parameter
    tokens = jax.random.randint(kt, (3, 4), 0, vocab)

    def token_logprobs(w):
        log_softmax = jax.nn.log_softmax(inputs @ w.T)  # [B, L, V]
        return jnp.take_along_axis(log_softmax, tokens[..., None], axis=-1)[..., 0]

    behaviour = token_logprobs(weights)  # generated by the same parameters: ratio 1

    def loss(w, name):
        config = LossConfig(name)
        return policy_loss(token_logprobs(w), behaviour, MASK, ADVANTAGES, config=config)[0]

    reinforce = jax.grad(loss)(weights, "reinforce")
    assert np.abs(reinforce).max() > 1e-3
    for name in ON_POLICY_LOSSES:
        np.testing.assert_allclose(jax.grad(loss)(weights, name), reinforce, atol=1e-6)


def test_gradient_flows_only_through_logprobs():
    def loss(logprobs, behaviour, advantages, reference):
        config = LossConfig("ppo", kl_coef=0.1)
        return policy_loss(
            logprobs, behaviour, MASK, advantages, config=config, reference_logprobs=reference
        )[0]

    args = (jnp.asarray(LOGPROBS), jnp.asarray(BEHAVIOUR), jnp.asarray(ADVANTAGES), LOGPROBS)
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(*args)
    assert np.abs(grads[0]).max() > 0
    for grad in grads[1:]:
        np.testing.assert_array_equal(grad, 0.0)


# ---------------------------------------------------------------- config errors


def test_loss_config_validates_itself():
    with pytest.raises(ValueError, match=r"^loss.name='grpo': allowed are \('ppo', 'tis', 'topr'"):
        LossConfig("grpo")
    with pytest.raises(
        ValueError, match=r"^loss.aggregation='sum': allowed are \('token_mean', 'sequence_mean'\)"
    ):
        LossConfig(aggregation="sum")
    with pytest.raises(
        ValueError, match=r"^loss.dual_clip=0.5: allowed are 0 \(off\) or a bound c > 1"
    ):
        LossConfig(dual_clip=0.5)
    with pytest.raises(ValueError, match="asymre loss needs rewards and baselines"):
        policy_loss(LOGPROBS, BEHAVIOUR, MASK, ADVANTAGES, config=LossConfig("asymre"))
    with pytest.raises(ValueError, match=r"mask has shape \(3, 3\)"):
        policy_loss(LOGPROBS, BEHAVIOUR, MASK[:, :3], ADVANTAGES, config=LossConfig())


def test_cov_cut_cuts_the_gradient_of_the_largest_covariance_tokens():
    # Clip-Cov: with 9 valid tokens and frac 0.25, the 2 of largest positive covariance
    # (log pi - mean) x (A - mean) lose their gradient, the loss value is unchanged.
    lp, a = LOGPROBS, np.broadcast_to(ADVANTAGES[:, None], LOGPROBS.shape)
    mean = lambda x: (x * MASK).sum() / MASK.sum()
    cov = np.where(MASK > 0, (lp - mean(lp)) * (a - mean(a)), -np.inf)
    cut = np.zeros(cov.size, bool)
    cut[np.argsort(-cov.reshape(-1), kind="stable")[:2]] = True
    cut = cut.reshape(cov.shape) & (cov > 0)
    assert cut.sum() == 2
    config = LossConfig("ppo", cov_cut_frac=0.25)
    grad = jax.grad(lambda x: run_loss(config, logprobs_override=x)[0])
    plain = jax.grad(lambda x: run_loss(LossConfig("ppo"), logprobs_override=x)[0])
    g, g0 = np.asarray(grad(jnp.asarray(LOGPROBS))), np.asarray(plain(jnp.asarray(LOGPROBS)))
    np.testing.assert_allclose(g[cut], 0.0)
    np.testing.assert_allclose(g[~cut], g0[~cut], rtol=1e-6)
    assert np.abs(g0[cut]).min() > 0  # the cut tokens had a gradient
    loss, metrics = run_loss(config)
    np.testing.assert_allclose(loss, run_loss(LossConfig("ppo"))[0], rtol=1e-6)
    np.testing.assert_allclose(metrics["cov_cut_frac"], 2 / MASK.sum(), rtol=1e-6)
    with pytest.raises(
        ValueError, match=r"^loss.cov_cut_frac=1.0: must be a finite number >= 0 and < 1$"
    ):
        LossConfig(cov_cut_frac=1.0)


# ---------------------------------------------------------------- covariance options


def numpy_covariance(lp, advantages, mask):
    """(log pi - mean) x (A - mean) per token, both means over the valid tokens only."""
    a = np.broadcast_to(advantages[:, None], lp.shape)
    valid = mask > 0
    return (lp - lp[valid].mean()) * (a - a[valid].mean())


def numpy_largest(cov, mask, count, positive_only):
    """bool[B, L]: the `count` valid tokens of largest covariance (positive ones only if
    asked), ties to the first in flat order."""
    eligible = (mask > 0) & ((cov > 0) if positive_only else True)
    order = np.argsort(-np.where(eligible, cov, -np.inf).reshape(-1), kind="stable")
    chosen = np.zeros(cov.size, bool)
    chosen[order[: int(count)]] = True
    return chosen.reshape(cov.shape) & eligible


def loss_grad(config, lp, behaviour, mask, advantages, **kwargs):
    """(loss, d loss / d log pi) of policy_loss as numpy arrays."""
    fn = lambda x: policy_loss(x, behaviour, mask, advantages, config=config, **kwargs)[0]
    loss, grad = jax.value_and_grad(fn)(jnp.asarray(lp))
    return float(loss), np.asarray(grad)


def test_covariance_means_ignore_padding():
    # The same valid tokens, padded once to 4 positions with the log-prob 0 and once to 7
    # with -30: were the padding in the means, m_lp would move from about -0.9 to about
    # -12 and every valid token's covariance would take the sign of A - m_A alone. REINFORCE:
    # every valid token has a gradient, -A / N, but the cut ones.
    config = LossConfig("reinforce", cov_cut_frac=0.25)
    wide = lambda x, fill: np.concatenate([x, np.full((3, 3), fill, np.float32)], axis=1)
    lp_short, lp_long = np.where(MASK > 0, LOGPROBS, 0.0), np.where(MASK > 0, LOGPROBS, -30.0)
    mask_long, lp_long = wide(MASK, 0.0), wide(lp_long, -30.0)
    behaviour_long = wide(np.where(MASK > 0, BEHAVIOUR, 5.0), 5.0)
    short = loss_grad(config, lp_short, BEHAVIOUR, MASK, ADVANTAGES)
    long = loss_grad(config, lp_long, behaviour_long, mask_long, ADVANTAGES)
    np.testing.assert_allclose(long[0], short[0], rtol=1e-6)
    # The cut is the same 2 tokens: the gradient of every valid token agrees.
    np.testing.assert_allclose(long[1][:, :4] * MASK, short[1] * MASK, rtol=1e-6, atol=1e-7)
    cut = numpy_largest(numpy_covariance(LOGPROBS, ADVANTAGES, MASK), MASK, 2, True)
    np.testing.assert_array_equal(short[1][cut], 0.0)
    assert np.abs(short[1][(MASK > 0) & ~cut]).min() > 0


def test_cov_cut_matches_numpy_on_a_larger_batch():
    # 6 sequences of 10 with ragged padding: floor(0.1 x valid) tokens of largest positive
    # covariance lose their gradient, every other valid token keeps plain PPO's.
    rng = np.random.default_rng(0)
    lp = -rng.uniform(0.05, 3.0, (6, 10)).astype(np.float32)
    behaviour = lp - rng.normal(0, 0.1, (6, 10)).astype(np.float32)
    mask = (np.arange(10)[None, :] < np.array([10, 4, 7, 9, 2, 6])[:, None]).astype(np.float32)
    advantages = rng.normal(size=6).astype(np.float32)
    config = LossConfig("ppo", cov_cut_frac=0.1)
    cut = numpy_largest(numpy_covariance(lp, advantages, mask), mask, 0.1 * mask.sum() // 1, True)
    assert cut.sum() == 3
    _, grad = loss_grad(config, lp, behaviour, mask, advantages)
    _, plain = loss_grad(LossConfig("ppo"), lp, behaviour, mask, advantages)
    np.testing.assert_array_equal(grad[cut], 0.0)
    np.testing.assert_allclose(grad[~cut], plain[~cut], rtol=1e-6)


# A batch whose covariances span the paper's band (1, 5): advantages of a few units and
# log-probs spread over a few nats.
BAND_RNG = np.random.default_rng(1)
BAND_LP = -BAND_RNG.uniform(0.0, 6.0, (8, 12)).astype(np.float32)
BAND_BEHAVIOUR = BAND_LP - BAND_RNG.normal(0, 0.3, (8, 12)).astype(np.float32)
BAND_MASK = (np.arange(12)[None, :] < BAND_RNG.integers(3, 13, 8)[:, None]).astype(np.float32)
BAND_ADV = BAND_RNG.normal(0, 2.0, 8).astype(np.float32)
BAND_COV = numpy_covariance(BAND_LP, BAND_ADV, BAND_MASK)
IN_BAND = (BAND_MASK > 0) & (BAND_COV > 1.0) & (BAND_COV < 5.0)


def clip_cov_selected(config, key):
    return np.asarray(
        covariance_selection(BAND_LP, BAND_ADV, BAND_MASK, config, jax.random.key(key))
    ).astype(bool)


def test_clip_cov_draws_its_count_in_the_band_at_random():
    num_valid = int(BAND_MASK.sum())
    assert IN_BAND.sum() >= 10 and (BAND_MASK > 0).sum() > IN_BAND.sum()
    config = LossConfig("ppo", clip_cov_ratio=0.1)
    draws = [clip_cov_selected(config, key) for key in range(8)]
    for selected in draws:
        assert selected.sum() == max(1, int(0.1 * num_valid))
        assert not (selected & ~IN_BAND).any()  # every drawn token lies in the band
    np.testing.assert_array_equal(clip_cov_selected(config, 3), draws[3])  # the key fixes it
    assert len({d.tobytes() for d in draws}) > 1  # and different keys draw differently
    # Over many draws every band token is drawn: the draw is not a fixed ranking.
    hits = sum(clip_cov_selected(config, key) for key in range(64))
    assert (hits[IN_BAND] > 0).all()
    # A ratio past the band's size takes the whole band; the paper's 2e-4 takes one token.
    np.testing.assert_array_equal(clip_cov_selected(LossConfig(clip_cov_ratio=0.9), 0), IN_BAND)
    assert clip_cov_selected(LossConfig(clip_cov_ratio=2e-4), 0).sum() == 1
    narrow = LossConfig(clip_cov_ratio=0.5, clip_cov_low=2.0, clip_cov_high=3.0)
    chosen = clip_cov_selected(narrow, 0)
    assert chosen.any() and (BAND_COV[chosen] > 2.0).all() and (BAND_COV[chosen] < 3.0).all()


def test_clip_cov_gradient_with_the_draw_fixed_matches_numpy():
    # The drawn tokens lose their gradient and keep their loss value; on the others PPO's
    # numpy gradient: d/d lp of -min(r A, clip(r) A) is -r A where unclipped, else 0.
    config = LossConfig("ppo", clip_cov_ratio=0.1)
    key = jax.random.key(5)
    selected = np.asarray(covariance_selection(BAND_LP, BAND_ADV, BAND_MASK, config, key)) > 0
    loss, grad = loss_grad(config, BAND_LP, BAND_BEHAVIOUR, BAND_MASK, BAND_ADV, covariance_key=key)
    ratio = np.exp(BAND_LP - BAND_BEHAVIOUR)
    a = np.broadcast_to(BAND_ADV[:, None], ratio.shape)
    unclipped = (ratio * a) <= (np.clip(ratio, 0.8, 1.2) * a)
    numpy_grad = np.where(unclipped, -ratio * a, 0.0) * BAND_MASK / BAND_MASK.sum()
    numpy_grad[selected] = 0.0
    np.testing.assert_allclose(grad, numpy_grad, rtol=1e-5, atol=1e-7)
    assert np.abs(np.where(unclipped, ratio * a, 0.0)[selected]).min() > 0  # they had one
    numpy_loss = (-np.minimum(ratio * a, np.clip(ratio, 0.8, 1.2) * a) * BAND_MASK).sum()
    np.testing.assert_allclose(loss, numpy_loss / BAND_MASK.sum(), rtol=1e-5)
    # The selection passed in is the one used (a microbatch gets the whole batch's).
    _, given = loss_grad(
        config, BAND_LP, BAND_BEHAVIOUR, BAND_MASK, BAND_ADV, covariance_selected=selected
    )
    np.testing.assert_allclose(given, grad, rtol=1e-6)
    with pytest.raises(ValueError, match="give covariance_key"):
        loss_grad(config, BAND_LP, BAND_BEHAVIOUR, BAND_MASK, BAND_ADV)


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_kl_cov_matches_numpy(aggregation):
    # KL-Cov: coef |lp - mu| on the max(1, floor(k N)) valid tokens of largest covariance.
    k, coef = 0.05, 2.0
    config = LossConfig("ppo", kl_cov_frac=k, kl_cov_coef=coef, aggregation=aggregation)
    plain = LossConfig("ppo", aggregation=aggregation)
    chosen = numpy_largest(BAND_COV, BAND_MASK, max(1, int(k * BAND_MASK.sum())), False)
    assert chosen.sum() == int(k * BAND_MASK.sum()) >= 2
    loss, grad = loss_grad(config, BAND_LP, BAND_BEHAVIOUR, BAND_MASK, BAND_ADV)
    loss0, grad0 = loss_grad(plain, BAND_LP, BAND_BEHAVIOUR, BAND_MASK, BAND_ADV)
    log_ratio = BAND_LP - BAND_BEHAVIOUR
    # What each token's loss gains, and its weight in the batch's mean.
    if aggregation == "token_mean":
        weight = BAND_MASK / BAND_MASK.sum()
    else:
        weight = BAND_MASK / BAND_MASK.sum(axis=1, keepdims=True) / BAND_MASK.shape[0]
    np.testing.assert_allclose(
        loss - loss0, (coef * np.abs(log_ratio) * chosen * weight).sum(), rtol=1e-5
    )
    np.testing.assert_allclose(
        grad - grad0, coef * np.sign(log_ratio) * chosen * weight, rtol=1e-5, atol=1e-7
    )
    _, metrics = policy_loss(BAND_LP, BAND_BEHAVIOUR, BAND_MASK, BAND_ADV, config=config)
    np.testing.assert_allclose(metrics["kl_cov_frac"], chosen.sum() / BAND_MASK.sum(), rtol=1e-6)


def test_covariance_options_validate_themselves():
    with pytest.raises(
        ValueError,
        match=r"^loss.cov_cut_frac=0.2 and loss.kl_cov_frac=0.01: at most one covariance",
    ):
        LossConfig(cov_cut_frac=0.2, kl_cov_frac=0.01)
    with pytest.raises(
        ValueError,
        match=r"^loss.clip_cov_ratio=0.01 and loss.kl_cov_frac=0.01: at most one covariance",
    ):
        LossConfig(clip_cov_ratio=0.01, kl_cov_frac=0.01)
    with pytest.raises(
        ValueError,
        match=r"^loss.clip_cov_low=5.0 with loss.clip_cov_high=5.0: .* needs low < high$",
    ):
        LossConfig(clip_cov_ratio=0.01, clip_cov_low=5.0)
    with pytest.raises(
        ValueError, match=r"^loss.clip_cov_ratio=1.5: must be a finite number >= 0 and <= 1$"
    ):
        LossConfig(clip_cov_ratio=1.5)
    with pytest.raises(ValueError, match=r"^loss.kl_cov_coef=-1.0: must be a finite number >= 0$"):
        LossConfig(kl_cov_frac=0.01, kl_cov_coef=-1.0)


def test_without_covariance_turns_every_covariance_option_off_and_nothing_else():
    for option in ("cov_cut_frac", "clip_cov_ratio", "kl_cov_frac"):
        config = LossConfig(**{option: 0.2}, epsilon_low=0.1)
        plain = config.without_covariance()
        assert config.covariance_option == option and plain.covariance_option is None
        assert plain == LossConfig(epsilon_low=0.1)
        logprobs = jnp.log(jnp.full((2, 3), 0.5))
        assert float(covariance_selection(logprobs, jnp.array([1.0, -1.0]), jnp.ones((2, 3)),
                                          plain).sum()) == 0.0  # fmt: skip
