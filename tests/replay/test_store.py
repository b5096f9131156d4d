"""Tests for replax/replay/store.py: FIFO writes, strategies' distributions, limits, sharding."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from replax.replay.store import ReplayConfig, make_replay_buffer

EXAMPLE_ITEM = {
    "tokens": jax.ShapeDtypeStruct((2,), jnp.int32),
    "reward": jax.ShapeDtypeStruct((), jnp.float32),
    "advantage": jax.ShapeDtypeStruct((), jnp.float32),
}


def make_items(ids, reward=None, advantage=None):
    """R items whose tokens are [id, -id], so a slot's content names its item."""
    ids = jnp.asarray(ids, jnp.int32)
    zeros = jnp.zeros(ids.shape, jnp.float32)
    return {
        "tokens": jnp.stack([ids, -ids], axis=1),
        "reward": zeros if reward is None else jnp.asarray(reward, jnp.float32),
        "advantage": zeros if advantage is None else jnp.asarray(advantage, jnp.float32),
    }


def ids_in(state):
    return np.asarray(state.items["tokens"][:, 0])


def draw_many(buffer, state, batch_size, step, num_draws=1000, seed=0):
    """Indices int32[num_draws, B], probs and SampleInfo of num_draws independent samples."""
    keys = jax.random.split(jax.random.key(seed), num_draws)
    info = _vmapped_sampler(buffer, batch_size)(state, keys, step)
    return np.asarray(info.indices), np.asarray(info.probs), info


@functools.cache
def _vmapped_sampler(buffer, batch_size):
    """One compilation per buffer and batch size (compiles dominate this file's runtime)."""
    sample = lambda state, key, step: buffer.sample(state, key, batch_size, step)[2]
    return jax.jit(jax.vmap(sample, in_axes=(None, 0, None)))


def total_variation(indices, expected_probs):
    counts = np.bincount(indices.reshape(-1), minlength=len(expected_probs))
    return 0.5 * np.abs(counts / counts.sum() - expected_probs).sum()


# ---------------------------------------------------------------- add: FIFO and keep mask


def test_fifo_order_wraparound_and_overwrite():
    buffer = make_replay_buffer(ReplayConfig(capacity=4))
    add = jax.jit(buffer.add, donate_argnums=0)
    state = add(buffer.init(EXAMPLE_ITEM), make_items([1, 2, 3]), 0)
    np.testing.assert_array_equal(ids_in(state), [1, 2, 3, 0])
    np.testing.assert_array_equal(state.valid, [True, True, True, False])
    assert int(state.head[0]) == 3 and int(state.count[0]) == 3

    state = add(state, make_items([4, 5, 6]), 1)  # wraps: 4 at slot 3, then 5, 6 over 1, 2
    np.testing.assert_array_equal(ids_in(state), [5, 6, 3, 4])
    np.testing.assert_array_equal(state.insert_step, [1, 1, 0, 1])
    assert int(state.head[0]) == 2 and int(state.count[0]) == 4

    state = add(state, make_items([7, 8, 9]), 2)  # the oldest (3, 4, then 5) go first
    np.testing.assert_array_equal(ids_in(state), [9, 6, 7, 8])
    assert state.valid.all() and int(state.head[0]) == 1


def test_add_more_items_than_capacity_keeps_the_last():
    buffer = make_replay_buffer(ReplayConfig(capacity=4))
    state = buffer.add(buffer.init(EXAMPLE_ITEM), make_items([1, 2]), 0)
    state = buffer.add(state, make_items([10, 11, 12, 13, 14, 15]), 1)
    # Six items from head 2: the last four land at slots 0..3 in FIFO order, head at 0.
    np.testing.assert_array_equal(ids_in(state), [12, 13, 14, 15])
    assert int(state.head[0]) == 0 and int(state.count[0]) == 4


def test_keep_mask_compacts_and_advances_head_by_kept():
    buffer = make_replay_buffer(ReplayConfig(capacity=6))
    state = buffer.add(buffer.init(EXAMPLE_ITEM), make_items([1, 2, 3, 4]), 0)
    state = jax.jit(buffer.add)(
        state, make_items([5, 6, 7, 8]), 1, jnp.array([False, True, False, True])
    )
    np.testing.assert_array_equal(ids_in(state), [1, 2, 3, 4, 6, 8])
    assert int(state.head[0]) == 0 and int(state.count[0]) == 6
    state = buffer.add(state, make_items([9, 10]), 2, jnp.array([False, False]))
    np.testing.assert_array_equal(ids_in(state), [1, 2, 3, 4, 6, 8])
    assert int(state.head[0]) == 0


