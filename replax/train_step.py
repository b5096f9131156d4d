"""The jitted, sharded optimizer step on a batch of (possibly stale) rollouts.

`make_train_step` returns one compiled function (state, batch) -> (state, metrics):
forward the policy over prompt + completion, take log-probs of the stored tokens, apply
the off-policy objective (`replax.objectives`, per sequence and vmapped), and take an
optax step. Explicit in / out shardings on the mesh, the state donated.

A batch is a dict of arrays with leading dimension B:
  tokens              int32[B, L]   prompt (left-padded) + completion (pad after EOS)
  attention_mask      bool[B, L]    valid tokens (prompt and completion)
  loss_mask           float32[B, L] completion tokens that are trained on
  behaviour_logprobs  float32[B, L] log-prob of each token under the generating policy
  advantage, reward, baseline  float32[B]  frozen at generation
  importance_weights  float32[B]    sampling correction of the replay strategy
  age, times_sampled  int32[B]      staleness (steps) and reuse count of each rollout
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from replax import model as model_lib
from replax import objectives, sharding
from replax.sampler import mask_vocab

SCHEDULES = ("constant", "cosine", "linear")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with global-norm clipping and an optional warm-up + decay schedule."""

    learning_rate: float = 1e-4
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1000
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    # Clip the global gradient norm to this value; 0 disables clipping.
    grad_clip: float = 1.0

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optimizer.schedule={self.schedule!r}: allowed are {SCHEDULES}")
        if not self.learning_rate > 0:
            raise ValueError(f"optimizer.learning_rate={self.learning_rate} must be > 0")
        if self.grad_clip < 0:
            raise ValueError(f"optimizer.grad_clip={self.grad_clip} must be >= 0")


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    lr = config.learning_rate
    if config.schedule == "constant":
        schedule = optax.constant_schedule(lr)
    elif config.schedule == "cosine":
        schedule = optax.cosine_decay_schedule(lr, max(config.total_steps - config.warmup_steps, 1))
    else:
        schedule = optax.linear_schedule(lr, 0.0, max(config.total_steps - config.warmup_steps, 1))
    if config.warmup_steps:
        schedule = optax.join_schedules(
            [optax.linear_schedule(0.0, lr, config.warmup_steps), schedule],
            [config.warmup_steps],
        )
    parts = []
    if config.grad_clip:
        parts.append(optax.clip_by_global_norm(config.grad_clip))
    parts.append(
        optax.adamw(
            schedule, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay
        )
    )
    return optax.chain(*parts)


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32[]
    params: Any
    opt_state: Any
    # Frozen reference policy for the KL penalty; None when loss.kl_coef == 0.
    reference_params: Any = None


def _init_fn(model: nn.Module, optimizer, with_reference: bool):
    """rng -> a fresh TrainState with boxed (logically annotated) params."""
    dummy = jnp.zeros((1, 8), jnp.int32)

    def init(rng):
        boxed = model.init(rng, dummy, dummy)["params"]
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=boxed,
            opt_state=optimizer.init(boxed),
            reference_params=boxed if with_reference else None,
        )

    return init


def train_state_shardings(model: nn.Module, optimizer, mesh, rules, *, with_reference=False):
    """The NamedShardings of a TrainState, from the parameters' logical axis names through
    the rule table (the optimizer state follows its parameters); computes no array."""
    abstract = jax.eval_shape(_init_fn(model, optimizer, with_reference), jax.random.key(0))
    return nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, rules)


def init_train_state(
    model: nn.Module, optimizer, rng, mesh, rules, *, with_reference=False, params=None
):
    """Initialises (or places given) params and optimizer state sharded on the mesh.

    Returns (state, state_shardings); see `train_state_shardings`.
    """
    init = _init_fn(model, optimizer, with_reference)
    shardings = train_state_shardings(model, optimizer, mesh, rules, with_reference=with_reference)
    with sharding.activation_rules(mesh, rules):
        if params is None:
            state = jax.jit(lambda r: nn.unbox(init(r)), out_shardings=shardings)(rng)
        else:

            def from_params(p):
                return TrainState(
                    step=jnp.zeros((), jnp.int32),
                    params=p,
                    opt_state=optimizer.init(p),
                    reference_params=p if with_reference else None,
                )

            state = jax.jit(from_params, out_shardings=shardings)(
                jax.device_put(params, shardings.params)
            )
    return state, shardings


