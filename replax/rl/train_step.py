"""The jitted, sharded optimizer step on a batch of (possibly stale) rollouts.

`make_train_step` returns one compiled function (state, batch) -> (state, metrics):
forward the policy over prompt + completion, take log-probs of the stored tokens, apply
the off-policy objective (`replax.rl.objectives`, per sequence and vmapped), and take an
optax step. Explicit in / out shardings on the mesh, the state donated.

The loss and its gradient come from `replax.rl.gradients`. For large models and
vocabularies two options bound the memory of a step: the log-probs taken a chunk of
positions at a time (`replax.model.logprobs`, no float32 [B, T, V] logits) and gradient
accumulation over microbatches inside the compiled step (one optimizer update).

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
import numpy as np
import optax

from replax.core import sharding
from replax.core.config_utils import number, one_of, positive
from replax.model import lora
from replax.model import transformer as model_lib
from replax.rl import gradients, objectives
from replax.rl import halves as halves_lib

SCHEDULES = ("constant", "cosine", "linear")
STATE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with global-norm clipping and an optional warm-up + decay schedule.

    A run's optimizer.* keys are these fields but `total_steps` (the run's own total_steps,
    the schedule's length) and `eps` (Adam's, at its default); the checks name the key.
    """

    learning_rate: float = 1e-4
    schedule: str = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    # Clip the global gradient norm to this value; 0 disables clipping.
    grad_clip: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    # Adam's first moment (mu) in this dtype. The second (nu) stays in the params' dtype:
    # bfloat16 keeps 8 significant bits, so nu * b2 with b2 = 0.999 would round back to nu
    # and the second moment could never decay.
    state_dtype: str = "float32"
    total_steps: int = 1000
    eps: float = 1e-8

    def __post_init__(self):
        number("optimizer.learning_rate", self.learning_rate, low=0, low_open=True)
        for key in ("b1", "b2"):
            number(f"optimizer.{key}", getattr(self, key), low=0, high=1, high_open=True)
        number("optimizer.weight_decay", self.weight_decay, low=0)
        number("optimizer.grad_clip", self.grad_clip, low=0)
        number("optimizer.warmup_steps", self.warmup_steps, low=0, integer=True)
        number("optimizer.eps", self.eps, low=0, low_open=True)
        positive("total_steps", self.total_steps)
        one_of("optimizer.schedule", self.schedule, SCHEDULES)
        one_of("optimizer.state_dtype", self.state_dtype, STATE_DTYPES)


def make_schedule(config: OptimizerConfig) -> optax.Schedule:
    """The learning rate as a function of the optimizer's update count."""
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
    return schedule


def learning_rates(config: OptimizerConfig, num_updates: int) -> np.ndarray:
    """float32[num_updates]: the rate of update 0, 1, ...: a host table, so that a step's
    rate is reported without reading the optimizer state off the devices (the count of
    updates is the step less the skipped steps: a skipped one does not advance it)."""
    schedule = make_schedule(config)
    return np.asarray(jax.vmap(schedule)(jnp.arange(max(num_updates, 1))), np.float32)


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    schedule = make_schedule(config)
    parts = []
    if config.grad_clip:
        parts.append(optax.clip_by_global_norm(config.grad_clip))
    parts.append(
        optax.adamw(
            schedule,
            b1=config.b1,
            b2=config.b2,
            eps=config.eps,
            weight_decay=config.weight_decay,
            mu_dtype=model_lib.DTYPES[config.state_dtype],
        )
    )
    return optax.chain(*parts)


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32[]
    params: Any
    opt_state: Any
    # Frozen reference policy for the KL penalty; None when loss.kl_coef == 0, and with
    # LoRA, whose reference is params without the adapters (no second copy).
    reference_params: Any = None


def _lora_on(model: nn.Module) -> bool:
    return lora.enabled(model.config)


def _init_fn(model: nn.Module, optimizer, with_reference: bool):
    """rng -> a fresh TrainState with boxed (logically annotated) params. With LoRA the
    optimizer state covers the adapters alone."""
    dummy = jnp.zeros((1, 8), jnp.int32)
    lora_on = _lora_on(model)

    def init(rng):
        boxed = model.init(rng, dummy, dummy)["params"]
        if lora_on:
            # The base as the model without adapters draws it: under nn.scan the adapters'
            # params move the layers' RNG stream, so rank r would start from another base
            # than rank 0 (unrolled layers draw the same either way).
            base = type(model)(lora.base_config(model.config)).init(rng, dummy, dummy)["params"]
            boxed = lora.combine(lora.partition(boxed, True)[0], base)
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=boxed,
            opt_state=optimizer.init(lora.partition(boxed, lora_on)[0]),
            reference_params=boxed if with_reference and not lora_on else None,
        )

    return init