def test_sharded_add_splits_items_into_contiguous_chunks():
    buffer = make_replay_buffer(ReplayConfig(capacity=8), 2)
    state = buffer.add(buffer.init(EXAMPLE_ITEM), make_items([1, 2, 3, 4]), 0)
    # Shard 0 (slots 0..3) takes items 1, 2; shard 1 (slots 4..7) takes 3, 4.
    np.testing.assert_array_equal(ids_in(state), [1, 2, 0, 0, 3, 4, 0, 0])
    keep = jnp.array([True, False, False, True])
    state = buffer.add(state, make_items([5, 6, 7, 8]), 1, keep)
    np.testing.assert_array_equal(ids_in(state), [1, 2, 5, 0, 3, 4, 8, 0])
    np.testing.assert_array_equal(state.head, [3, 3])
    np.testing.assert_array_equal(state.count, [3, 3])


# ---------------------------------------------------------------- strategies


def filled_buffer(strategy, capacity=8, num_shards=1, **kwargs):
    """Four adds of two items at steps 0..3: ids 1..8 in slots 0..7, step = slot // 2."""
    buffer = make_replay_buffer(ReplayConfig(capacity, strategy, **kwargs), num_shards)
    state = buffer.init(EXAMPLE_ITEM)
    rewards = [1, 0, 0, 1, 0, 0, 1, 0]
    advantages = [0.5, -1.0, 0.0, 2.0, -0.25, 0.0, 1.0, -3.0]
    for step in range(4):
        rows = slice(2 * step, 2 * step + 2)
        items = make_items(range(2 * step + 1, 2 * step + 3), rewards[rows], advantages[rows])
        state = buffer.add(state, items, step)
    return buffer, state


def test_uniform_draws_uniformly_over_valid_items_only():
    buffer = make_replay_buffer(ReplayConfig(capacity=8))
    state = buffer.add(buffer.init(EXAMPLE_ITEM), make_items([1, 2, 3, 4, 5]), 0)
    indices, probs, info = draw_many(buffer, state, batch_size=8, step=1)
    expected = np.array([0.2] * 5 + [0.0] * 3)
    assert indices.max() < 5
    assert total_variation(indices, expected) < 0.03
    np.testing.assert_allclose(probs, 0.2, rtol=1e-6)
    np.testing.assert_array_equal(info.importance_weights, 1.0)
    np.testing.assert_array_equal(info.age, 1)


def test_recency_draws_proportional_to_exp_minus_age_over_tau():
    buffer, state = filled_buffer("recency", recency_tau=1.5)
    indices, probs, _ = draw_many(buffer, state, batch_size=8, step=4)
    age = 4 - np.arange(8) // 2
    expected = np.exp(-age / 1.5) / np.exp(-age / 1.5).sum()
    assert total_variation(indices, expected) < 0.03
    assert total_variation(indices, np.full(8, 1 / 8)) > 0.2  # far from uniform
    np.testing.assert_allclose(probs, expected[indices], rtol=1e-5)


def test_positive_bias_keeps_freshest_and_freshest_old_correct():
    # K = 6, delta = 1/3: freshest 4 (slots 4..7) plus the freshest 2 correct of slots
    # 0..3; correct slots are 0 and 3 (slot 6 is correct but already fresh).
    buffer, state = filled_buffer("positive_bias", delta=1 / 3, positive_bias_size=6)
    indices, probs, _ = draw_many(buffer, state, batch_size=8, step=4)
    expected = np.array([1, 0, 0, 1, 1, 1, 1, 1]) / 6
    assert total_variation(indices, expected) < 0.03
    assert not np.isin(indices, [1, 2]).any()
    np.testing.assert_allclose(probs, 1 / 6, rtol=1e-6)
    # With room for one old correct item only, it is the fresher one (slot 3).
    buffer, state = filled_buffer("positive_bias", delta=0.2, positive_bias_size=5)
    indices, _, _ = draw_many(buffer, state, batch_size=8, step=4, num_draws=100)
    assert set(np.unique(indices)) == {3, 4, 5, 6, 7}


