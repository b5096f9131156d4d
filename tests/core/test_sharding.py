"""Tests for replax/core/sharding.py on the 8 simulated CPU devices of tests/conftest.py: mesh
shapes, the rule table, where a sharded batch's rows land, and a jitted step that keeps
its state's layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from replax.core import sharding

RULES = sharding.validate_rules(sharding.DEFAULT_RULES)

# ---------------------------------------------------------------- mesh shape


@pytest.mark.parametrize(
    "shape, expected",
    [
        ((-1, 1, 1), (8, 1, 1)),
        ((2, -1, 2), (2, 2, 2)),
        ((1, 2, -1), (1, 2, 4)),
        ((2, 2, 2), (2, 2, 2)),
        ([4, 2, 1], (4, 2, 1)),
    ],
)
def test_validate_mesh_shape_fills_minus_one(shape, expected):
    assert sharding.validate_mesh_shape(shape, 8) == expected


@pytest.mark.parametrize(
    "shape, message",
    [
        ((8, 1), "must have 3 entries"),
        ((-1, -1, 2), "at most one entry may be -1"),
        ((0, 8, 1), "positive or -1"),
        ((-2, 4, 1), "positive or -1"),
        ((3, -1, 1), "3 does not divide the 8 devices"),
        ((2, 2, 1), "has 4 devices, but 8 are available"),
        ((4, 2, 2), "has 16 devices, but 8 are available"),
    ],
)
def test_validate_mesh_shape_rejects_bad_shapes(shape, message):
    with pytest.raises(ValueError, match=message) as info:
        sharding.validate_mesh_shape(shape, 8)
    assert str(info.value).startswith("mesh.shape=")


def test_make_mesh_names_axes_and_uses_every_device_once():
    mesh = sharding.make_mesh((2, -1, 2))
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert sorted(d.id for d in mesh.devices.flat) == list(range(8))


def test_make_mesh_on_given_devices():
    devices = jax.devices()[2:6]
    mesh = sharding.make_mesh((-1, 1, 1), devices=devices)
    assert dict(mesh.shape) == {"data": 4, "fsdp": 1, "tensor": 1}
    assert [d.id for d in mesh.devices.flat] == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="3 does not divide the 4 devices"):
        sharding.make_mesh((3, -1, 1), devices=devices)


# ---------------------------------------------------------------- rules


def test_validate_rules_normalises_lists_to_tuples():
    rules = sharding.validate_rules([["batch", ["data", "fsdp"]], ("embed", "fsdp"), ("mlp", None)])
    assert rules == (("batch", ("data", "fsdp")), ("embed", "fsdp"), ("mlp", None))


@pytest.mark.parametrize(
    "rules, message",
    [
        ([("sequence", "data")], "unknown logical axis 'sequence'"),
        ([("heads", "model")], r"mesh.rules\['heads'\]: unknown mesh axis 'model'"),
        ([("batch", ("data", "pipeline"))], "unknown mesh axis 'pipeline'"),
        ([("batch", "data", "fsdp")], "must be \\(logical_axis, mesh_axes\\)"),
    ],
)
def test_validate_rules_rejects_unknown_names(rules, message):
    with pytest.raises(ValueError, match=message):
        sharding.validate_rules(rules)


def test_logical_to_spec_follows_the_rule_table():
    assert sharding.logical_to_spec(("batch", None), RULES) == P(("data", "fsdp"), None)
    assert sharding.logical_to_spec(("embed", "mlp"), RULES) == P("fsdp", "tensor")
    assert sharding.logical_to_spec(("length", "head_dim"), RULES) == P(None, None)
    with pytest.raises(ValueError, match="unknown logical axis 'time'"):
        sharding.logical_to_spec(("batch", "time"), RULES)


@pytest.mark.parametrize(
    "mesh_shape, batch_rule, expected",
    [
        ((2, 2, 2), ("data", "fsdp"), 4),
        ((2, 2, 2), "data", 2),
        ((2, 2, 2), None, 1),
        ((8, 1, 1), ("data", "fsdp"), 8),
        ((1, 1, 8), ("data", "fsdp"), 1),
    ],
)
def test_data_parallel_size_is_the_product_of_the_batch_axes(mesh_shape, batch_rule, expected):
    rules = sharding.validate_rules([("batch", batch_rule)])
    assert sharding.data_parallel_size(sharding.make_mesh(mesh_shape), rules) == expected


def test_check_batch_names_the_batch_and_the_shard_count():
    mesh = sharding.make_mesh((2, 2, 2))
    sharding.check_batch("train.batch_size", 8, mesh, RULES)
    with pytest.raises(ValueError, match=r"train.batch_size=6 is not divisible by the 4 data"):
        sharding.check_batch("train.batch_size", 6, mesh, RULES)
    with pytest.raises(ValueError, match="use a multiple of 4"):
        sharding.check_batch("train.batch_size", 2, mesh, RULES)


# ---------------------------------------------------------------- placing arrays


def test_shard_batch_puts_each_row_on_its_data_shard():
    """Mesh 2 x 2 x 2: the batch is split over data x fsdp (4 shards of 2 rows) and each
    shard is replicated over the 2 tensor devices."""
    mesh = sharding.make_mesh((2, 2, 2))
    tokens = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)  # row i holds 3i, 3i+1, 3i+2
    reward = np.arange(8, dtype=np.float32) / 2
    placed = sharding.shard_batch({"tokens": tokens, "reward": reward}, mesh, RULES)

    assert placed["tokens"].sharding == NamedSharding(mesh, P(("data", "fsdp"), None))
    assert placed["reward"].sharding == NamedSharding(mesh, P(("data", "fsdp")))
    for d in range(2):
        for f in range(2):
            rows = slice(2 * (2 * d + f), 2 * (2 * d + f) + 2)
            for t in range(2):
                device = mesh.devices[d, f, t]
                (tokens_shard,) = [
                    s for s in placed["tokens"].addressable_shards if s.device == device
                ]
                (reward_shard,) = [
                    s for s in placed["reward"].addressable_shards if s.device == device
                ]
                np.testing.assert_array_equal(tokens_shard.data, tokens[rows])
                np.testing.assert_array_equal(reward_shard.data, reward[rows])
    np.testing.assert_array_equal(placed["tokens"], tokens)


def test_abstract_like_keeps_shape_dtype_and_sharding():
    mesh = sharding.make_mesh((2, 2, 2))
    weights = jax.device_put(
        np.ones((4, 6), np.float32), sharding.named(mesh, ("embed", "mlp"), RULES)
    )
    tree = {"w": weights, "step": jnp.zeros((), jnp.int32), "host": np.zeros(3), "n": 7}
    abstract = sharding.abstract_like(tree)
    assert abstract["w"] == jax.ShapeDtypeStruct((4, 6), jnp.float32, sharding=weights.sharding)
    assert abstract["w"].sharding.spec == P("fsdp", "tensor")
    assert abstract["step"].shape == () and abstract["step"].dtype == jnp.int32
    # Host values are not arrays with a layout: they pass through unchanged.
    assert abstract["host"] is tree["host"] and abstract["n"] == 7


def test_jit_state_step_keeps_state_shardings_and_donates_the_state():
    mesh = sharding.make_mesh((2, 2, 2))
    state_shardings = {
        "w": sharding.named(mesh, ("embed", "mlp"), RULES),
        "count": sharding.replicated(mesh),
    }
    batch_sharding = sharding.named(mesh, ("batch", None), RULES)

    def step(state, batch):
        new_state = {"w": state["w"] + jnp.sum(batch), "count": state["count"] + 1}
        return new_state, {"batch_sum": jnp.sum(batch)}

    run = sharding.jit_state_step(step, mesh, RULES, state_shardings, batch_sharding)
    state = jax.device_put(
        {"w": np.zeros((4, 6), np.float32), "count": np.int32(0)}, state_shardings
    )
    old_w = state["w"]
    batch = sharding.shard_batch(np.ones((8, 2), np.float32), mesh, RULES)
    state, out = run(state, batch)
    state, out = run(state, batch)

    np.testing.assert_array_equal(state["w"], np.full((4, 6), 32.0))  # 2 steps x 16 ones
    assert int(state["count"]) == 2 and float(out["batch_sum"]) == 16.0
    assert state["w"].sharding == state_shardings["w"]
    assert state["count"].sharding.is_equivalent_to(state_shardings["count"], 0)
    assert out["batch_sum"].sharding.is_fully_replicated
    assert old_w.is_deleted()  # donated to the first call
    assert run.jitted._cache_size() == 1


def test_weight_stationary_rules_keep_the_rows_whole_over_the_weights_axes():
    """A decode step's rules: the rows no longer split over fsdp (which splits the
    weights' embedding), still over data; every other rule as it was."""
    ws = sharding.weight_stationary_rules(RULES)
    assert dict(ws)["batch"] == "data"
    assert {k: v for k, v in ws if k != "batch"} == {k: v for k, v in RULES if k != "batch"}
    # No weight split over the rows' axes: the same rules.
    replicated = tuple((k, None if k == "embed" else v) for k, v in RULES)
    assert sharding.weight_stationary_rules(replicated) == replicated
    # Rows over fsdp alone, the weights over fsdp too: the rows whole.
    fsdp_rows = tuple((k, "fsdp" if k == "batch" else v) for k, v in RULES)
    assert dict(sharding.weight_stationary_rules(fsdp_rows))["batch"] is None
    # Tensor-parallel weights take tensor off the rows as well.
    wide = tuple((k, ("data", "fsdp", "tensor") if k == "batch" else v) for k, v in RULES)
    assert dict(sharding.weight_stationary_rules(wide))["batch"] == "data"
    assert sharding.weight_stationary_rules(()) == ()
