"""The processes of a multi-host run: distributed start-up, each process's rows of a
global array, copies between process meshes, and agreement across processes.

With one process every helper returns host arrays unchanged, which jit places as it
always did; the same code runs on one host and on a TPU pod (one process per host).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding

from replax.core.lost_host import is_multi_host


def distributed_args(
    environ=os.environ,
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> dict | None:
    """jax.distributed.initialize's arguments for this launch, or None for one process.

    Flags win over JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID; what
    neither gives (all of it on a TPU slice or under SLURM) jax detects itself."""
    address = coordinator_address or environ.get("JAX_COORDINATOR_ADDRESS") or None
    count = num_processes if num_processes is not None else environ.get("JAX_NUM_PROCESSES")
    index = process_id if process_id is not None else environ.get("JAX_PROCESS_ID")
    count = None if count in (None, "") else int(count)
    index = None if index in (None, "") else int(index)
    if count == 1:
        return None
    if address or count is not None or index is not None:
        return {"coordinator_address": address, "num_processes": count, "process_id": index}
    return {} if is_multi_host(environ) else None


def _on_cloud_tpu_vm(environ) -> bool:
    """A Cloud TPU VM (jax found TPU chips and libtpu at import), other than Colab's
    single-host runtime: its slice may span several hosts, which only the VM's metadata
    says, so jax.distributed asks."""
    from jax._src import cloud_tpu_init

    return bool(getattr(cloud_tpu_init, "running_in_cloud_tpu_vm", False)) and not (
        environ.get("COLAB_RELEASE_TAG") or environ.get("TPU_SKIP_MDS_QUERY")
    )


def maybe_initialize_distributed(
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    environ=os.environ,
    log=print,
) -> None:
    """jax.distributed.initialize() on a multi-process launch (explicit flags or JAX_*
    variables, SLURM, a Cloud TPU pod slice); nothing for one process. Must run before
    anything asks jax for its devices."""
    if jax.distributed.is_initialized():
        return
    args = distributed_args(
        environ,
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
    )
    if args is not None:
        jax.distributed.initialize(**args)
    elif _on_cloud_tpu_vm(environ):
        try:
            jax.distributed.initialize()
        except Exception as e:  # noqa: BLE001 - a single-host VM whose metadata is out of reach
            first = (str(e).strip().splitlines() or [""])[0][:200]
            log(f"jax.distributed not initialised ({type(e).__name__}: {first}): one process")


def process_rows(sharding: jax.sharding.Sharding, shape: Sequence[int]) -> slice:
    """The rows [start, stop) of an array of `shape` whose blocks this process's devices
    hold: the whole array when its rows are not split over processes."""
    spans = sorted(
        {
            index[0].indices(shape[0])[:2]
            for index in sharding.addressable_devices_indices_map(tuple(shape)).values()
        }
    )
    for (_, stop), (start, _) in zip(spans, spans[1:]):
        if start != stop:
            raise ValueError(f"{sharding}: this process's rows {spans} are not contiguous")
    return slice(spans[0][0], spans[-1][1])


def process_block(sharding: NamedSharding) -> tuple[int, int]:
    """(i, n): this process holds the i-th of n equal blocks of rows of any array with
    this sharding ((0, 1) when its rows are not split over processes)."""
    size = sharding.mesh.size  # a number of rows every split of the mesh divides
    shape = (size,) + (1,) * max(len(sharding.spec) - 1, 0)
    rows = process_rows(sharding, shape)
    block = rows.stop - rows.start
    return rows.start // block, size // block


def global_batch(local, sharding: jax.sharding.Sharding, num_rows: int):
    """The global array of num_rows rows whose `process_rows` block is this process's
    `local` (host) array; with one process, `local` itself."""
    if jax.process_count() == 1:
        return local
    local = np.asarray(local)
    return jax.make_array_from_process_local_data(sharding, local, (num_rows, *local.shape[1:]))


def global_from_whole(whole, sharding: jax.sharding.Sharding):
    """The global array of a host array that every process holds whole; with one
    process, `whole` itself."""
    return whole if jax.process_count() == 1 else jax.device_put(whole, sharding)


def _process_blocks(leaves, mesh: Mesh) -> dict[int, np.ndarray]:
    """process -> its source devices of `leaves`, laid out as copies of `mesh`."""
    source = sorted(leaves[0].sharding.device_set, key=lambda d: (d.process_index, d.id))
    by_process: dict[int, list] = {}
    for d in source:
        by_process.setdefault(d.process_index, []).append(d)
    own = by_process[jax.process_index()]
    if len(own) % mesh.devices.size:
        raise ValueError(
            f"{len(own)} source devices on this process do not split into copies of the "
            f"{mesh.devices.size}-device mesh {dict(mesh.shape)}"
        )
    copies = len(own) // mesh.devices.size
    return {
        p: np.asarray(ds).reshape((copies, *mesh.devices.shape)) for p, ds in by_process.items()
    }


def process_copy_stage(leaves, targets):
    """The first step of `copy_to_process_mesh`, jitted (not yet compiled): the reshard
    of `leaves` (arrays, or ShapeDtypeStructs with shardings) over their devices into the
    targets' layout on a mirror mesh, one copy of it per process."""
    mesh = targets[0].mesh
    blocks = _process_blocks(leaves, mesh)
    mirror = Mesh(np.concatenate(list(blocks.values())), ("copies", *mesh.axis_names))
    staged = [NamedSharding(mirror, t.spec) for t in targets]
    return jax.jit(lambda xs: xs, out_shardings=staged)