def test_priority_draws_proportional_to_advantage_and_weights_importance():
    alpha, beta, eps = 0.6, 0.4, 1e-3
    buffer, state = filled_buffer("priority", priority_alpha=alpha, priority_beta=beta)
    indices, probs, info = draw_many(buffer, state, batch_size=8, step=4)
    advantage = np.array([0.5, -1.0, 0.0, 2.0, -0.25, 0.0, 1.0, -3.0])
    priority = np.abs(advantage) ** alpha + eps
    expected = priority / priority.sum()
    assert total_variation(indices, expected) < 0.03
    np.testing.assert_allclose(probs, expected[indices], rtol=1e-5)
    weights = (8 * expected) ** -beta
    np.testing.assert_allclose(
        info.importance_weights, (weights / weights.max())[indices], rtol=1e-5
    )


def test_uniform_no_replacement_gives_distinct_indices_each_included_half_the_time():
    buffer, state = filled_buffer("uniform_no_replacement")
    indices, probs, _ = draw_many(buffer, state, batch_size=4, step=4)
    assert all(len(set(row)) == 4 for row in indices)
    inclusion = np.bincount(indices.reshape(-1), minlength=8) / len(indices)
    np.testing.assert_allclose(inclusion, 0.5, atol=0.05)
    np.testing.assert_allclose(probs, 1 / 8, rtol=1e-6)


def test_uniform_no_replacement_with_fewer_valid_items_takes_each_then_repeats():
    buffer = make_replay_buffer(ReplayConfig(capacity=8, strategy="uniform_no_replacement"))
    state = buffer.add(buffer.init(EXAMPLE_ITEM), make_items([1, 2, 3]), 0)
    indices, _, _ = draw_many(buffer, state, batch_size=5, step=1, num_draws=50)
    assert indices.max() < 3
    assert all(set(row) == {0, 1, 2} for row in indices)


# ---------------------------------------------------------------- limits


def test_max_age_makes_old_items_ineligible_and_falls_back_when_none_left():
    buffer, state = filled_buffer("uniform", max_age=1)
    indices, _, info = draw_many(buffer, state, batch_size=4, step=4, num_draws=200)
    assert set(np.unique(indices)) == {6, 7}  # only step 3 is at most 1 step old
    assert (np.asarray(info.age) <= 1).all()
    indices, _, _ = draw_many(buffer, state, batch_size=4, step=9, num_draws=200)
    assert set(np.unique(indices)) == set(range(8))  # nothing eligible: all valid items
    # The setting 0 is no limit (as the config key replay.max_age=0): at step 3 a limit of
    # 0 steps would leave step 3's items alone.
    buffer, state = filled_buffer("uniform", max_age=0)
    indices, _, _ = draw_many(buffer, state, batch_size=4, step=3, num_draws=200)
    assert set(np.unique(indices)) == set(range(8))


def test_traced_max_age_overrides_the_static_one_without_recompiling():
    buffer, state = filled_buffer("uniform", max_age=1)
    num_traces = 0

    def draw(state, key, limit):
        nonlocal num_traces
        num_traces += 1
        return buffer.sample(state, key, 64, 4, max_age=limit)[2]

    sample = jax.jit(draw)
    for limit, expected in ((0, set()), (1, {6, 7}), (2, {4, 5, 6, 7})):
        info = sample(state, jax.random.key(limit), jnp.int32(limit))
        drawn = set(np.unique(np.asarray(info.indices)))
        # max_age=0 leaves nothing eligible at step 4 (newest items are from step 3):
        # the draw falls back to every valid item.
        assert drawn == (expected or set(range(8)))
    assert num_traces == 1


