"""The gradient of a batch as the sum of its freshest and stalest halves' parts.

Auto replay estimates its design from how the gradients of the freshest and the stalest
half of each batch agree (docs/auto_replay.md). The halves are vmapped over one batch
(one backward pass's cost), named axis `AXIS`; each half takes its part of the *whole*
batch's loss: the loss's denominator (its valid tokens or sequences) and the covariance
option's tokens are the whole batch's, taken across the two halves with collectives
(`Across`). So the step's gradient, the halves' parts summed, is the plain step's, and
a run that reads the halves trains as one that does not. (Not with `loss.name='m2po'`,
whose token mask is taken over each half's tokens.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

AXIS = "halves"
ROW_ORDER = "row_order"  # each half's rows' places in the batch


class Across:
    """Inside the vmap over the halves: a half's arrays as the whole batch's, in the
    batch's own row order, and back."""

    def __init__(self, row_order):
        self.row_order = row_order  # int[half]

    def whole(self, x):
        """[half, ...] of each half -> [B, ...] in the batch's order."""
        gathered = jax.lax.all_gather(x, AXIS)  # [2, half, ...]
        rows = jax.lax.all_gather(self.row_order, AXIS).reshape(-1)
        gathered = gathered.reshape(-1, *gathered.shape[2:])
        return jnp.zeros_like(gathered).at[rows].set(gathered)

    def own(self, x):
        """[B, ...] in the batch's order -> this half's rows."""
        return x[self.row_order]

    def sum(self, x):
        return jax.lax.psum(x, AXIS)

    def max(self, x):
        return jax.lax.pmax(x, AXIS)


def half_batch_gradient_stats(grad_fn, params, batch):
    """Gradient of the batch as the sum of its freshest and stalest halves' parts.

    grad_fn(params, half, across) -> (grads, metrics, share): the half's part of the whole
    batch's gradient (its loss over the whole batch's denominator), the whole batch's
    scalar metrics, and the half's share of that denominator; `across` (an `Across`)
    reaches the other half. batch: dict of arrays with leading axis B (even), including
    `age` int[B].
    Returns (grads, metrics, stats): grads the sum of the halves' parts (the batch's
    gradient); metrics the whole batch's (`*_max` keys: max over the halves); stats the
    scalars that auto replay estimates its design from (docs/auto_replay.md): cross,
    noise_fresh, noise_stale from each half's own mean gradient (its part over its
    share), age_fresh, age_stale, prefixed `halves_`.
    """
    age = batch["age"]
    batch_size = age.shape[0]
    if batch_size % 2:
        raise ValueError(f"half_batch_gradient_stats: batch size {batch_size} is odd")
    half = batch_size // 2
    order = jnp.argsort(age, stable=True)  # freshest first
    batch = {**batch, ROW_ORDER: jnp.arange(batch_size, dtype=jnp.int32)}
    halves = jax.tree.map(lambda x: x[order].reshape(2, half, *x.shape[1:]), batch)

    def one_half(params, rows):
        return grad_fn(params, rows, Across(rows[ROW_ORDER]))

    parts, metrics2, shares = jax.vmap(one_half, in_axes=(None, 0), axis_name=AXIS)(params, halves)
    grads = jax.tree.map(lambda g: g[0] + g[1], parts)
    # A half without a valid token has no mean gradient: 0.
    per_half = jnp.where(shares > 0, 1.0 / jnp.where(shares > 0, shares, 1.0), 0.0)
    grad_fresh = jax.tree.map(lambda g: g[0] * per_half[0].astype(g.dtype), parts)
    grad_stale = jax.tree.map(lambda g: g[1] * per_half[1].astype(g.dtype), parts)
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
