"""Advantages, off-policy corrections and policy losses for replayed rollouts.

Shapes: R rollouts, G group size, B sequences in a batch, L tokens per sequence.
The per-token math is written for one sequence and vmapped over the batch; the parts
that need the whole batch (the M2PO mask, aggregation, metrics) come after.

Log-probabilities: `logprobs` is the current policy pi_theta (the only input gradients
flow through, besides `entropy` when entropy_coef > 0); `behaviour_logprobs` is mu, the
policy that generated the rollout, frozen at generation; `proximal_logprobs` is AReaL's
pi_prox; `reference_logprobs` the KL anchor. Losses are to be minimised.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from replax.core.config_utils import number, one_of, require

LOSSES = ("ppo", "tis", "topr", "asymre", "decoupled_ppo", "m2po", "reinforce")
AGGREGATIONS = ("token_mean", "sequence_mean")
# Alternative answers to the same entropy collapse (two cut the same tokens' gradient, the
# third pulls them back): LossConfig allows one at a time. Each is also its metric's name.
COVARIANCE_OPTIONS = ("cov_cut_frac", "clip_cov_ratio", "kl_cov_frac")


def group_advantages(rewards, group_size: int, *, normalize_std: bool = True, eps: float = 1e-6):
    """Group-relative advantages. rewards: float[R], groups are consecutive runs of
    group_size. Returns (advantages [R], baseline [R] = the group's mean reward).

    normalize_std=True is GRPO, (r - mean) / (std + eps) with the population std;
    False is Dr.GRPO, r - mean.
    """
    num_rollouts = rewards.shape[0]
    if group_size < 1 or num_rollouts % group_size:
        raise ValueError(f"{num_rollouts} rewards do not split into groups of {group_size}")
    if normalize_std and group_size == 1:
        raise ValueError("normalize_std needs group_size > 1: a group of one has no spread")
    grouped = rewards.reshape(-1, group_size)  # [R / G, G]
    baseline = jnp.broadcast_to(grouped.mean(axis=1, keepdims=True), grouped.shape)
    advantages = grouped - baseline
    if normalize_std:
        advantages = advantages / (grouped.std(axis=1, keepdims=True) + eps)
    return advantages.reshape(-1), baseline.reshape(-1)


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Which policy loss, and its constants.

    name: `ppo` (clip pi / mu to [1 - epsilon_low, 1 + epsilon_high]; with dual_clip = c
      the loss of a negative-advantage token is at most c |A|), `tis` (sg(min(pi / mu,
      rho_max)) A log pi), `topr` (no IS weight for A >= 0, sg(clip(pi / mu, 0, 1)) for
      A < 0), `asymre` ((r - (baseline + asymre_delta_v)) log pi, no ratio), `decoupled_ppo`
      (clip pi / pi_prox, reweight by sg(min(pi_prox / mu, rho_max))), `m2po` (A pi / mu,
      unclipped, over the tokens left once the largest squared log ratios are masked until
      their batch mean is <= m2po_tau), `reinforce` (A log pi).
    positive_weight: lambda, the weight of a rollout whose advantage (for `asymre`, whose
      r - (baseline + asymre_delta_v)) is positive; negatives keep weight 1. Below 1 it is
      W-REINFORCE's down-weighting of positive samples (Zhu et al. 2025): reinforcing
      answers that are already likely is what lowers the policy's entropy.
    Covariance options (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning
    LMs"), at most one of them on. Each picks among the batch's valid completion tokens by
    the covariance (log pi - m_lp) x (A - m_A), m_lp and m_A the means of log pi and of the
    rollout's advantage over the batch's valid tokens (padding takes no part in either
    mean). A token's covariance is positive when its rollout is above the mean advantage
    and the token more likely than the mean token (a confident token of a good rollout),
    or when its rollout is below the mean and the token less likely than the mean (an
    unlikely token of a bad rollout): the updates of both lower the entropy. With
    train.num_microbatches > 1 the tokens are picked over the whole batch, as in one pass
    (`replax.rl.gradients.covariance_pass`: a forward and backward of the few rows that
    hold them after the microbatches, or a forward of the batch before them).
    cov_cut_frac: the gradient of the floor(frac x N) valid tokens of largest positive
      covariance is cut (N the batch's valid tokens), their loss value kept: a
      deterministic cut, with no band, not the paper's Clip-Cov.
    clip_cov_ratio: the paper's Clip-Cov (r, 2e-4 there): max(1, floor(r x N)) tokens drawn
      uniformly at random, without replacement, among the valid tokens whose covariance
      lies in the open band (clip_cov_low, clip_cov_high) (1 and 5 there), all of them if
      the band holds fewer, lose their gradient (value kept). The draw takes a PRNG key
      (`policy_loss`'s covariance_key; the train step's is fold_in(key(0), step): one key
      per step, whatever the seed, and the same after a resume). Unlike the authors' code,
      tokens PPO already clips may be drawn.
    kl_cov_frac: the paper's KL-Cov (k, 2e-3 at 7B): the max(1, floor(k x N)) valid tokens
      of largest covariance get kl_cov_coef x |log pi - log mu| added to their loss (beta,
      1 there), mu the behaviour policy. The paper's KL-Cov replaces PPO's clip; here the
      term is added to whichever loss `name` is.
    kl_coef: weight of the k3 estimate of KL(pi || reference). entropy_coef: weight of the
      entropy bonus. aggregation: `token_mean` (sum over all tokens / tokens in the batch)
      or `sequence_mean` (mean over each sequence's tokens, then over sequences).
    """

    name: str = "ppo"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    # 0: off; else c > 1.
    dual_clip: float = 0.0
    rho_max: float = 2.0
    asymre_delta_v: float = -0.1
    m2po_tau: float = 0.04
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    aggregation: str = "token_mean"
    # Group advantages divided by the group's std (GRPO), or not (Dr.GRPO).
    normalize_std: bool = True
    positive_weight: float = 1.0
    cov_cut_frac: float = 0.0
    clip_cov_ratio: float = 0.0
    clip_cov_low: float = 1.0
    clip_cov_high: float = 5.0
    kl_cov_frac: float = 0.0
    kl_cov_coef: float = 1.0

    def __post_init__(self):
        # Messages name the config key (loss.*): a run's config section is this type.
        one_of("loss.name", self.name, LOSSES)
        one_of("loss.aggregation", self.aggregation, AGGREGATIONS)
        one_of("loss.normalize_std", self.normalize_std, (False, True))
        number("loss.epsilon_low", self.epsilon_low, low=0, high=1, high_open=True)
        for key in ("epsilon_high", "dual_clip", "kl_coef"):
            number(f"loss.{key}", getattr(self, key), low=0)
        require(
            self.dual_clip == 0 or self.dual_clip > 1,
            f"loss.dual_clip={self.dual_clip!r}: allowed are 0 (off) or a bound c > 1 on a "
            "negative-advantage token's loss, c |A|",
        )
        number("loss.rho_max", self.rho_max, low=0, low_open=True)
        number("loss.m2po_tau", self.m2po_tau, low=0, low_open=True)
        number("loss.asymre_delta_v", self.asymre_delta_v)
        number("loss.entropy_coef", self.entropy_coef)
        number("loss.positive_weight", self.positive_weight, low=0, low_open=True)
        number("loss.cov_cut_frac", self.cov_cut_frac, low=0, high=1, high_open=True)
        number("loss.clip_cov_ratio", self.clip_cov_ratio, low=0, high=1)
        number("loss.clip_cov_low", self.clip_cov_low)
        number("loss.clip_cov_high", self.clip_cov_high)
        require(
            self.clip_cov_low < self.clip_cov_high,
            f"loss.clip_cov_low={self.clip_cov_low!r} with loss.clip_cov_high="
            f"{self.clip_cov_high!r}: the band of covariances Clip-Cov draws from needs "
            "low < high",
        )
        number("loss.kl_cov_frac", self.kl_cov_frac, low=0, high=1)
        number("loss.kl_cov_coef", self.kl_cov_coef, low=0)
        on = [k for k in COVARIANCE_OPTIONS if getattr(self, k)]
        require(
            len(on) <= 1,
            f"{' and '.join(f'loss.{k}={getattr(self, k)!r}' for k in on)}: at most one "
            "covariance option is on (set the others to 0)",
        )

    @property
    def covariance_option(self) -> str | None:
        """The covariance option that is on (a COVARIANCE_OPTIONS name), or None."""
        return next((k for k in COVARIANCE_OPTIONS if getattr(self, k)), None)

    def without_covariance(self) -> "LossConfig":
        """This loss with every covariance option off (the on-policy objective)."""
        return dataclasses.replace(self, **dict.fromkeys(COVARIANCE_OPTIONS, 0.0))


def _ppo_clip(ratio, advantage, config: LossConfig):
    """PPO-clip per token: ratio [L], advantage [] -> (loss [L], clipped low, clipped high)."""
    clipped_ratio = jnp.clip(ratio, 1 - config.epsilon_low, 1 + config.epsilon_high)
    loss = -jnp.minimum(ratio * advantage, clipped_ratio * advantage)
    if config.dual_clip:
        # Unclipped, a stale token with A < 0 costs ratio |A|, unbounded as ratio grows.
        loss = jnp.where(advantage < 0, jnp.minimum(loss, -config.dual_clip * advantage), loss)
    clipped_low = (advantage < 0) & (ratio < 1 - config.epsilon_low)
    clipped_high = (advantage > 0) & (ratio > 1 + config.epsilon_high)
    return loss, clipped_low, clipped_high


def _sequence_token_loss(
    config: LossConfig, logprobs, behaviour_logprobs, proximal_logprobs, advantage, reward, baseline
):
    """Per-token loss of ONE sequence. Log-probs [L]; advantage, reward, baseline [].
    Returns (loss [L], clipped_low bool[L], clipped_high bool[L])."""
    loss, clipped_low, clipped_high = _policy_token_loss(
        config, logprobs, behaviour_logprobs, proximal_logprobs, advantage, reward, baseline
    )
    # W-REINFORCE's lambda scales the policy term of a positive sequence only (KL and
    # entropy terms are added after): min(r lambda A, clip(r) lambda A) = lambda x PPO's.
    signal = reward - (baseline + config.asymre_delta_v) if config.name == "asymre" else advantage
    return jnp.where(signal > 0, config.positive_weight, 1.0) * loss, clipped_low, clipped_high


def _policy_token_loss(
    config: LossConfig, logprobs, behaviour_logprobs, proximal_logprobs, advantage, reward, baseline
):
    ratio = jnp.exp(logprobs - behaviour_logprobs)  # [L] pi / mu
    never = jnp.zeros(logprobs.shape, bool)
    sg = jax.lax.stop_gradient
    if config.name == "reinforce":
        return -advantage * logprobs, never, never
    if config.name == "ppo":
        return _ppo_clip(ratio, advantage, config)
    if config.name == "tis":
        weight = sg(jnp.minimum(ratio, config.rho_max))
        return -weight * advantage * logprobs, never, ratio > config.rho_max
    if config.name == "topr":
        weight = jnp.where(advantage >= 0, 1.0, sg(jnp.clip(ratio, 0.0, 1.0)))
        return -weight * advantage * logprobs, never, (advantage < 0) & (ratio > 1)
    if config.name == "asymre":
        return -(reward - (baseline + config.asymre_delta_v)) * logprobs, never, never
    if config.name == "decoupled_ppo":
        loss, clipped_low, clipped_high = _ppo_clip(
            jnp.exp(logprobs - proximal_logprobs), advantage, config
        )
        behaviour_weight = sg(
            jnp.minimum(jnp.exp(proximal_logprobs - behaviour_logprobs), config.rho_max)
        )
        return behaviour_weight * loss, clipped_low, clipped_high
    # m2po: the batch-level mask is applied by the caller.
    return -ratio * advantage, never, never


def _m2po_keep(log_ratio, mask, tau: float):
    """M2PO token mask [B, L]: drops the valid tokens with the largest squared log ratio
    until the mean squared log ratio of the remaining valid tokens is <= tau."""
    squared = jnp.where(mask > 0, log_ratio**2, -1.0).reshape(-1)  # [T], invalid sort last
    order = jnp.argsort(-squared, stable=True)  # largest first
    largest_first = jnp.maximum(squared[order], 0.0)
    num_valid = jnp.sum(mask > 0)
    dropped_sum = jnp.concatenate([jnp.zeros(1), jnp.cumsum(largest_first)])  # [T + 1]
    num_dropped = jnp.arange(squared.shape[0] + 1)
    # Dropping the largest value never raises the mean, so the first k that fits is minimal.
    fits = (largest_first.sum() - dropped_sum <= tau * (num_valid - num_dropped)) | (
        num_dropped >= num_valid
    )
    keep_sorted = jnp.arange(squared.shape[0]) >= jnp.argmax(fits)
    keep = jnp.zeros(squared.shape, mask.dtype).at[order].set(keep_sorted)
    return keep.reshape(mask.shape) * mask


def token_covariance(logprobs, advantages, mask):
    """float[B, L]: (log pi - m_lp) x (A - m_A) per token, m_lp and m_A the means over
    the valid tokens (mask > 0) only; logprobs and mask [B, L], advantages [B]."""
    num_valid = jnp.maximum(mask.sum(), 1.0)
    a = jnp.broadcast_to(advantages[:, None], logprobs.shape)
    centred = lambda x: x - jnp.sum(jnp.where(mask > 0, x, 0.0)) / num_valid
    return centred(logprobs) * centred(a)


def _first_by_score(score, count):
    """bool[...]: the `count` entries of largest score (ties to the first, in flat order);
    entries scored -inf are never taken."""
    flat = score.reshape(-1)
    order = jnp.argsort(-flat, stable=True)  # largest first
    rank = jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.arange(flat.shape[0]))
    return ((rank < count) & (flat > -jnp.inf)).reshape(score.shape)