def test_max_reuse_makes_used_items_ineligible():
    buffer = make_replay_buffer(ReplayConfig(capacity=4, max_reuse=1))
    state = buffer.add(buffer.init(EXAMPLE_ITEM), make_items([1, 2, 3, 4]), 0)
    sample = jax.jit(buffer.sample, static_argnums=2, donate_argnums=0)
    drawn = []
    for seed in range(4):
        state, batch, info = sample(state, jax.random.key(seed), 1, 1)
        assert int(info.times_sampled[0]) == 0
        assert int(batch["tokens"][0, 0]) == int(info.indices[0]) + 1
        drawn.append(int(info.indices[0]))
    assert sorted(drawn) == [0, 1, 2, 3]
    np.testing.assert_array_equal(state.times_sampled, [1, 1, 1, 1])
    state, _, info = sample(state, jax.random.key(9), 2, 1)  # all used: fallback
    assert (np.asarray(info.times_sampled) == 1).all()
    assert int(state.times_sampled.sum()) == 6


def test_traced_once_draws_never_drawn_items_each_once_and_off_draws_with_replacement():
    buffer = make_replay_buffer(ReplayConfig(capacity=16, strategy="positive_bias"))
    state = buffer.add(buffer.init(EXAMPLE_ITEM), make_items(range(1, 9)), 0)
    sample = jax.jit(buffer.sample, static_argnums=2)
    state, _, first = sample(state, jax.random.key(0), 4, 0, None, jnp.bool_(True))
    assert len(set(np.asarray(first.indices))) == 4 and (np.asarray(first.times_sampled) == 0).all()
    state, _, second = sample(state, jax.random.key(1), 4, 0, None, jnp.bool_(True))
    # The other four: every item drawn once over the two batches, none twice.
    assert sorted([*np.asarray(first.indices), *np.asarray(second.indices)]) == list(range(8))
    np.testing.assert_array_equal(state.times_sampled[:8], np.ones(8))
    # Off (same program): draws with replacement over every item, drawn before or not.
    _, _, off = sample(state, jax.random.key(2), 64, 0, None, jnp.bool_(False))
    assert len(set(np.asarray(off.indices))) < 64 and (np.asarray(off.times_sampled) == 1).all()


def test_times_sampled_counts_repeated_draws():
    buffer = make_replay_buffer(ReplayConfig(capacity=2))
    state = buffer.add(buffer.init(EXAMPLE_ITEM), make_items([1, 2]), 0)
    state, _, info = buffer.sample(state, jax.random.key(0), 16, 0)
    np.testing.assert_array_equal(state.times_sampled, np.bincount(info.indices, minlength=2))


# ---------------------------------------------------------------- sharding


def add_and_sample(buffer, state, items, rng, step, batch_size):
    state = buffer.add(state, items, step)
    return buffer.sample(state, rng, batch_size, step)


