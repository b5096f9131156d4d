"""Tests for replax/sampling/generation.py: the engine's whole program, and its drain that
steps the slots down once the queue is empty: the same rollouts as without it (which
tests/sampling/test_engine.py checks against each rollout generated alone), fewer
decoded row-steps, and bad halvings refused in one line."""

import jax
import numpy as np
import pytest
from test_engine import RNG, TOP_P, G, assert_same, make, params, prompts  # noqa: F401

from replax.core import sharding
from replax.sampling import engine as engine_lib
from replax.sampling import generation


def _generate(engine, params):  # noqa: F811 - the fixture's value
    ids, mask = prompts()
    return engine.generate_with_stats(params, ids, mask, jax.random.key(RNG), num_samples=G)


def _plain(out):
    return {k: np.asarray(getattr(out, k)) for k in ("tokens", "mask", "logprobs", "lengths")}


def test_stepping_down_keeps_every_rollout_and_decodes_fewer_row_steps(params):  # noqa: F811
    sampler = make(**TOP_P)
    for slots, refill_every, halvings in ((4, 1, 2), (8, 2, 3)):
        flat, flat_stats = _generate(
            engine_lib.make_engine(sampler, slots=slots, refill_every=refill_every), params
        )
        out, stats = _generate(
            engine_lib.make_engine(
                sampler, slots=slots, refill_every=refill_every, drain_halvings=halvings
            ),
            params,
        )
        assert_same(out, _plain(flat))
        kept = int(flat.lengths.sum())
        assert int(stats.useful_row_steps) == kept == int(flat_stats.useful_row_steps)
        # Without halvings every step ran over all S slots; with them the tail ran in fewer.
        assert int(flat_stats.row_steps) == int(flat_stats.decode_steps) * slots
        assert kept <= int(stats.row_steps) < int(flat_stats.row_steps), (slots, halvings)
        assert int(stats.row_steps) < int(stats.decode_steps) * slots


def test_on_a_mesh_the_slots_step_down_over_the_data_shards(params):  # noqa: F811
    unsharded, _ = _generate(engine_lib.make_engine(make(**TOP_P), slots=8, refill_every=2), params)
    mesh = sharding.make_mesh((2, 2, 2))  # 4 data shards: 8 slots step down to 4
    engine = engine_lib.make_engine(
        make(mesh=mesh, **TOP_P), slots=8, refill_every=2, drain_halvings=1
    )
    out, stats = _generate(engine, params)
    assert len(out.tokens.sharding.device_set) == 8
    assert_same(out, _plain(unsharded))
    assert int(stats.row_steps) < int(stats.decode_steps) * 8


def test_the_sizes_halve_to_multiples_of_the_data_shards():
    assert generation.drain_sizes(32, 0, 1) == ()
    assert generation.drain_sizes(32, 3, 4) == (16, 8, 4)
    assert generation.drain_sizes(12, 2, 1) == (6, 3)


@pytest.mark.parametrize(
    "slots, halvings, mesh_shape",
    [(4, -1, None), (4, 3, None), (6, 2, None), (8, 2, (2, 2, 2)), (4, 1.5, None)],
)
def test_bad_halvings_are_refused_in_one_line(slots, halvings, mesh_shape):
    mesh = None if mesh_shape is None else sharding.make_mesh(mesh_shape)
    with pytest.raises(ValueError, match=rf"rollout\.drain_halvings={halvings}: allowed") as error:
        engine_lib.make_engine(
            make(mesh=mesh), slots=slots, refill_every=1, drain_halvings=halvings
        )
    assert "\n" not in str(error.value)