def covariance_selection(logprobs, advantages, mask, config: LossConfig, key=None):
    """float[B, L]: 1 on the tokens config's covariance option acts on (see LossConfig),
    0 elsewhere and on padding; all 0 when no option is on. logprobs and mask [B, L] (no
    gradient is taken through them), advantages [B]; key: a PRNG key, needed by
    clip_cov_ratio only."""
    option = config.covariance_option
    if option is None:
        return jnp.zeros(logprobs.shape, jnp.float32)
    mask = (mask > 0).astype(jnp.float32)
    count = covariance_count(config, mask.sum())
    cov = token_covariance(logprobs, advantages, mask)  # [B, L]
    if option == "cov_cut_frac":
        score = jnp.where((mask > 0) & (cov > 0), cov, -jnp.inf)
    elif option == "kl_cov_frac":
        score = jnp.where(mask > 0, cov, -jnp.inf)
    else:
        if key is None:
            raise ValueError("loss.clip_cov_ratio draws tokens at random: give covariance_key")
        in_band = (mask > 0) & (cov > config.clip_cov_low) & (cov < config.clip_cov_high)
        # Uniform scores in the band: the largest `count` are a uniform draw of that size.
        score = jnp.where(in_band, jax.random.uniform(key, cov.shape), -jnp.inf)
    return _first_by_score(score, count).astype(jnp.float32)