def test_sharded_buffer_matches_single_device_and_samples_locally():
    mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
    buffer = make_replay_buffer(ReplayConfig(capacity=32, strategy="priority"), 8)
    step_fn = jax.jit(functools.partial(add_and_sample, buffer, batch_size=16), donate_argnums=0)
    state = buffer.init(EXAMPLE_ITEM)
    sharding = buffer.state_sharding(state, mesh)
    item_sharding = NamedSharding(mesh, P("data"))
    # Two independent copies: donating one must not delete buffers the other shares.
    single = jax.device_put(buffer.init(EXAMPLE_ITEM), jax.devices()[0])
    sharded = jax.device_put(buffer.init(EXAMPLE_ITEM), sharding)
    for step in range(3):
        ids = jnp.arange(16) + 16 * step
        items = make_items(ids, advantage=jnp.sin(ids.astype(jnp.float32)))
        rng = jax.random.key(step)
        single, batch, info = step_fn(single, jax.device_put(items, jax.devices()[0]), rng, step)
        sharded, sharded_batch, sharded_info = step_fn(
            sharded, jax.device_put(items, item_sharding), rng, step
        )
        for got, want in zip(jax.tree.leaves(sharded), jax.tree.leaves(single)):
            np.testing.assert_array_equal(got, want)
        for got, want in zip(
            jax.tree.leaves((sharded_batch, sharded_info)), jax.tree.leaves((batch, info))
        ):
            np.testing.assert_array_equal(got, want)
        # Each shard's two rows of the batch come from its own four slots.
        shard_of_row = np.repeat(np.arange(8), 2)
        np.testing.assert_array_equal(np.asarray(info.indices) // 4, shard_of_row)
        assert sharded.items["tokens"].sharding.is_equivalent_to(item_sharding, 2)


def test_local_sampling_compiles_without_gathering_the_buffer():
    mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
    buffer = make_replay_buffer(ReplayConfig(capacity=32), 8)
    state = buffer.init(EXAMPLE_ITEM)
    sharding = buffer.state_sharding(state, mesh)
    sample = jax.jit(buffer.sample, static_argnums=2, in_shardings=(sharding, None, None))
    hlo = sample.lower(state, jax.random.key(0), 16, 0).compile().as_text()
    assert "all-gather" not in hlo and "all-to-all" not in hlo


def test_global_mode_draws_across_shards():
    buffer = make_replay_buffer(ReplayConfig(capacity=16, sample_mode="global"), 4)
    state = buffer.add(buffer.init(EXAMPLE_ITEM), make_items(range(8)), 0)
    indices, _, _ = draw_many(buffer, state, batch_size=4, step=0, num_draws=500)
    # Valid slots are 0, 1 of each shard's four; row 0 draws from all of them.
    assert set(np.unique(indices[:, 0])) == {0, 1, 4, 5, 8, 9, 12, 13}
    expected = np.zeros(16)
    expected[[0, 1, 4, 5, 8, 9, 12, 13]] = 1 / 8
    assert total_variation(indices, expected) < 0.04


# ---------------------------------------------------------------- draws: numerics and cost


def test_positive_bias_and_no_replacement_draws_are_pinned():
    # The default run samples with positive_bias, its on-policy variant with
    # uniform_no_replacement: changing which slots a key draws changes those runs' results,
    # so such a change has to be deliberate (and these numbers updated with it).
    buffer, state = filled_buffer("positive_bias", delta=1 / 3, positive_bias_size=6)
    info = buffer.sample(state, jax.random.key(0), 16, 4)[2]
    np.testing.assert_array_equal(info.indices, [4, 7, 5, 6, 4, 0, 4, 3, 4, 5, 4, 7, 4, 6, 5, 7])
    buffer, state = filled_buffer("positive_bias", capacity=16, num_shards=2, delta=0.5)
    info = buffer.sample(state, jax.random.key(1), 8, 4)[2]
    np.testing.assert_array_equal(info.indices, [2, 2, 3, 2, 10, 11, 10, 9])
    buffer, state = filled_buffer("uniform_no_replacement")
    info = buffer.sample(state, jax.random.key(0), 4, 4)[2]
    np.testing.assert_array_equal(info.indices, [3, 5, 6, 7])


@pytest.mark.parametrize("seed", range(3))
def test_a_draw_without_replacement_lays_its_rows_out_in_the_order_they_were_added(seed):
    # On-policy's ring of B slots and auto mode's whole ring drawing each waiting item once
    # make the same batch, row for row, from the same rollouts: a comparison of the two
    # designs then differs by design alone. The ring wraps, so slot order is not add order.
    def waiting(strategy, capacity, **sample):
        buffer = make_replay_buffer(ReplayConfig(capacity, strategy))
        state = buffer.init(EXAMPLE_ITEM)
        for step, first in enumerate(range(1, 13, 4)):  # ids 1..12, 4 a step
            state = buffer.add(state, make_items(range(first, first + 4)), step)
            if step < 2:  # the first 8 are drawn (and trained on) as they come
                state = buffer.sample(state, jax.random.key(9), 4, step, **sample)[0]
        state, batch, info = buffer.sample(state, jax.random.key(seed), 4, 2, **sample)
        return np.asarray(batch["tokens"][:, 0]), np.asarray(info.indices)

    onpolicy, _ = waiting("uniform_no_replacement", 4)
    auto, slots = waiting("positive_bias", 10, once=jnp.bool_(True))
    np.testing.assert_array_equal(onpolicy, [9, 10, 11, 12])
    np.testing.assert_array_equal(auto, onpolicy)
    np.testing.assert_array_equal(slots, [8, 9, 0, 1])  # 12 items in 10 slots: wrapped


def entry_ops_over_slots(hlo: str, capacity: int) -> list[str]:
    """Ops of the compiled entry computation that produce an array with a capacity-sized
    axis (e.g. f32[16384] or, per pool, s32[1,16384,4]), other than parameters, bitcasts
    and the output tuple."""
    ops = []
    for line in hlo[hlo.index("ENTRY") :].splitlines()[1:]:
        name, _, rest = line.partition("=")
        result_shape = rest.split("(")[0]  # e.g. " f32[1,16384]{1,0} fusion"
        axes = [a for dims in re.findall(r"\[([\d,]*)\]", result_shape) for a in dims.split(",")]
        skip = any(op in rest for op in ("parameter(", "bitcast(", "tuple("))
        if str(capacity) in axes and not skip:
            ops.append(name.strip())
    return ops


def test_uniform_add_and_sample_work_in_place_and_independently_of_capacity():
    capacity = 1 << 14
    buffer = make_replay_buffer(ReplayConfig(capacity=capacity))
    state = buffer.add(buffer.init(EXAMPLE_ITEM), make_items(range(100)), 0)
    add = jax.jit(buffer.add, donate_argnums=0).lower(state, make_items(range(8)), 1)
    sample = jax.jit(buffer.sample, static_argnums=2, donate_argnums=0)
    sample = sample.lower(state, jax.random.key(0), 8, 1)
    for compiled in (add.compile().as_text(), sample.compile().as_text()):
        # Only the in-place row writes touch [capacity] arrays: no copy, no full pass.
        ops = entry_ops_over_slots(compiled, capacity)
        assert ops and all("scatter" in op for op in ops), ops


# ---------------------------------------------------------------- errors and compilation


def test_bad_arguments_raise_with_names_and_sizes():
    with pytest.raises(ValueError, match=r"^replay.strategy='lifo': allowed are \('uniform', "):
        make_replay_buffer(ReplayConfig(capacity=8, strategy="lifo"))
    with pytest.raises(ValueError, match="capacity=10.*num_shards=4"):
        make_replay_buffer(ReplayConfig(capacity=10), 4)
    buffer = make_replay_buffer(ReplayConfig(capacity=8, strategy="uniform_no_replacement"), 2)
    state = buffer.init(EXAMPLE_ITEM)
    with pytest.raises(ValueError, match="3 items.*num_shards=2"):
        buffer.add(state, make_items([1, 2, 3]), 0)
    with pytest.raises(ValueError, match="batch_size=5.*num_shards=2"):
        buffer.sample(state, jax.random.key(0), 5, 0)
    with pytest.raises(ValueError, match=r"\(6\).*\(4\)"):
        buffer.sample(state, jax.random.key(0), 12, 0)
    bad_dtype = dict(make_items([1, 2]), reward=jnp.zeros(2, jnp.int32))
    with pytest.raises(ValueError, match=r"\['reward'\].*float32.*int32"):
        jax.jit(buffer.add)(state, bad_dtype, 0)
    bad_shape = dict(make_items([1, 2]), tokens=jnp.zeros((2, 3), jnp.int32))
    with pytest.raises(ValueError, match=r"\['tokens'\]: expected \[R, 2\].*\[2, 3\]"):
        buffer.add(state, bad_shape, 0)
    with pytest.raises(ValueError, match="structure"):
        buffer.add(state, {"tokens": jnp.zeros((2, 2), jnp.int32)}, 0)
    with pytest.raises(ValueError, match="keep has shape"):
        buffer.add(state, make_items([1, 2]), 0, jnp.ones(3, bool))
    with pytest.raises(ValueError, match="items\\['reward'\\]"):
        make_replay_buffer(ReplayConfig(capacity=8, strategy="positive_bias")).init(
            {"x": jnp.zeros(2)}
        )


def test_jitted_add_and_sample_with_donation_compiles_once():
    buffer = make_replay_buffer(ReplayConfig(capacity=8, strategy="recency"))
    num_traces = 0

    def train_step(state, items, rng, step):
        nonlocal num_traces
        num_traces += 1
        return add_and_sample(buffer, state, items, rng, step, batch_size=4)

    step_fn = jax.jit(train_step, donate_argnums=0)
    state = buffer.init(EXAMPLE_ITEM)
    for step in range(4):
        items = make_items(jnp.arange(2) + 2 * step)
        state, batch, info = step_fn(state, items, jax.random.key(step), step)
    assert num_traces == 1
    assert int(state.count[0]) == 8 and batch["tokens"].shape == (4, 2)
