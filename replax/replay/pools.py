"""One pool of the replay buffer: writing a shard's chunk at its head and drawing a
batch from its slots, the logic `replax.replay.store` vmaps over the [S, n] view of the buffer.

A pool is n slots: a pytree of [n, ...] arrays and their bookkeeping `meta` int32[n, 4]
(columns INSERT_STEP, TIMES_SAMPLED, VALID, SERIAL).
"""

import jax
import jax.numpy as jnp

from replax.core import categorical

# Columns of `ReplayState.meta`: the bookkeeping of a slot, one int32 row.
INSERT_STEP, TIMES_SAMPLED, VALID, SERIAL = range(4)


def split(tree, num_pools: int):
    """Leading axis M -> [num_pools, M / num_pools] on every leaf."""
    return jax.tree.map(lambda x: x.reshape(num_pools, -1, *x.shape[1:]), tree)


def merge(tree):
    """Leading [P, M] -> P * M on every leaf (shard-major)."""
    return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), tree)


def write_shard(slots, head, rows, keep):
    """Writes the kept rows of one shard's chunk at its head, oldest slot first.

    slots: pytree of [n, ...]; head: int32[]; rows: pytree of [r, ...]; keep: bool[r].
    Returns the slots, the new head and the number of rows kept.
    """
    n = jax.tree.leaves(slots)[0].shape[0]
    position = jnp.cumsum(keep, dtype=jnp.int32) - 1  # int32[r] rank among the kept rows
    num_kept = position[-1] + 1
    # With more kept rows than slots only the last n would survive; dropping the others
    # keeps the scatter's destinations distinct (duplicate destinations have no order).
    write = keep & (position >= num_kept - n)
    destination = jnp.where(write, (head + position) % n, n)  # n is out of range: dropped
    slots = jax.tree.map(lambda s, x: s.at[destination].set(x, mode="drop"), slots, rows)
    return slots, (head + num_kept) % n, num_kept


def positive_bias_eligible(keep_size: int, delta: float, valid, serial, correct):
    """The paper's refinement for one pool: the freshest (1 - delta) * keep_size items plus
    the freshest delta * keep_size correct items not among them. All arguments [n]."""
    num_fresh = int(round((1.0 - delta) * keep_size))
    num_correct = keep_size - num_fresh
    order = jnp.argsort(jnp.where(valid, -serial, 1), stable=True)  # freshest first, invalid last
    fresh = valid[order] & (jnp.arange(valid.shape[0]) < num_fresh)  # sorted by freshness
    old_correct = valid[order] & correct[order] & ~fresh
    kept_correct = old_correct & (jnp.cumsum(old_correct) <= num_correct)
    return jnp.zeros_like(valid).at[order].set(fresh | kept_correct)


def draw_from_pool(
    key, log_weight, eligible, valid, *, batch_size: int, replace: bool, without=None
):
    """Draws batch_size slots of one pool.

    log_weight: float32[n] unnormalised log-probability; eligible, valid: bool[n].
    without: optional bool[] (may be traced) that draws without replacement on this call
    even when `replace` is set, so a controller can switch per step without recompiling.
    Returns local indices int32[b], their log-probabilities float32[b], the pool's number
    of drawable slots and the smallest drawable log-probability.
    """
    drawable = jnp.where(eligible.any(), eligible, jnp.where(valid.any(), valid, True))
    logits = jnp.where(drawable, log_weight, -jnp.inf)
    log_probs = jax.nn.log_softmax(logits)  # [n], -inf off the drawable set
    num_drawable = drawable.sum()
    key_draw, key_order = jax.random.split(key)
    uniform = jax.random.uniform(key_draw, (2, batch_size))
    indices = categorical.inverse_cdf(jnp.exp(log_probs), uniform[0], inner_uniform=uniform[1])
    if not replace or without is not None:
        # Gumbel-top-k samples without replacement. With fewer drawable slots than the
        # batch, every drawable slot is taken once (in random order) and the remaining rows
        # are the draws with replacement.
        perturbed = logits + jax.random.gumbel(key_order, logits.shape)
        taken = min(batch_size, logits.shape[0])  # a traced `without` may ask for more
        _, order = jax.lax.top_k(perturbed, taken)
        order = jnp.concatenate([order, indices[taken:].astype(order.dtype)])
        taken_once = jnp.arange(batch_size) < num_drawable
        if replace:
            taken_once &= jnp.asarray(without, bool)
        indices = jnp.where(taken_once, order, indices)
    indices = indices.astype(jnp.int32)
    min_log_prob = jnp.min(jnp.where(drawable, log_probs, jnp.inf))
    return indices, log_probs[indices], num_drawable, min_log_prob


def count_draws(meta, indices, drawn_times):
    """meta (int32[n, 4]) with TIMES_SAMPLED + the number of times each slot occurs in
    indices (int32[b]); drawn_times = the column at indices. Every occurrence of a slot
    writes the same total, a plain in-place scatter (a scatter-add next to the gather of the
    same buffer makes XLA copy the whole buffer first)."""
    occurrences = jnp.sum(indices[:, None] == indices[None, :], axis=1, dtype=jnp.int32)  # [b]
    return meta.at[indices, TIMES_SAMPLED].set(drawn_times + occurrences)


def draw_written(key, count, *, batch_size: int, pool_size: int):
    """Uniform draws over one pool's written slots, which are always its first `count`: add
    fills a pool's slots in order from slot 0 and never empties one. O(b), independent of
    the pool size. An empty pool draws over all its slots, as `draw_from_pool` does.

    count: int32[]. Returns local indices int32[b] and their probability float32[] of one
    draw.
    """
    size = jnp.where(count > 0, count, pool_size)
    indices = jax.random.randint(key, (batch_size,), 0, size, dtype=jnp.int32)
    return indices, 1.0 / size.astype(jnp.float32)
