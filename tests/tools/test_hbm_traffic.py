"""replax/tools/hbm_traffic.py: the HBM bytes of programs compiled for one v5e chip on this
CPU host, against what each plainly moves; and why the compiler's own count cannot be
used for a decode step (a loop's body counted once)."""

import jax
import jax.numpy as jnp
import pytest

from replax.tools import hbm_traffic, tpu_targets

MIB = 2**20


@pytest.fixture(scope="module")
def chip():
    mesh = jax.sharding.Mesh(tpu_targets.target("v5e:1x1").devices, ("x",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def _compile(chip, f, *shapes, donate=()):
    args = [jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=chip) for s in shapes]
    return jax.jit(f, donate_argnums=donate).lower(*args).compile()


def _xla_bytes(compiled):
    cost = compiled.cost_analysis()
    return (cost[0] if isinstance(cost, list | tuple) else cost)["bytes accessed"]


def test_a_loop_body_counts_its_trip_count_times_where_the_compiler_counts_it_once(chip):
    # A 256 MiB weight (too large to stay on chip) multiplied in a loop of n steps is
    # read from HBM n times.
    d = 11585  # d x d bf16: 256 MiB

    def loop(n):
        return lambda w, x: jax.lax.fori_loop(0, n, lambda i, x: jnp.tanh(x @ w), x)

    two, ten = (_compile(chip, loop(n), (d, d), (8, d)) for n in (2, 10))
    assert _xla_bytes(two) == _xla_bytes(ten)  # the compiler: the body once
    weight = d * d * 2
    for n, compiled in ((2, two), (10, ten)):
        moved = hbm_traffic.hbm_bytes(compiled.as_text())
        assert moved["unknown_trip_counts"] == []
        assert n * weight <= moved["total"] <= n * weight + 2 * MIB, n


def test_an_in_place_update_moves_the_update_and_a_reduction_reads_once(chip):
    cache = (64, 8, 1024, 128)  # 128 MiB
    update = _compile(
        chip,
        lambda c, u: jax.lax.dynamic_update_slice(c, u, (0, 0, 5, 0)),
        cache,
        (64, 8, 1, 128),
        donate=(0,),
    )
    # The 128 KiB update is read and written; the donated cache is not copied.
    assert hbm_traffic.hbm_bytes(update.as_text())["total"] < MIB
    read = _compile(chip, lambda c: c.sum(axis=2), cache)
    total = hbm_traffic.hbm_bytes(read.as_text())["total"]
    assert 128 * MIB <= total <= 129 * MIB


def test_a_data_dependent_loop_is_counted_once_and_named(chip):
    d = 4096

    def until_small(w, x):
        cond = lambda x: jnp.sum(x.astype(jnp.float32)) > 1.0
        return jax.lax.while_loop(cond, lambda x: jnp.tanh(x @ w), x)

    moved = hbm_traffic.hbm_bytes(_compile(chip, until_small, (d, d), (8, d)).as_text())
    assert len(moved["unknown_trip_counts"]) == 1
    assert moved["total"] < 2 * d * d * 2 + MIB


def test_loops_give_each_loops_bytes_a_trip_inner_loops_multiplied_out(chip):
    # 5 trips of (3 trips of a matmul reading a 256 MiB weight, then a tanh): the inner
    # loop's trip reads the weight once, the outer loop's three times.
    d = 11585
    inner = lambda w, x: jax.lax.fori_loop(0, 3, lambda i, x: x @ w, x)
    outer = lambda w, x: jax.lax.fori_loop(0, 5, lambda i, x: jnp.tanh(inner(w, x)), x)
    text = _compile(chip, outer, (d, d), (8, d)).as_text()
    (loop,) = hbm_traffic.loops(text)
    weight = d * d * 2
    assert loop["trips"] == 5 and [i["trips"] for i in loop["inner"]] == [3]
    (body,) = loop["inner"]
    assert weight <= body["bytes_per_trip"] <= weight + MIB
    assert 3 * body["bytes_per_trip"] <= loop["bytes_per_trip"] <= 3 * body["bytes_per_trip"] + MIB
    total = hbm_traffic.hbm_bytes(text)["total"]
    assert 5 * loop["bytes_per_trip"] <= total <= 5 * loop["bytes_per_trip"] + 2 * MIB
