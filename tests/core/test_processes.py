"""Tests for replax/core/processes.py in one process over the 8 simulated CPU devices of
tests/conftest.py: the launcher's environment, each process's rows, and the helpers that
must be the identity with one process. tests/scripts/test_multihost.py runs them over
several processes against a single-process run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from replax.core import processes, sharding


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, False),
        ({"TPU_WORKER_HOSTNAMES": "localhost"}, False),
        ({"TPU_WORKER_HOSTNAMES": "t1v-0,t1v-1"}, True),
        ({"SLURM_NTASKS": "1"}, False),
        ({"SLURM_NTASKS": "4"}, True),
        ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, True),
    ],
)
def test_is_multi_host_reads_the_launcher_environment(environ, expected):
    assert processes.is_multi_host(environ) is expected


@pytest.mark.parametrize(
    "environ, flags, expected",
    [
        ({}, {}, None),
        ({"JAX_NUM_PROCESSES": "1"}, {}, None),
        (
            {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "2"},
            {"process_id": 1},
            {"coordinator_address": "10.0.0.1:1234", "num_processes": 2, "process_id": 1},
        ),
        (
            {"JAX_NUM_PROCESSES": "4"},
            {"coordinator_address": "h:1", "num_processes": 2},
            {"coordinator_address": "h:1", "num_processes": 2, "process_id": None},
        ),
        ({"TPU_WORKER_HOSTNAMES": "a,b"}, {}, {}),
    ],
)
def test_distributed_args_flags_win_over_the_environment(environ, flags, expected):
    assert processes.distributed_args(environ, **flags) == expected


def _mesh():
    return sharding.make_mesh((-1, 1, 1))


def test_one_process_holds_every_row_and_the_whole_block():
    rows = NamedSharding(_mesh(), P("data"))
    assert processes.process_rows(rows, (16, 3)) == slice(0, 16)
    assert processes.process_block(rows) == (0, 1)


def test_one_process_helpers_return_their_input():
    mesh = _mesh()
    rows = NamedSharding(mesh, P("data"))
    local = np.arange(16, dtype=np.int32).reshape(8, 2)
    assert processes.global_batch(local, rows, 8) is local
    assert processes.global_from_whole(local, rows) is local
    placed = jax.device_put(jnp.asarray(local), rows)
    np.testing.assert_array_equal(processes.local_rows(placed), local)
    np.testing.assert_array_equal(processes.to_host(placed), local)
    np.testing.assert_array_equal(processes.sum_over_processes(np.array([2, 3])), [2, 3])
    assert processes.from_process_zero(np.int32(7)) == 7
    assert processes.any_process(True) and not processes.any_process(False)
    processes.barrier("one process: returns at once")


def test_copy_to_process_mesh_lays_leaves_out_on_the_targets():
    devices = jax.devices()
    source = sharding.make_mesh((4, 1, 1), devices[:4])
    target = sharding.make_mesh((2, 1, 2), devices[4:])
    x = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(source, P("data")))
    want = NamedSharding(target, P("data", "tensor"))
    (copied,) = processes.copy_to_process_mesh([x], [want], {})
    assert copied.sharding == want
    np.testing.assert_array_equal(np.asarray(copied), np.asarray(x))