@jax.jit
def all_finite(tree) -> jax.Array:
    """bool[]: every floating-point leaf of tree is finite (one reduction per leaf)."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves]))


def batch_shardings(mesh, rules, example_batch: dict[str, Any]):
    """Shardings of a batch like example_batch (arrays or ShapeDtypeStructs, leading
    batch axis): split over `batch`, the rest replicated."""
    return {
        k: sharding.named(mesh, ("batch",) + (None,) * (len(v.shape) - 1), rules)
        for k, v in example_batch.items()
    }


def make_train_step(
    model: nn.Module,
    optimizer,
    loss_config: objectives.LossConfig,
    mesh,
    rules,
    state_shardings,
    batch_sharding,
    *,
    temperature: float = 1.0,
    half_batch_stats: bool = False,
    vocab_size: int | None = None,
):
    """The compiled step (state, batch) -> (state, metrics); the state is donated.

    temperature: the sampling temperature of the rollouts; the policy's log-probs are
    taken at the same temperature, so on fresh rollouts pi / mu = 1 exactly.
    vocab_size: the tokenizer's vocabulary when the model's has rows past it (never
    sampled, so excluded here too).
    half_batch_stats: take the gradient as the mean of the freshest and the stalest half
    of the batch (one vmapped backward pass) and add their statistics (`halves_*`, see
    `half_batch_gradient_stats`) to the metrics; auto replay reads them.
    """
    scale = 1.0 / temperature if temperature > 0 else 1.0

    def logprobs_and_entropy(params, batch):
        tokens, attn = batch["tokens"], batch["attention_mask"]
        positions = model_lib.positions_from_mask(attn)
        logits = model.apply({"params": params}, tokens, positions, attn) * scale  # [B, L, V]
        logits = mask_vocab(logits, vocab_size)  # the distribution the sampler draws from
        return model_lib.token_logprobs_and_entropy(logits, tokens)

    def loss_fn(params, reference_params, batch):
        logprobs, entropy = logprobs_and_entropy(params, batch)
        reference = None
        if reference_params is not None:
            reference, _ = logprobs_and_entropy(reference_params, batch)
            reference = jax.lax.stop_gradient(reference)
        loss, metrics = objectives.policy_loss(
            logprobs,
            batch["behaviour_logprobs"],
            batch["loss_mask"],
            batch["advantage"],
            config=loss_config,
            rewards=batch["reward"],
            baselines=batch["baseline"],
            reference_logprobs=reference,
            # Differentiable only when the entropy bonus is on: no backward pass otherwise.
            entropy=entropy if loss_config.entropy_coef else jax.lax.stop_gradient(entropy),
            sample_weights=batch["importance_weights"],
        )
        return loss, metrics

    def step(state: TrainState, batch):
        # LOSS AND GRADIENT
        if half_batch_stats:
            grad_fn = lambda p, b: jax.grad(loss_fn, has_aux=True)(p, state.reference_params, b)
            grads, metrics, halves = half_batch_gradient_stats(grad_fn, state.params, batch)
            metrics = {**metrics, **halves}
        else:
            (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                state.params, state.reference_params, batch
            )
        # OPTIMIZER UPDATE, skipped whole when the loss, the gradient or the update is not
        # finite: one bad batch (or a rate that overflows) must not turn the parameters or
        # Adam's moments into NaN.
        metrics = dict(metrics)
        grad_norm = optax.tree_utils.tree_norm(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        update_norm = optax.tree_utils.tree_norm(updates)
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm) & jnp.isfinite(update_norm)
        params = optax.apply_updates(state.params, updates)
        updated = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), updated, state)
        metrics["skipped"] = (~finite).astype(jnp.int32)
        metrics["grad_norm"] = grad_norm
        # STALENESS STATISTICS
        # The batch's token entropy; `entropy` in metrics.jsonl is the held-out one.
        if "entropy" in metrics:
            metrics["train_entropy"] = metrics.pop("entropy")
        metrics["replay_age_mean"] = jnp.mean(batch["age"].astype(jnp.float32))
        metrics["replay_age_max"] = jnp.max(batch["age"])
        metrics["replay_reuse_mean"] = jnp.mean(batch["times_sampled"].astype(jnp.float32))
        return new_state, metrics

    return sharding.jit_state_step(step, mesh, rules, state_shardings, batch_sharding)


def half_batch_gradient_stats(grad_fn, params, batch):
    """Gradient of the batch as the mean of its freshest and stalest halves.

    grad_fn(params, batch) -> (grads, metrics): the gradient (and scalar metrics) of a
    batch; it is vmapped over the two halves, so the backward cost is that of one batch.
    batch: dict of arrays with leading axis B (even), including `age` int[B].
    Returns (grads, metrics, stats): grads the mean of the halves' gradients (equal to the
    batch gradient for a per-sequence mean loss; for a token mean, each half's tokens are
    averaged separately); metrics averaged over the halves (`*_max` keys: max); stats the
    scalars that auto replay estimates its design from (docs/auto_replay.md): cross,
    noise_fresh, noise_stale, age_fresh, age_stale, prefixed `halves_`).
    """
    age = batch["age"]
    batch_size = age.shape[0]
    if batch_size % 2:
        raise ValueError(f"half_batch_gradient_stats: batch size {batch_size} is odd")
    half = batch_size // 2
    order = jnp.argsort(age, stable=True)  # freshest first
    halves = jax.tree.map(lambda x: x[order].reshape(2, half, *x.shape[1:]), batch)
    grads2, metrics2 = jax.vmap(grad_fn, in_axes=(None, 0))(params, halves)
    grad_fresh = jax.tree.map(lambda g: g[0], grads2)
    grad_stale = jax.tree.map(lambda g: g[1], grads2)
    grads = jax.tree.map(lambda g: 0.5 * (g[0] + g[1]), grads2)
    metrics = {k: (jnp.max(v) if k.endswith("_max") else jnp.mean(v)) for k, v in metrics2.items()}
    cross = optax.tree_utils.tree_vdot(grad_fresh, grad_stale)
    ages = halves["age"].astype(jnp.float32).mean(axis=1)  # [2]
    stats = {
        "halves_cross": cross,
        "halves_noise_fresh": optax.tree_utils.tree_vdot(grad_fresh, grad_fresh) - cross,
        "halves_noise_stale": optax.tree_utils.tree_vdot(grad_stale, grad_stale) - cross,
        "halves_age_fresh": ages[0],
        "halves_age_stale": ages[1],
    }
    return grads, metrics, stats
