"""The loss and its gradient on a batch of rollouts, as the train step takes them.

`make_gradient_fn` builds (params, reference_params, batch) -> (grads, metrics): forward
the policy over prompt + completion, take log-probs of the stored tokens (optionally a
chunk of positions at a time, `replax.model.logprobs`), apply the off-policy objective
(`replax.rl.objectives`, per sequence and vmapped), and differentiate, optionally
accumulating over microbatches. Also here: the gradient of the freshest and stalest
halves of a batch that auto replay reads, and the norm of an optimizer update taken a
layer at a time.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from replax.model import layers, lora
from replax.model import logprobs as logprobs_lib
from replax.model import transformer as model_lib
from replax.model.logprobs import mask_vocab
from replax.rl import objectives


def make_gradient_fn(
    model: nn.Module,
    loss_config: objectives.LossConfig,
    *,
    temperature: float = 1.0,
    vocab_size: int | None = None,
    logits_chunk_size: int = 0,
    num_microbatches: int = 1,
):
    """(params, reference_params, batch, covariance_key=None, frozen=None) -> (grads,
    metrics) of the batch's policy loss; the arguments are `train_step.make_train_step`'s
    (validated there), covariance_key the PRNG key of loss.clip_cov_ratio's draw. With
    num_microbatches > 1 the gradient is accumulated in float32, and with a covariance
    option on (objectives.LossConfig) a forward pass over the microbatches first gives the
    whole batch's log-probs, so that its tokens are chosen as in one pass. `frozen`: params
    that complete `params` into the model's (`lora.combine`) and get no gradient: with LoRA
    `params` are the adapters and `frozen` the base."""
    scale = 1.0 / temperature if temperature > 0 else 1.0

    def logprobs_and_entropy(params, batch, frozen=None):
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
            )
        logits = model.apply({"params": params}, tokens, positions, attn) * scale  # [B, L, V]
        logits = mask_vocab(logits, vocab_size)  # the distribution the sampler draws from
        return logprobs_lib.token_logprobs_and_entropy(logits, tokens)

    def reference_logprobs(reference_params, batch):
        if reference_params is None:
            return None
        return jax.lax.stop_gradient(logprobs_and_entropy(reference_params, batch)[0])

    def batch_loss(logprobs, entropy, reference, batch, covariance_key=None):
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
            covariance_key=covariance_key,
            covariance_selected=batch.get("covariance_selected"),
        )

    def loss_fn(params, reference_params, batch, covariance_key, frozen):
        logprobs, entropy = logprobs_and_entropy(params, batch, frozen)
        reference = reference_logprobs(reference_params, batch)
        return batch_loss(logprobs, entropy, reference, batch, covariance_key)

    def microbatch_loss_fn(params, reference_params, micro, whole_denominator, frozen):
        """The microbatch's loss as its share of the whole batch's, and its per-token
        log-probs, entropy and reference log-probs (no gradient) for the metrics."""
        logprobs, entropy = logprobs_and_entropy(params, micro, frozen)
        reference = reference_logprobs(reference_params, micro)
        loss, _ = batch_loss(logprobs, entropy, reference, micro)
        share = _loss_denominator(micro["loss_mask"], loss_config.aggregation) / whole_denominator
        per_token = (jax.lax.stop_gradient(logprobs), jax.lax.stop_gradient(entropy), reference)
        return loss * share, per_token

    def gradient(params, reference_params, batch, covariance_key=None, frozen=None):
        """(grads, metrics) of the loss of the batch, in num_microbatches slices."""
        if num_microbatches == 1:
            (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                params, reference_params, batch, covariance_key, frozen
            )
            return grads, metrics
        m, rows = num_microbatches, batch["tokens"].shape[0]

        def split(x):  # [B, ...] -> [M, B / M, ...], slice j = rows j, j + M, ...
            x = x.reshape(rows // m, m, *x.shape[1:]).swapaxes(0, 1)
            return layers.constrain(x, (None, "batch") + (None,) * (x.ndim - 2))

        def merge(x):  # [M, B / M, ...] -> [B, ...], the rows in their order
            return x.swapaxes(0, 1).reshape(rows, *x.shape[2:])

        whole_denominator = _loss_denominator(batch["loss_mask"], loss_config.aggregation)
        if loss_config.covariance_option is not None:
            # The tokens are ranked over the whole batch: its log-probs first, no gradient.
            logprobs = merge(
                jax.lax.map(
                    lambda micro: jax.lax.stop_gradient(
                        logprobs_and_entropy(params, micro, frozen)[0]
                    ),
                    jax.tree.map(split, batch),
                )
            )  # [B, L]
            selected = objectives.covariance_selection(
                logprobs, batch["advantage"], batch["loss_mask"], loss_config, covariance_key
            )
            batch = {**batch, "covariance_selected": selected}

        def accumulate(grads, micro):
            micro_grads, per_token = jax.grad(microbatch_loss_fn, has_aux=True)(
                params, reference_params, micro, whole_denominator, frozen
            )
            grads = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads, micro_grads)
            return grads, per_token

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        grads, per_token = jax.lax.scan(accumulate, zeros, jax.tree.map(split, batch))
        # Metrics of the whole batch (means, maxima, the ESS), as the single pass has them.
        logprobs, entropy, reference = jax.tree.map(merge, per_token)  # [B, L] each
        _, metrics = batch_loss(logprobs, entropy, reference, batch)
        return grads, metrics

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


def _loss_denominator(loss_mask, aggregation: str):
    """What `objectives.policy_loss` divides the summed loss of a batch by: its valid
    tokens (token_mean) or its sequences with a valid token (sequence_mean), at least 1."""
    mask = jax.lax.stop_gradient(loss_mask).astype(jnp.float32)  # [B, L]
    if aggregation == "token_mean":
        return jnp.maximum(mask.sum(), 1.0)
    return jnp.maximum(jnp.sum(mask.sum(axis=1) > 0), 1).astype(jnp.float32)


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