def train_state_shardings(model: nn.Module, optimizer, mesh, rules, *, with_reference=False):
    """The NamedShardings of a TrainState, from the parameters' logical axis names through
    the rule table (the optimizer state follows its parameters); computes no array."""
    abstract = jax.eval_shape(_init_fn(model, optimizer, with_reference), jax.random.key(0))
    return nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, rules)


def abstract_train_state(model: nn.Module, optimizer, mesh, rules, *, with_reference=False):
    """The TrainState as jax.ShapeDtypeStructs carrying their NamedShardings (those of
    `train_state_shardings`), computing no array: the target to restore a checkpoint into,
    or to compile the step ahead of time."""
    boxed = jax.eval_shape(_init_fn(model, optimizer, with_reference), jax.random.key(0))
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        nn.meta.unbox(boxed),
        shardings,
    )


def init_train_state(
    model: nn.Module, optimizer, rng, mesh, rules, *, with_reference=False, params=None
):
    """Initialises (or places given) params and optimizer state sharded on the mesh.

    Returns (state, state_shardings); see `train_state_shardings`.
    """
    init = _init_fn(model, optimizer, with_reference)
    shardings = train_state_shardings(model, optimizer, mesh, rules, with_reference=with_reference)
    lora_on = _lora_on(model)
    with sharding.activation_rules(mesh, rules):
        if params is None:
            state = jax.jit(lambda r: nn.unbox(init(r)), out_shardings=shardings)(rng)
        else:
            if lora_on and not lora.has_adapters(params):
                # A pretrained base: its adapters start from the seed (B = 0, the base's
                # function exactly). Only the adapters' init survives the jit.
                adapters = jax.jit(
                    lambda r: lora.partition(nn.unbox(init(r)).params, True)[0],
                    out_shardings=lora.partition(shardings.params, True)[0],
                )(rng)
                params = lora.combine(adapters, params)

            def from_params(p):
                return TrainState(
                    step=jnp.zeros((), jnp.int32),
                    params=p,
                    opt_state=optimizer.init(lora.partition(p, lora_on)[0]),
                    reference_params=p if with_reference and not lora_on else None,
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
    logits_chunk_size: int = 0,
    num_microbatches: int = 1,
    grad_clip: float = 0.0,
):
    """The compiled step (state, batch) -> (state, metrics); the state is donated.

    temperature: the sampling temperature of the rollouts; the policy's log-probs are
    taken at the same temperature, so on fresh rollouts pi / mu = 1 exactly.
    vocab_size: the tokenizer's vocabulary when the model's has rows past it (never
    sampled, so excluded here too).
    half_batch_stats: take the gradient as the sum of the freshest and the stalest half's
    parts of the batch's (one vmapped backward pass; the same gradient) and add their
    statistics (`halves_*`, see `halves.half_batch_gradient_stats`) to the metrics; auto
    replay reads them.
    logits_chunk_size: take the log-probs and entropy (of the policy and of the KL
    reference) this many positions at a time, never holding float32 [B, T, V] logits
    (`logprobs.chunked_token_logprobs_and_entropy`); 0: all positions at once.
    num_microbatches: accumulate the gradient (in float32) over this many slices of the
    batch, one optimizer update; loss, gradient and metrics are those of the whole batch.
    Slice j holds rows j, j + M, j + 2M, ...: every device's shard of the batch gives
    each slice the same number of rows, so no row moves between devices.
    grad_clip: the optimizer's global-norm clip (OptimizerConfig.grad_clip), which the
    non-finite check applies to the whole gradient before it takes the update a layer at
    a time (`gradients.layerwise_update_norm`).
    """
    if logits_chunk_size < 0:
        raise ValueError(f"train.logits_chunk_size={logits_chunk_size} must be >= 0 (0: unchunked)")
    if num_microbatches < 1:
        raise ValueError(f"train.num_microbatches={num_microbatches} must be >= 1")
    if num_microbatches > 1 and loss_config.name == "m2po":
        raise ValueError(
            f"loss.name='m2po' masks tokens over the whole batch: it cannot be split into "
            f"train.num_microbatches={num_microbatches}"
        )
    data_shards = sharding.data_parallel_size(mesh, rules)
    gradient = gradients.make_gradient_fn(
        model,
        loss_config,
        temperature=temperature,
        vocab_size=vocab_size,
        logits_chunk_size=logits_chunk_size,
        num_microbatches=num_microbatches,
        row_multiple=data_shards,
    )
    lora_on = _lora_on(model)

    def step(state: TrainState, batch):
        _check_microbatches(batch, num_microbatches, data_shards, half_batch_stats)
        # LOSS AND GRADIENT, of the adapters alone with LoRA (the base frozen); the KL
        # reference is then the base, the same weights with the adapters off. Clip-Cov's
        # draw is fixed by the step number alone, so that a resumed run (or the same step
        # of another run) draws the same tokens.
        trainable, frozen = lora.partition(state.params, lora_on)
        reference = state.reference_params
        if lora_on and loss_config.kl_coef:
            reference = frozen
        covariance_key = None
        if loss_config.clip_cov_ratio:
            covariance_key = jax.random.fold_in(jax.random.key(0), state.step)
        if half_batch_stats:

            def grad_fn(params, half, across):
                grads, metrics = gradient(params, reference, half, covariance_key, frozen, across)
                share = gradients.loss_share(half["loss_mask"], loss_config.aggregation, across)
                return grads, metrics, share

            grads, metrics, halves = halves_lib.half_batch_gradient_stats(grad_fn, trainable, batch)
            metrics = {**metrics, **halves}
        else:
            grads, metrics = gradient(trainable, reference, batch, covariance_key, frozen)
        # Accumulated in float32 over microbatches: back to the params' dtype.
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, trainable)
        # OPTIMIZER UPDATE, skipped when not finite
        state, update_metrics = _update_if_finite(
            optimizer, state, grads, metrics["loss"], grad_clip=grad_clip, lora_on=lora_on
        )
        # STALENESS STATISTICS. The batch's token entropy is `train_entropy`: `entropy`
        # in metrics.jsonl is the held-out one.
        metrics = dict(metrics)
        if "entropy" in metrics:
            metrics["train_entropy"] = metrics.pop("entropy")
        return state, {**metrics, **update_metrics, **_staleness_metrics(batch)}

    return sharding.jit_state_step(step, mesh, rules, state_shardings, batch_sharding)