def copy_to_process_mesh(leaves, targets, stage_cache: dict) -> list:
    """Global arrays `leaves` (over devices of every process) on `targets`, NamedShardings
    of a mesh of this process's devices alone, with several processes.

    JAX copies between device sets only from one set of processes to another, so the copy
    is two steps. One jitted reshard over the source devices into the target's layout,
    replicated over processes (every process takes part: the exchange between processes
    is this program's all-gather), on a mirror mesh whose block of each process is laid
    out as the target mesh; then each shard goes to the target device at its position,
    within the process. Each process must hold a multiple of the target's devices.
    stage_cache keeps the compiled reshard per target tree."""
    mesh = targets[0].mesh
    blocks = _process_blocks(leaves, mesh)
    key = tuple((t.spec, t.mesh.shape_tuple) for t in targets)
    if key not in stage_cache:
        stage_cache[key] = process_copy_stage(leaves, targets)
    staged = stage_cache[key](leaves)
    here = blocks[jax.process_index()][0]  # the source device of each target position
    positions = list(np.ndindex(mesh.devices.shape))
    sources, devices = [], []
    for x in staged:
        shards = {s.device: s.data for s in x.addressable_shards}
        sources += [shards[here[i]] for i in positions]
        devices += [mesh.devices[i] for i in positions]
    pieces = jax.device_put(sources, devices)  # every shard of the tree in one call
    n = len(positions)
    return [
        jax.make_array_from_single_device_arrays(x.shape, target, pieces[j * n : (j + 1) * n])
        for j, (x, target) in enumerate(zip(staged, targets))
    ]


def local_rows(x) -> np.ndarray:
    """This process's `process_rows` block of a global array, on the host."""
    if x.is_fully_addressable:
        return np.asarray(x)
    rows = process_rows(x.sharding, x.shape)
    out = np.empty((rows.stop - rows.start, *x.shape[1:]), x.dtype)
    for shard in x.addressable_shards:
        first = shard.index[0].indices(x.shape[0])
        out[(slice(first[0] - rows.start, first[1] - rows.start), *shard.index[1:])] = shard.data
    return out


def to_host(x) -> np.ndarray:
    """The whole of a global array on every process's host (an all-gather when other
    processes hold parts of it)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def sum_over_processes(value):
    """A host count (an int, or an int array of several) summed over processes (itself
    with one process)."""
    if jax.process_count() == 1:
        return value
    total = np.sum(multihost_utils.process_allgather(np.asarray(value, np.int32)), axis=0)
    return int(total) if np.ndim(total) == 0 else total


def from_process_zero(values):
    """Process 0's host values (a numpy array or scalar) on every process: for decisions
    that must agree, such as a checkpoint step or measured seconds."""
    if jax.process_count() == 1:
        return values
    return multihost_utils.broadcast_one_to_all(values)


def any_process(flag: bool) -> bool:
    """Whether `flag` holds on any process."""
    if jax.process_count() == 1:
        return bool(flag)
    return bool(np.any(multihost_utils.process_allgather(np.int32(flag))))


def barrier(name: str) -> None:
    """Every process waits here until all have arrived."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
