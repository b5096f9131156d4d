"""The engine's rounds by hand: a refill takes queue entries in order into the free
slots, copying each one's prompt prefix; a harvest writes a stopped slot's completion to
its queue row and frees the slot; a decode chunk stops after K steps."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from conftest import TINY

from replax.model import transformer as model_lib
from replax.sampling import decode as decode_lib
from replax.sampling import slots as slots_lib
from replax.sampling.distributions import SamplingConfig

CONFIG = dataclasses.replace(TINY, max_len=24)
P, N, G = 4, 6, 2
SETTINGS = slots_lib.Settings(
    model=model_lib.Transformer(CONFIG),
    slots=3,
    refill_every=2,
    max_new_tokens=N,
    stop_ids=(63,),
    pad_id=0,
    vocab_size=None,
    cache_dtype=None,
    data_shards=1,
)


def setup():
    dummy = jnp.zeros((1, 1), jnp.int32)
    params = model_lib.Transformer(CONFIG).init(jax.random.key(0), dummy, dummy)["params"]
    ids = jnp.asarray([[5, 6, 7, 8], [0, 9, 10, 11]], jnp.int32)  # the second left-padded
    mask = ids > 0
    queue = slots_lib.prefill_queue(params, ids, mask, jax.random.key(1), 0, G, SETTINGS)
    return params, queue


def test_refill_takes_the_queue_in_order_and_copies_each_prompts_prefix():
    params, queue = setup()
    state = slots_lib.empty_slots(SETTINGS, P)
    state, next_rollout, admitted = slots_lib.refill(state, queue, 0, 4, G, SETTINGS)
    assert bool(admitted) and int(next_rollout) == 3
    np.testing.assert_array_equal(state.rollout, [0, 1, 2])
    np.testing.assert_array_equal(state.done, [False] * 3)
    # Rollouts 0, 1 are prompt 0's samples, rollout 2 prompt 1's: their prefix (slots
    # [0, P - 1)) and valid-slot mask are their prompt's, their random numbers their own.
    for slot, prompt in enumerate([0, 0, 1]):
        for layer in range(CONFIG.num_layers):
            np.testing.assert_array_equal(
                state.cache[layer]["k"][slot, :, : P - 1], queue.prefix[layer]["k"][prompt]
            )
        np.testing.assert_array_equal(state.kv_mask[slot], queue.kv_mask[prompt])
        np.testing.assert_array_equal(state.uniforms[slot], queue.uniforms[slot])
    assert not bool(state.kv_mask[2, 0]) and bool(state.kv_mask[2, 1])
    # Nothing free: a refill admits nothing.
    state, next_rollout, admitted = slots_lib.refill(state, queue, 3, 4, G, SETTINGS)
    assert not bool(admitted) and int(next_rollout) == 3


def test_harvest_writes_a_stopped_slot_to_its_row_and_frees_it():
    params, queue = setup()
    state = slots_lib.empty_slots(SETTINGS, P)
    state, _, _ = slots_lib.refill(state, queue, 0, 4, G, SETTINGS)
    greedy = SamplingConfig(temperature=0.0)
    head = decode_lib.decode_head(params, CONFIG)
    state, steps, useful = slots_lib.decode_chunk(params, head, state, greedy, SETTINGS)
    assert int(steps) == 2 and int(useful) == 2 * 3  # K = 2 steps of 3 live slots
    np.testing.assert_array_equal(state.step, [2, 2, 2])
    state = state.replace(done=jnp.asarray([False, True, False]))  # slot 1 stops
    table = slots_lib.empty_table(4, SETTINGS)
    state, table = slots_lib.harvest(state, table, SETTINGS)
    np.testing.assert_array_equal(state.rollout, [0, -1, 2])
    np.testing.assert_array_equal(table["lengths"], [0, 2, 0, 0])
    np.testing.assert_array_equal(table["tokens"][1], state.tokens[1])
    # The freed slot takes the next entry, rollout 3 (prompt 1's second sample).
    state, next_rollout, _ = slots_lib.refill(state, queue, 3, 4, G, SETTINGS)
    np.testing.assert_array_equal(state.rollout, [0, 3, 2])
    assert int(next_rollout) == 4 and int(state.step[1]) == 0


def test_a_refill_admits_at_most_max_admit_an_equal_share_in_each_data_shard():
    """4 slots over 2 data shards, max_admit 2: each refill takes the first free slot of
    each shard (the next queue entries in slot order); the rest wait for the next refill.
    An explicit limit (the first fill's: every slot) overrides it."""
    params, queue = setup()
    settings = dataclasses.replace(SETTINGS, slots=4, data_shards=2, max_admit=2)
    state = slots_lib.empty_slots(settings, P)
    state, next_rollout, _ = slots_lib.refill(state, queue, 0, 4, G, settings)
    np.testing.assert_array_equal(state.rollout, [0, -1, 1, -1])
    assert int(next_rollout) == 2
    state, next_rollout, _ = slots_lib.refill(state, queue, next_rollout, 4, G, settings)
    np.testing.assert_array_equal(state.rollout, [0, 2, 1, 3])
    for slot, prompt in enumerate([0, 1, 0, 1]):  # rollouts 0, 2, 1, 3
        np.testing.assert_array_equal(
            state.cache[0]["k"][slot, :, : P - 1], queue.prefix[0]["k"][prompt]
        )
    state = slots_lib.empty_slots(settings, P)
    state, next_rollout, _ = slots_lib.refill(state, queue, 0, 4, G, settings, limit=4)
    np.testing.assert_array_equal(state.rollout, [0, 1, 2, 3])
