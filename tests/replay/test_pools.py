"""Tests for replax/replay/pools.py, one pool at a time against numpy: the FIFO write of a
shard's chunk, the positive-bias refinement, the draw's distribution (with and without
replacement, its fallbacks and the log-probabilities it reports) and the draw counts."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replax.replay import pools

NUM_DRAWS = 4000  # independent draws per distribution check


def chi_square(counts, probs):
    """Pearson's statistic of counts against probabilities (cells of probability 0 must
    have no counts) and its degrees of freedom."""
    counts, probs = np.asarray(counts, np.float64), np.asarray(probs, np.float64)
    assert counts[probs == 0].sum() == 0
    expected = counts.sum() * probs[probs > 0]
    return float(((counts[probs > 0] - expected) ** 2 / expected).sum()), int((probs > 0).sum()) - 1


def fits(counts, probs):
    """The counts fit the probabilities: Pearson's statistic below dof + 6 sqrt(2 dof),
    far out in the chi-square tail (the keys are fixed, so this is not flaky)."""
    statistic, dof = chi_square(counts, probs)
    return statistic <= dof + 6 * np.sqrt(2 * dof)


@functools.partial(jax.jit, static_argnames=("batch_size", "replace"))
def draw_many(log_weight, eligible, valid, *, batch_size, replace):
    """NUM_DRAWS independent calls of draw_from_pool."""
    keys = jax.random.split(jax.random.key(0), NUM_DRAWS)
    draw = functools.partial(pools.draw_from_pool, batch_size=batch_size, replace=replace)
    return jax.vmap(draw, in_axes=(0, None, None, None))(keys, log_weight, eligible, valid)


def numpy_log_probs(log_weight, drawable):
    logits = np.where(drawable, np.asarray(log_weight, np.float64), -np.inf)
    return logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()


# ---------------------------------------------------------------- write_shard


def numpy_write(slots, head, rows, keep):
    """Each kept row in turn at the head, the head moving one slot (mod n) after it."""
    slots, n = slots.copy(), len(slots)
    for row, kept in zip(rows, keep):
        if kept:
            slots[head] = row
            head = (head + 1) % n
    return slots, head, int(np.sum(keep))


@pytest.mark.parametrize(
    "head, keep",
    [
        (0, [1, 1, 1]),
        (4, [1, 0, 1]),  # wraps from slot 5 to slot 0
        (2, [0, 0, 0]),  # nothing kept: nothing moves
        (3, [1, 1, 0, 1, 1, 1, 1, 1, 1]),  # 8 kept rows over 6 slots: the last 6 stay
        (5, [1] * 13),  # more than twice the pool
    ],
)
def test_write_shard_is_fifo_at_the_head(head, keep):
    n = 6
    keep = np.asarray(keep, bool)
    slots = {"id": np.arange(100, 100 + n, dtype=np.int32), "x": np.zeros((n, 2), np.float32)}
    rows = {
        "id": np.arange(len(keep), dtype=np.int32),
        "x": np.random.default_rng(0).normal(size=(len(keep), 2)).astype(np.float32),
    }
    got, new_head, num_kept = jax.jit(pools.write_shard)(slots, jnp.int32(head), rows, keep)
    for key in slots:
        want, want_head, want_kept = numpy_write(slots[key], head, rows[key], keep)
        np.testing.assert_array_equal(got[key], want)
    assert (int(new_head), int(num_kept)) == (want_head, want_kept)


# ---------------------------------------------------------------- positive bias


def numpy_positive_bias(keep_size, delta, valid, serial, correct):
    """The freshest round((1 - delta) K) valid slots, and of the other valid slots the
    freshest K - that many correct ones."""
    num_fresh = int(round((1 - delta) * keep_size))
    by_freshness = [i for i in np.argsort(-serial, kind="stable") if valid[i]]
    fresh = by_freshness[:num_fresh]
    old_correct = [i for i in by_freshness[num_fresh:] if correct[i]]
    eligible = np.zeros(len(valid), bool)
    eligible[fresh + old_correct[: keep_size - num_fresh]] = True
    return eligible


@pytest.mark.parametrize("seed", range(6))
def test_positive_bias_eligible_against_numpy(seed):
    rng = np.random.default_rng(seed)
    n = 12
    valid = rng.random(n) < 0.8
    serial = rng.permutation(50)[:n].astype(np.int32)  # distinct insertion order
    correct = rng.random(n) < 0.4
    for keep_size, delta in ((6, 0.5), (4, 0.25), (8, 1.0), (5, 0.0), (12, 0.5)):
        got = pools.positive_bias_eligible(keep_size, delta, valid, serial, correct)
        want = numpy_positive_bias(keep_size, delta, valid, serial, correct)
        np.testing.assert_array_equal(got, want, err_msg=f"K={keep_size} delta={delta}")
        assert not np.asarray(got)[~valid].any()
        assert int(np.sum(got)) <= keep_size


# ---------------------------------------------------------------- draw_from_pool

LOG_WEIGHT = np.log(np.array([1.0, 4.0, 2.0, 0.5, 3.0, 1.0, 6.0, 2.5], np.float32))
ELIGIBLE = np.array([1, 1, 0, 1, 1, 0, 1, 1], bool)
VALID = np.array([1, 1, 1, 1, 1, 0, 1, 1], bool)


def test_draws_with_replacement_follow_the_weights_of_the_eligible_slots():
    indices, log_probs, num_drawable, min_log_prob = draw_many(
        LOG_WEIGHT, ELIGIBLE, VALID, batch_size=3, replace=True
    )
    expected = numpy_log_probs(LOG_WEIGHT, ELIGIBLE)
    probs = np.exp(expected)
    counts = np.bincount(np.asarray(indices).reshape(-1), minlength=8)
    assert counts[~ELIGIBLE].sum() == 0  # slot 2 (valid) and 5 (invalid) never drawn
    assert fits(counts, probs)
    assert not fits(counts, ELIGIBLE / ELIGIBLE.sum())  # the check tells weights apart
    # What the draw reports: each index's log-probability, the drawable count, the least.
    np.testing.assert_allclose(log_probs, expected[np.asarray(indices)], rtol=1e-5)
    assert (np.asarray(num_drawable) == ELIGIBLE.sum()).all()
    np.testing.assert_allclose(min_log_prob, expected[ELIGIBLE].min(), rtol=1e-5)


@pytest.mark.parametrize(
    "eligible, valid, drawable",
    [
        (np.zeros(8, bool), VALID, VALID),  # nothing eligible: every valid slot
        (np.zeros(8, bool), np.zeros(8, bool), np.ones(8, bool)),  # empty pool: every slot
    ],
    ids=["none_eligible", "empty_pool"],
)
def test_draws_fall_back_to_valid_then_all_slots(eligible, valid, drawable):
    indices, log_probs, num_drawable, _ = draw_many(
        LOG_WEIGHT, eligible, valid, batch_size=3, replace=True
    )
    expected = numpy_log_probs(LOG_WEIGHT, drawable)
    counts = np.bincount(np.asarray(indices).reshape(-1), minlength=8)
    assert fits(counts, np.exp(expected))
    np.testing.assert_allclose(log_probs, expected[np.asarray(indices)], rtol=1e-5)
    assert (np.asarray(num_drawable) == drawable.sum()).all()


def numpy_inclusion(probs, k):
    """P(slot i is among k draws without replacement, each draw proportional to the
    weights of the slots left), by enumerating the ordered draws."""
    inclusion = np.zeros(len(probs))
    support = np.flatnonzero(probs)
    for order in itertools.permutations(support, k):
        p, left = 1.0, 1.0
        for i in order:
            p *= probs[i] / left
            left -= probs[i]
        inclusion[list(order)] += p
    return inclusion


def test_draws_without_replacement_are_distinct_and_sequential_in_the_weights():
    indices, log_probs, _, _ = draw_many(LOG_WEIGHT, ELIGIBLE, VALID, batch_size=3, replace=False)
    indices = np.asarray(indices)
    assert all(len(set(row)) == 3 for row in indices)
    assert not np.isin(indices, np.flatnonzero(~ELIGIBLE)).any()
    probs = np.exp(numpy_log_probs(LOG_WEIGHT, ELIGIBLE))
    # The first of the three is one draw from the weights; slot i is among the three with
    # the probability of sequential draws without replacement (Gumbel top-k).
    assert fits(np.bincount(indices[:, 0], minlength=8), probs)
    inclusion = np.bincount(indices.reshape(-1), minlength=8) / NUM_DRAWS
    want = numpy_inclusion(probs, 3)
    np.testing.assert_allclose(want.sum(), 3.0)
    np.testing.assert_allclose(inclusion, want, atol=4 * np.sqrt(0.25 / NUM_DRAWS))
    assert np.abs(want - 3 * probs).max() > 0.1  # not simply 3 x the weights
    # The log-probability reported is that of one draw, as with replacement.
    np.testing.assert_allclose(log_probs, np.log(probs[indices]), rtol=1e-5)


def test_without_replacement_a_small_pool_gives_each_slot_then_repeats():
    eligible = np.array([0, 1, 0, 0, 0, 0, 1, 0], bool)  # 2 drawable slots, batch of 3
    indices, _, num_drawable, _ = draw_many(
        LOG_WEIGHT, eligible, VALID, batch_size=3, replace=False
    )
    indices = np.asarray(indices)
    assert (np.asarray(num_drawable) == 2).all()
    assert all(set(row[:2]) == {1, 6} for row in indices)
    assert np.isin(indices[:, 2], [1, 6]).all()
    # The extra row is a draw with replacement from the weights.
    extra = np.bincount(indices[:, 2], minlength=8)
    assert fits(extra, np.exp(numpy_log_probs(LOG_WEIGHT, eligible)))


# ---------------------------------------------------------------- counts and draw_written


def test_count_draws_adds_each_slots_occurrences():
    rng = np.random.default_rng(0)
    meta = rng.integers(0, 5, (6, 4)).astype(np.int32)
    indices = np.array([3, 1, 3, 0, 3, 1], np.int32)
    got = jax.jit(pools.count_draws)(meta, indices, meta[indices, pools.TIMES_SAMPLED])
    want = meta.copy()
    want[:, pools.TIMES_SAMPLED] += np.bincount(indices, minlength=6)
    np.testing.assert_array_equal(got, want)  # the other columns untouched


@jax.jit
def draw_written_many(count):
    """NUM_DRAWS independent calls of draw_written on a pool of 8 slots."""
    keys = jax.random.split(jax.random.key(1), NUM_DRAWS)
    draw = functools.partial(pools.draw_written, batch_size=4, pool_size=8)
    return jax.vmap(draw, in_axes=(0, None))(keys, count)


@pytest.mark.parametrize("count", [5, 8, 1, 0])
def test_draw_written_is_uniform_over_the_first_count_slots(count):
    pool_size = 8
    indices, prob = draw_written_many(jnp.int32(count))
    written = count or pool_size  # an empty pool draws over all its slots
    expected = np.where(np.arange(pool_size) < written, 1.0 / written, 0.0)
    counts = np.bincount(np.asarray(indices).reshape(-1), minlength=pool_size)
    assert len(counts) == pool_size and fits(counts, expected)
    np.testing.assert_allclose(prob, 1.0 / written)
    if written < pool_size:
        assert not fits(counts, np.full(pool_size, 1.0 / pool_size))