def _check_microbatches(batch, num_microbatches: int, data_shards: int, half_batch_stats: bool):
    """At trace time: the microbatches split the batch (each half of it with
    half_batch_stats) evenly, and each microbatch splits over the data shards."""
    if num_microbatches == 1:
        return
    batch_size = batch["tokens"].shape[0]
    rows, what = batch_size, f"train.batch_size={batch_size}"
    if half_batch_stats:  # each half is split
        rows, what = batch_size // 2, f"half of train.batch_size={batch_size} (half_batch_stats)"
    if rows % num_microbatches:
        raise ValueError(f"train.num_microbatches={num_microbatches} must divide {what}")
    if (rows // num_microbatches) % data_shards:
        raise ValueError(
            f"train.num_microbatches={num_microbatches} leaves {rows // num_microbatches} "
            f"rows per microbatch of {what}: not divisible by the {data_shards} "
            "data-parallel shards"
        )


def _update_if_finite(
    optimizer, state: TrainState, grads, loss, *, grad_clip: float, lora_on: bool = False
):
    """(state', metrics): the optimizer update applied, or skipped whole when the loss, the
    gradient or the update is not finite: one bad batch (or a rate that overflows) must not
    turn the parameters or Adam's moments into NaN. The update's norm is taken first, a
    layer at a time, then the update is applied to the donated state under `lax.cond`, in
    place: selecting between a new and the old state would hold both, with the update, at
    the peak (four float32 copies of every layer's shard)."""
    grad_norm = optax.tree_utils.tree_norm(grads)
    update_norm = gradients.layerwise_update_norm(
        optimizer,
        grads,
        state.opt_state,
        lora.partition(state.params, lora_on)[0],
        grad_clip=grad_clip,
    )
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(update_norm)

    def apply_update(state, grads):
        trainable, frozen = lora.partition(state.params, lora_on)
        updates, opt_state = optimizer.update(grads, state.opt_state, trainable)
        params = lora.combine(optax.apply_updates(trainable, updates), frozen)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state)

    new_state = jax.lax.cond(finite, apply_update, lambda state, _: state, state, grads)
    return new_state, {"skipped": (~finite).astype(jnp.int32), "grad_norm": grad_norm}


def _staleness_metrics(batch):
    """Mean and max age (steps since generation) and mean reuse of the batch's rollouts."""
    return {
        "replay_age_mean": jnp.mean(batch["age"].astype(jnp.float32)),
        "replay_age_max": jnp.max(batch["age"]),
        "replay_reuse_mean": jnp.mean(batch["times_sampled"].astype(jnp.float32)),
    }
