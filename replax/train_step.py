"""The jitted, sharded optimizer step on a batch of (possibly stale) rollouts.

`make_train_step` returns one compiled function (state, batch) -> (state, metrics):
forward the policy over prompt + completion, take log-probs of the stored tokens, apply
the off-policy objective (`replax.objectives`, per sequence and vmapped), and take an
optax step. Explicit in / out shardings on the mesh, the state donated.

For large models and vocabularies three options bound the memory of a step: the log-probs
taken a chunk of positions at a time (`replax.logprobs`, no float32 [B, T, V] logits),
gradient accumulation over microbatches inside the compiled step (one optimizer update),
and float32 master weights cast once per step to the compute dtype (`mixed_precision`).

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

from replax import logprobs as logprobs_lib
from replax import model as model_lib
from replax import objectives, sharding
from replax.sampling import mask_vocab

SCHEDULES = ("constant", "cosine", "linear")
STATE_DTYPES = ("float32", "bfloat16")


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
    # Adam's first moment (mu) in this dtype. The second (nu) stays in the params' dtype:
    # bfloat16 keeps 8 significant bits, so nu * b2 with b2 = 0.999 would round back to nu
    # and the second moment could never decay.
    state_dtype: str = "float32"

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optimizer.schedule={self.schedule!r}: allowed are {SCHEDULES}")
        if not self.learning_rate > 0:
            raise ValueError(f"optimizer.learning_rate={self.learning_rate} must be > 0")
        if self.grad_clip < 0:
            raise ValueError(f"optimizer.grad_clip={self.grad_clip} must be >= 0")
        if self.state_dtype not in STATE_DTYPES:
            raise ValueError(
                f"optimizer.state_dtype={self.state_dtype!r}: allowed are {STATE_DTYPES}"
            )


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
    logits_chunk_size: int = 0,
    num_microbatches: int = 1,
    mixed_precision: bool = False,
    grad_clip: float = 0.0,
):
    """The compiled step (state, batch) -> (state, metrics); the state is donated.

    temperature: the sampling temperature of the rollouts; the policy's log-probs are
    taken at the same temperature, so on fresh rollouts pi / mu = 1 exactly.
    vocab_size: the tokenizer's vocabulary when the model's has rows past it (never
    sampled, so excluded here too).
    half_batch_stats: take the gradient as the mean of the freshest and the stalest half
    of the batch (one vmapped backward pass) and add their statistics (`halves_*`, see
    `half_batch_gradient_stats`) to the metrics; auto replay reads them.
    logits_chunk_size: take the log-probs and entropy (of the policy and of the KL
    reference) this many positions at a time, never holding float32 [B, T, V] logits
    (`logprobs.chunked_token_logprobs_and_entropy`); 0: all positions at once.
    num_microbatches: accumulate the gradient (in float32) over this many slices of the
    batch, one optimizer update; loss, gradient and metrics are those of the whole batch.
    Slice j holds rows j, j + M, j + 2M, ...: every device's shard of the batch gives
    each slice the same number of rows, so no row moves between devices.
    grad_clip: the optimizer's global-norm clip (OptimizerConfig.grad_clip), which the
    non-finite check applies to the whole gradient before it takes the update a layer at
    a time (`layerwise_update_norm`).
    mixed_precision: with model.param_dtype wider than model.dtype, cast the master
    params to model.dtype once per step, on their own sharding (the FSDP all-gathers
    then move the narrow copy), and run the forward and backward passes on that copy;
    the gradient is applied to the master params. No effect when the dtypes agree.
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
    scale = 1.0 / temperature if temperature > 0 else 1.0
    compute_dtype = model.config.jnp_dtype
    cast_params = mixed_precision and model.config.jnp_param_dtype != compute_dtype
    data_shards = sharding.data_parallel_size(mesh, rules)

    def logprobs_and_entropy(params, batch):
        tokens, attn = batch["tokens"], batch["attention_mask"]
        positions = model_lib.positions_from_mask(attn)
        if logits_chunk_size:
            hidden = model.apply(
                {"params": params}, tokens, positions, attn, return_hidden=True
            )  # [B, L, E]
            return logprobs_lib.chunked_token_logprobs_and_entropy(
                hidden,
                model_lib.output_head(params, model.config),
                tokens,
                logits_chunk_size,
                scale=scale,
                vocab_size=vocab_size,
            )
        logits = model.apply({"params": params}, tokens, positions, attn) * scale  # [B, L, V]
        logits = mask_vocab(logits, vocab_size)  # the distribution the sampler draws from
        return model_lib.token_logprobs_and_entropy(logits, tokens)

    def reference_logprobs(reference_params, batch):
        if reference_params is None:
            return None
        return jax.lax.stop_gradient(logprobs_and_entropy(reference_params, batch)[0])

    def batch_loss(logprobs, entropy, reference, batch):
        return objectives.policy_loss(
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

    def loss_fn(params, reference_params, batch):
        logprobs, entropy = logprobs_and_entropy(params, batch)
        return batch_loss(logprobs, entropy, reference_logprobs(reference_params, batch), batch)

    def microbatch_loss_fn(params, reference_params, micro, whole_denominator):
        """The microbatch's loss as its share of the whole batch's, and its per-token
        log-probs, entropy and reference log-probs (no gradient) for the metrics."""
        logprobs, entropy = logprobs_and_entropy(params, micro)
        reference = reference_logprobs(reference_params, micro)
        loss, _ = batch_loss(logprobs, entropy, reference, micro)
        share = _loss_denominator(micro["loss_mask"], loss_config.aggregation) / whole_denominator
        per_token = (jax.lax.stop_gradient(logprobs), jax.lax.stop_gradient(entropy), reference)
        return loss * share, per_token

    def gradient(params, reference_params, batch):
        """(grads, metrics) of the loss of the batch, in num_microbatches slices."""
        if num_microbatches == 1:
            (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                params, reference_params, batch
            )
            return grads, metrics
        m, rows = num_microbatches, batch["tokens"].shape[0]

        def split(x):  # [B, ...] -> [M, B / M, ...], slice j = rows j, j + M, ...
            x = x.reshape(rows // m, m, *x.shape[1:]).swapaxes(0, 1)
            return model_lib.constrain(x, (None, "batch") + (None,) * (x.ndim - 2))

        def merge(x):  # [M, B / M, ...] -> [B, ...], the rows in their order
            return x.swapaxes(0, 1).reshape(rows, *x.shape[2:])

        whole_denominator = _loss_denominator(batch["loss_mask"], loss_config.aggregation)

        def accumulate(grads, micro):
            micro_grads, per_token = jax.grad(microbatch_loss_fn, has_aux=True)(
                params, reference_params, micro, whole_denominator
            )
            grads = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads, micro_grads)
            return grads, per_token

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        grads, per_token = jax.lax.scan(accumulate, zeros, jax.tree.map(split, batch))
        # Metrics of the whole batch (means, maxima, the ESS), as the single pass has them.
        logprobs, entropy, reference = jax.tree.map(merge, per_token)  # [B, L] each
        _, metrics = batch_loss(logprobs, entropy, reference, batch)
        return grads, metrics

    def check_batch_size(batch):
        if num_microbatches == 1:
            return
        batch_size = batch["tokens"].shape[0]
        rows, what = batch_size, f"train.batch_size={batch_size}"
        if half_batch_stats:  # each half is split
            rows, what = (
                batch_size // 2,
                f"half of train.batch_size={batch_size} (half_batch_stats)",
            )
        if rows % num_microbatches:
            raise ValueError(f"train.num_microbatches={num_microbatches} must divide {what}")
        if (rows // num_microbatches) % data_shards:
            raise ValueError(
                f"train.num_microbatches={num_microbatches} leaves {rows // num_microbatches} "
                f"rows per microbatch of {what}: not divisible by the {data_shards} "
                "data-parallel shards"
            )

    def step(state: TrainState, batch):
        check_batch_size(batch)
        # MIXED PRECISION: one cast of the master weights, on their own sharding.
        params, reference_params = state.params, state.reference_params
        if cast_params:
            params = _cast_floating(params, compute_dtype, state_shardings.params)
            if reference_params is not None:
                reference_params = _cast_floating(
                    reference_params, compute_dtype, state_shardings.reference_params
                )
        # LOSS AND GRADIENT
        if half_batch_stats:
            grad_fn = lambda p, b: gradient(p, reference_params, b)
            grads, metrics, halves = half_batch_gradient_stats(grad_fn, params, batch)
            metrics = {**metrics, **halves}
        else:
            grads, metrics = gradient(params, reference_params, batch)
        if cast_params or num_microbatches > 1:  # to the master params' dtype
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
        # OPTIMIZER UPDATE, skipped whole when the loss, the gradient or the update is not
        # finite: one bad batch (or a rate that overflows) must not turn the parameters or
        # Adam's moments into NaN. The update's norm is taken first, a layer at a time,
        # then the update is applied to the donated state under `lax.cond`, in place:
        # selecting between a new and the old state would hold both, with the update,
        # at the peak (four float32 copies of every layer's shard).
        metrics = dict(metrics)
        grad_norm = optax.tree_utils.tree_norm(grads)
        update_norm = layerwise_update_norm(
            optimizer, grads, state.opt_state, state.params, grad_clip=grad_clip
        )
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm) & jnp.isfinite(update_norm)

        def apply_update(state, grads):
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
            return state.replace(step=state.step + 1, params=params, opt_state=opt_state)

        new_state = jax.lax.cond(finite, apply_update, lambda state, _: state, state, grads)
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


def _in_layer_stack(path) -> bool:
    """Whether a leaf of params (or of an optimizer state mirroring them) lies in the
    layers under nn.scan, stacked on a leading [num_layers] axis."""
    return any(getattr(key, "key", None) == "layers" for key in path)


def layerwise_update_norm(optimizer, grads, opt_state, params, *, grad_clip: float = 0.0):
    """float[]: the norm of optimizer.update(grads, opt_state, params)'s updates, taken one
    stacked layer at a time (a `lax.map` over the layer axis), so that no update, new
    moment or new parameter tree of the whole model is held, only one layer's.

    The optimizer must act on each layer's parameters apart from the others' (adamw does;
    a global-norm clip does not, so the gradient is clipped here first, by grad_clip, and
    the optimizer's own clip of one layer's share is then a no-op). Without stacked
    layers the update is taken once, whole.
    """
    if grad_clip:
        grads = optax.clip_by_global_norm(grad_clip).update(grads, optax.EmptyState())[0]
    sizes = {
        x.shape[0]
        for path, x in jax.tree_util.tree_leaves_with_path(params)
        if _in_layer_stack(path)
    }
    if not sizes:
        return optax.tree_utils.tree_norm(optimizer.update(grads, opt_state, params)[0])
    (num_layers,) = sizes

    def part(layer):
        """The trees with every stacked leaf cut to `layer`'s slice (layer None: to none
        of them, the leaves outside the stack whole); scalars such as Adam's step count
        are kept."""

        def cut(path, x):
            if jnp.ndim(x) == 0:
                return x
            if _in_layer_stack(path):
                return x[:0] if layer is None else x[layer]
            return x if layer is None else x[:0]

        trees = (grads, opt_state, params)
        updates = optimizer.update(*(jax.tree_util.tree_map_with_path(cut, t) for t in trees))[0]
        return optax.tree_utils.tree_norm(updates, squared=True)

    squared = jax.lax.map(part, jnp.arange(num_layers)).sum() + part(None)
    return jnp.sqrt(squared)


def _loss_denominator(loss_mask, aggregation: str):
    """What `objectives.policy_loss` divides the summed loss of a batch by: its valid
    tokens (token_mean) or its sequences with a valid token (sequence_mean), at least 1."""
    mask = jax.lax.stop_gradient(loss_mask).astype(jnp.float32)  # [B, L]
    if aggregation == "token_mean":
        return jnp.maximum(mask.sum(), 1.0)
    return jnp.maximum(jnp.sum(mask.sum(axis=1) > 0), 1).astype(jnp.float32)


def _cast_floating(params, dtype, shardings):
    """The floating-point leaves of params cast to dtype, constrained to the params' own
    shardings: each device casts its shard, and what is all-gathered later is the cast."""

    def cast(x, x_sharding):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return jax.lax.with_sharding_constraint(x.astype(dtype), x_sharding)

    return jax.tree.map(cast, params, shardings)


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