def covariance_count(config: LossConfig, num_valid):
    """How many tokens config's covariance option acts on among num_valid valid tokens (at
    most: fewer when fewer qualify): floor(frac x num_valid), and at least 1 for Clip-Cov
    and KL-Cov (see LossConfig); 0 when no option is on."""
    option = config.covariance_option
    if option is None:
        return jnp.zeros((), jnp.float32)
    count = jnp.floor(getattr(config, option) * jnp.asarray(num_valid, jnp.float32))
    return count if option == "cov_cut_frac" else jnp.maximum(count, 1.0)


def policy_loss(
    logprobs,
    behaviour_logprobs,
    mask,
    advantages,
    *,
    config: LossConfig,
    rewards=None,
    baselines=None,
    proximal_logprobs=None,
    reference_logprobs=None,
    entropy=None,
    sample_weights=None,
    covariance_key=None,
    covariance_selected=None,
):
    """Policy loss of a batch. Log-probs and mask [B, L]; advantages, rewards, baselines,
    sample_weights [B] (sample_weights multiply each sequence's loss, e.g. priority-replay
    importance weights). covariance_selected [B, L]: the tokens config's covariance option
    acts on, when chosen over a larger batch than this one (a microbatch's share of the
    whole batch's `covariance_selection`); None: chosen here, with covariance_key for
    Clip-Cov's draw. Returns (loss scalar, metrics dict of scalars)."""
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be [B, L], got {logprobs.shape}")
    for name, value in dict(
        behaviour_logprobs=behaviour_logprobs,
        mask=mask,
        proximal_logprobs=proximal_logprobs,
        reference_logprobs=reference_logprobs,
        entropy=entropy,
    ).items():
        if value is not None and value.shape != logprobs.shape:
            raise ValueError(f"{name} has shape {value.shape}, logprobs {logprobs.shape}")
    if config.name == "asymre" and (rewards is None or baselines is None):
        raise ValueError("the asymre loss needs rewards and baselines")
    sg = jax.lax.stop_gradient
    batch_size = logprobs.shape[0]
    mask = sg(mask).astype(jnp.float32)
    behaviour_logprobs = sg(behaviour_logprobs)
    proximal_logprobs = sg(logprobs if proximal_logprobs is None else proximal_logprobs)
    zeros = jnp.zeros(batch_size, jnp.float32)
    rewards = zeros if rewards is None else sg(rewards)
    baselines = zeros if baselines is None else sg(baselines)
    sample_weights = jnp.ones(batch_size) if sample_weights is None else sg(sample_weights)

    # Per sequence, vmapped over the batch.
    per_sequence = jax.vmap(functools.partial(_sequence_token_loss, config))
    token_loss, clipped_low, clipped_high = per_sequence(
        logprobs, behaviour_logprobs, proximal_logprobs, sg(advantages), rewards, baselines
    )  # [B, L] each

    # Batch-level terms.
    log_ratio = sg(logprobs) - behaviour_logprobs  # [B, L] log pi / mu
    num_tokens = jnp.maximum(mask.sum(), 1.0)
    token_mean = lambda x: jnp.sum(x * mask) / num_tokens
    metrics = {}
    option = config.covariance_option
    if option is not None:
        if covariance_selected is None:
            covariance_selected = covariance_selection(
                sg(logprobs), sg(advantages), mask, config, covariance_key
            )
        selected = sg(covariance_selected) * mask  # [B, L]
        if option == "kl_cov_frac":
            # |log pi - log mu| pulls the selected tokens back towards the behaviour policy.
            abs_kl = jnp.abs(logprobs - behaviour_logprobs)
            token_loss = token_loss + config.kl_cov_coef * selected * abs_kl
        else:
            # A cut token keeps its loss value and loses its gradient.
            token_loss = jnp.where(selected > 0, sg(token_loss), token_loss)
        metrics[option] = 1.0 - jnp.sum(mask * (1.0 - selected)) / num_tokens
    if config.name == "m2po":
        keep = _m2po_keep(log_ratio, mask, config.m2po_tau)
        token_loss = token_loss * keep
        metrics["m2po_mask_frac"] = 1.0 - keep.sum() / num_tokens
    if reference_logprobs is not None:
        log_ref_ratio = sg(reference_logprobs) - logprobs
        kl = jnp.exp(log_ref_ratio) - log_ref_ratio - 1.0  # [B, L] k3 estimator
        token_loss = token_loss + config.kl_coef * kl
        metrics["kl"] = sg(token_mean(kl))
    if entropy is not None:
        token_loss = token_loss - config.entropy_coef * entropy
        metrics["entropy"] = sg(token_mean(entropy))

    # Aggregation.
    weighted = token_loss * mask * sample_weights[:, None]  # [B, L]
    if config.aggregation == "token_mean":
        loss = weighted.sum() / num_tokens
    else:
        tokens_per_sequence = mask.sum(axis=1)  # [B]
        sequence_loss = weighted.sum(axis=1) / jnp.maximum(tokens_per_sequence, 1.0)
        loss = sequence_loss.sum() / jnp.maximum(jnp.sum(tokens_per_sequence > 0), 1)

    # Metrics.
    ratio = jnp.exp(log_ratio)
    log_w = jnp.sum(log_ratio * mask, axis=1)  # [B] log of the sequence IS weight
    w = jnp.exp(log_w - log_w.max())  # rescaled: the ESS is scale-free
    metrics.update(
        loss=sg(loss),
        clip_frac_low=token_mean(clipped_low),
        clip_frac_high=token_mean(clipped_high),
        is_ratio_mean=token_mean(ratio),
        is_ratio_max=jnp.max(jnp.where(mask > 0, ratio, 0.0)),
        is_ess=w.sum() ** 2 / (batch_size * jnp.sum(w**2)),
    )
    metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
    return loss, metrics
