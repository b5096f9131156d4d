"""The loss and its gradient on a batch of rollouts, as the train step takes them.

`make_gradient_fn` builds (params, reference_params, batch) -> (grads, metrics): forward
the policy over prompt + completion, take log-probs of the stored tokens (optionally a
chunk of positions at a time, `replax.model.logprobs`), apply the off-policy objective
(`replax.rl.objectives`, per sequence and vmapped), and differentiate, optionally
accumulating over microbatches, or taking a half of the batch's part of the whole's
(`replax.rl.halves`, which auto replay reads). Also here: the norm of an optimizer update
taken a layer at a time.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from replax.model import flops as flops_lib
from replax.model import layers, lora
from replax.model import logprobs as logprobs_lib
from replax.model import transformer as model_lib
from replax.model.logprobs import mask_vocab
from replax.rl import objectives


def covariance_pass(
    loss_config: objectives.LossConfig,
    *,
    num_microbatches: int,
    rows: int,
    length: int,
    row_multiple: int = 1,
) -> str | None:
    """How a step in microbatches ranks a covariance option's tokens over the whole batch
    (`make_gradient_fn`): None when no option is on, or in one pass (ranked inside it);
    'correction': the microbatches take the loss without the option, their log-probs rank
    the tokens, and a forward and backward of the rows holding the chosen tokens adds the
    option's part of the gradient; 'forward': a forward pass of every row, log-probs only,
    ranks them first. The correction is taken when it can never cost more: rows x length
    bounds the valid tokens, so covariance_count of it the chosen tokens and their rows
    (in slices of row_multiple, the data-parallel shards)."""
    if loss_config.covariance_option is None or num_microbatches == 1:
        return None
    with jax.ensure_compile_time_eval():  # a bound of the shapes, also while tracing
        tokens = int(objectives.covariance_count(loss_config, rows * length))
    most_rows = -(-min(rows, tokens) // row_multiple) * row_multiple
    correction = flops_lib.TrainPasses(forward=most_rows / rows, backward=most_rows / rows)
    extra_forward = flops_lib.TrainPasses(forward=1.0, backward=0.0)
    if correction.forward_equivalents <= extra_forward.forward_equivalents:
        return "correction"
    return "forward"


def train_passes(
    loss_config: objectives.LossConfig,
    *,
    num_microbatches: int,
    rows: int,
    length: int,
    reference: bool = False,
    row_multiple: int = 1,
    corrected_rows=0.0,
) -> flops_lib.TrainPasses:
    """The passes a step of `make_gradient_fn` runs on a batch of rows x length tokens: a
    forward and a backward of the batch, a forward of the KL reference (reference), and in
    microbatches with a covariance option (`covariance_pass`) a forward of the batch
    ('forward') or a forward and backward of corrected_rows of its rows ('correction': the
    rows are known once the step has run, as are the step's `forward_passes` and
    `backward_passes` metrics, which this gives)."""
    forward, backward = 1.0 + bool(reference), 1.0
    how = covariance_pass(
        loss_config,
        num_microbatches=num_microbatches,
        rows=rows,
        length=length,
        row_multiple=row_multiple,
    )
    if how == "forward":
        forward += 1.0
    elif how == "correction":
        forward += corrected_rows / rows
        backward += corrected_rows / rows
    return flops_lib.TrainPasses(forward=forward, backward=backward)


def make_gradient_fn(
    model: nn.Module,
    loss_config: objectives.LossConfig,
    *,
    temperature: float = 1.0,
    vocab_size: int | None = None,
    logits_chunk_size: int = 0,
    num_microbatches: int = 1,
    row_multiple: int = 1,
):
    """(params, reference_params, batch, covariance_key=None, frozen=None) -> (grads,
    metrics) of the batch's policy loss; the arguments are `train_step.make_train_step`'s
    (validated there), covariance_key the PRNG key of loss.clip_cov_ratio's draw. With
    num_microbatches > 1 the gradient is accumulated in float32, and with a covariance
    option on (objectives.LossConfig) its tokens are chosen over the whole batch, as in one
    pass (`covariance_pass` says how). `frozen`: params that complete `params` into the
    model's (`lora.combine`) and get no gradient: with LoRA `params` are the adapters and
    `frozen` the base. row_multiple: the rows a slice of the batch must hold (the
    data-parallel shards). The metrics include the passes the step ran (`train_passes`):
    `forward_passes`, `backward_passes`. With `across` (a `halves.Across`, inside the vmap
    over a batch's halves) `batch` is a half: its gradient is its part of the whole
    batch's (the loss over the whole's denominator, the covariance option's tokens chosen
    over the whole) and the metrics are the whole batch's."""
    scale = 1.0 / temperature if temperature > 0 else 1.0
    option = loss_config.covariance_option
    # The loss without the covariance option, whose part a correction adds afterwards.
    plain_config = loss_config
    if option is not None:
        plain_config = dataclasses.replace(loss_config, **{option: 0})

    def logprobs_and_entropy(params, batch, frozen=None, with_entropy=True):
        params = lora.combine(params, frozen)
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
                with_entropy=with_entropy,
            )
        logits = model.apply({"params": params}, tokens, positions, attn) * scale  # [B, L, V]
        logits = mask_vocab(logits, vocab_size)  # the distribution the sampler draws from
        if not with_entropy:
            return logprobs_lib.token_logprobs(logits, tokens), None
        return logprobs_lib.token_logprobs_and_entropy(logits, tokens)

    def reference_logprobs(reference_params, batch):
        if reference_params is None:
            return None
        return jax.lax.stop_gradient(logprobs_and_entropy(reference_params, batch)[0])

    def batch_loss(logprobs, entropy, reference, batch, covariance_key=None, config=loss_config):
        if entropy is not None and not config.entropy_coef:
            entropy = jax.lax.stop_gradient(entropy)  # no backward pass through it
        return objectives.policy_loss(
            logprobs,
            batch["behaviour_logprobs"],
            batch["loss_mask"],
            batch["advantage"],
            config=config,
            rewards=batch["reward"],
            baselines=batch["baseline"],
            reference_logprobs=reference,
            entropy=entropy,
            sample_weights=batch["importance_weights"],
            covariance_key=covariance_key,
            covariance_selected=batch.get("covariance_selected"),
        )

    def loss_fn(params, reference_params, batch, covariance_key, frozen):
        logprobs, entropy = logprobs_and_entropy(params, batch, frozen)
        reference = reference_logprobs(reference_params, batch)
        return batch_loss(logprobs, entropy, reference, batch, covariance_key)

    def microbatch_loss_fn(
        params, reference_params, micro, whole_denominator, frozen, config, select=None
    ):
        """The microbatch's loss as its share of the whole batch's, and its per-token
        log-probs, entropy and reference log-probs (no gradient) for the metrics. select:
        log-probs -> the covariance option's tokens, when chosen from this forward's."""
        logprobs, entropy = logprobs_and_entropy(params, micro, frozen)
        if select is not None:
            micro = {**micro, "covariance_selected": select(jax.lax.stop_gradient(logprobs))}
        reference = reference_logprobs(reference_params, micro)
        loss, _ = batch_loss(logprobs, entropy, reference, micro, config=config)
        share = _loss_denominator(micro["loss_mask"], loss_config.aggregation) / whole_denominator
        per_token = (jax.lax.stop_gradient(logprobs), jax.lax.stop_gradient(entropy), reference)
        return loss * share, per_token

    def add_covariance_part(grads, params, batch, logprobs, frozen, share):
        """(grads + the gradient of the covariance option's part of the whole batch's loss,
        rows): that part (the loss with the option less the loss without it) lies on the
        chosen tokens alone, so a forward and backward of the rows that hold them,
        row_multiple at a time, gives its gradient; rows: how many that ran. Added into
        grads in place: no second float32 copy of the gradient. share: batch's loss
        denominator over the whole batch's (1 unless batch is a half)."""
        selected = batch["covariance_selected"]  # [B, L]

        def option_part(logprobs):
            with_option, _ = batch_loss(logprobs, None, None, batch)
            without, _ = batch_loss(logprobs, None, None, batch, config=plain_config)
            return with_option - without

        # Zero off the chosen tokens already (both losses take the same terms there);
        # the product makes the zeros exact.
        cotangent = jax.grad(option_part)(logprobs) * selected * share  # [B, L]
        touched = jnp.any(selected > 0, axis=1)  # [B]
        order = jnp.argsort(~touched, stable=True)  # the touched rows first
        num_slices = -(-jnp.sum(touched) // row_multiple)

        def add_slice(i, grads):
            index = jax.lax.dynamic_slice_in_dim(order, i * row_multiple, row_multiple)
            rows = {
                k: layers.constrain(batch[k][index], ("batch", None))
                for k in ("tokens", "attention_mask")
            }
            _, pullback = jax.vjp(
                lambda p: logprobs_and_entropy(p, rows, frozen, with_entropy=False)[0], params
            )
            (slice_grads,) = pullback(cotangent[index])
            return jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads, slice_grads)

        grads = jax.lax.fori_loop(0, num_slices, add_slice, grads)
        return grads, num_slices * row_multiple

    def gradient(params, reference_params, batch, covariance_key=None, frozen=None, across=None):
        """(grads, metrics) of the loss of the batch, in num_microbatches slices."""
        rows, length = batch["tokens"].shape

        def selection(logprobs):  # the covariance option's tokens of the batch (its half's)
            args = (logprobs, batch["advantage"], batch["loss_mask"])
            if across is None:
                return objectives.covariance_selection(*args, loss_config, covariance_key)
            whole = objectives.covariance_selection(
                *map(across.whole, args), loss_config, covariance_key
            )
            return across.own(whole)

        def with_passes(metrics, corrected_rows=0.0):
            passes = train_passes(
                loss_config,
                num_microbatches=num_microbatches,
                rows=rows,
                length=length,
                reference=reference_params is not None,
                row_multiple=row_multiple,
                corrected_rows=corrected_rows,
            )
            return {
                **metrics,
                "forward_passes": jnp.asarray(passes.forward, jnp.float32),
                "backward_passes": jnp.asarray(passes.backward, jnp.float32),
            }

        if num_microbatches == 1 and across is None:
            (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                params, reference_params, batch, covariance_key, frozen
            )
            return grads, with_passes(metrics)
        m = num_microbatches

        def split(x):  # [B, ...] -> [M, B / M, ...], slice j = rows j, j + M, ...
            x = x.reshape(rows // m, m, *x.shape[1:]).swapaxes(0, 1)
            return layers.constrain(x, (None, "batch") + (None,) * (x.ndim - 2))

        def merge(x):  # [M, B / M, ...] -> [B, ...], the rows in their order
            return x.swapaxes(0, 1).reshape(rows, *x.shape[2:])

        whole_denominator = _loss_denominator(batch["loss_mask"], loss_config.aggregation, across)
        share = 1.0
        if across is not None:
            share = loss_share(batch["loss_mask"], loss_config.aggregation, across)
        how = covariance_pass(
            loss_config,
            num_microbatches=m,
            rows=rows,
            length=length,
            row_multiple=row_multiple,
        )
        micro_config = plain_config if how == "correction" else loss_config
        # A half in one slice ranks the tokens on its own forward's log-probs (over the
        # whole batch's): no pass more than the plain step's.
        select = selection if (across is not None and m == 1 and option is not None) else None
        if how == "forward":
            # The tokens are ranked over the whole batch: its log-probs first, no gradient.
            logprobs = merge(
                jax.lax.map(
                    lambda micro: jax.lax.stop_gradient(
                        logprobs_and_entropy(params, micro, frozen, with_entropy=False)[0]
                    ),
                    jax.tree.map(split, batch),
                )
            )  # [B, L]
            batch = {**batch, "covariance_selected": selection(logprobs)}

        def accumulate(grads, micro):
            micro_grads, per_token = jax.grad(microbatch_loss_fn, has_aux=True)(
                params, reference_params, micro, whole_denominator, frozen, micro_config, select
            )
            grads = jax.tree.map(lambda a, g: a + g.astype(a.dtype), grads, micro_grads)
            return grads, per_token

        # Summed in float32 over several slices; one slice (a half) keeps the params' dtype.
        zeros = jax.tree.map(
            lambda p: jnp.zeros(p.shape, jnp.float32 if m > 1 else p.dtype), params
        )
        grads, per_token = jax.lax.scan(accumulate, zeros, jax.tree.map(split, batch))
        logprobs, entropy, reference = jax.tree.map(merge, per_token)  # [B, L] each
        corrected_rows = 0.0
        if how == "correction":
            # The tokens ranked on the log-probs the microbatches took, then their part.
            batch = {**batch, "covariance_selected": selection(logprobs)}
            grads, corrected_rows = add_covariance_part(
                grads, params, batch, logprobs, frozen, share
            )
            if across is not None:  # the halves' loops run in step: the longer one's trips
                corrected_rows = across.max(corrected_rows)
        elif select is not None:
            batch = {**batch, "covariance_selected": selection(logprobs)}
        # Metrics of the whole batch (means, maxima, the ESS), as the single pass has them.
        per_token = (logprobs, entropy, reference)
        if across is not None:
            per_token, batch = jax.tree.map(across.whole, (per_token, batch))
        _, metrics = batch_loss(*per_token, batch)
        return grads, with_passes(metrics, corrected_rows)

    return gradient


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


def _loss_denominator(loss_mask, aggregation: str, across=None):
    """What `objectives.policy_loss` divides the summed loss of a batch by: its valid
    tokens (token_mean) or its sequences with a valid token (sequence_mean), at least 1;
    with `across` (a half of the batch), the whole batch's."""
    mask = jax.lax.stop_gradient(loss_mask).astype(jnp.float32)  # [B, L]
    if aggregation == "token_mean":
        count = mask.sum()
    else:
        count = jnp.sum(mask.sum(axis=1) > 0).astype(jnp.float32)
    if across is not None:
        count = across.sum(count)
    return jnp.maximum(count, 1.0)


def loss_share(loss_mask, aggregation: str, across):
    """A half's share of the whole batch's loss denominator."""
    return _loss_denominator(loss_mask, aggregation) / _loss_denominator(
        loss_mask, aggregation, across
    )
