"""Device mesh, logical-axis rules, and NamedSharding helpers.

The mesh has three axes, `data`, `fsdp` and `tensor`, over all devices. Parameters and
activations are named with logical axes (`replax.model.transformer`); a rule table, which lives in
the config, maps each logical axis to zero or more mesh axes. The same code runs on one
CPU device, on 8 simulated CPU devices and on a multi-host TPU slice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
LOGICAL_AXES = (
    "batch",
    "length",
    "embed",
    "heads",
    "kv_heads",
    "head_dim",
    "mlp",
    "vocab",
    "buffer",
    "layers",
)

# Data parallel over data x fsdp; parameters sharded over fsdp (ZeRO-3 style) and
# tensor-parallel over heads / mlp / vocab.
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("buffer", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    # The stacked layer axis of scanned params (model.scan_layers): every device holds
    # every layer's shard, as the scan slices one layer per iteration.
    ("layers", None),
)


def validate_mesh_shape(mesh_shape: Sequence[int], num_devices: int) -> tuple[int, int, int]:
    """Checks a (data, fsdp, tensor) shape against the device count; -1 means 'the rest'."""
    shape = [int(s) for s in mesh_shape]
    if len(shape) != len(MESH_AXES):
        raise ValueError(
            f"mesh.shape={tuple(shape)}: must have {len(MESH_AXES)} entries {MESH_AXES}"
        )
    if shape.count(-1) > 1:
        raise ValueError(f"mesh.shape={tuple(shape)}: at most one entry may be -1")
    if any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"mesh.shape={tuple(shape)}: entries must be positive or -1")
    known = int(np.prod([s for s in shape if s != -1]))
    if -1 in shape:
        if num_devices % known:
            raise ValueError(
                f"mesh.shape={tuple(shape)}: {known} does not divide the {num_devices} devices"
            )
        shape[shape.index(-1)] = num_devices // known
    if int(np.prod(shape)) != num_devices:
        raise ValueError(
            f"mesh.shape={tuple(shape)} has {int(np.prod(shape))} devices, but "
            f"{num_devices} are available: the product must equal the device count"
        )
    return tuple(shape)


def make_mesh(mesh_shape: Sequence[int] = (-1, 1, 1), devices=None) -> Mesh:
    """A Mesh with axes (data, fsdp, tensor) over all (or the given) devices."""
    devices = list(jax.devices() if devices is None else devices)
    shape = validate_mesh_shape(mesh_shape, len(devices))
    try:
        # Orders devices along the physical interconnect (TPU torus, GPU hosts).
        device_array = mesh_utils.create_device_mesh(shape, devices=devices)
    except (ValueError, NotImplementedError):  # a topology it cannot lay out: plain order
        device_array = np.asarray(devices).reshape(shape)
    return Mesh(device_array, MESH_AXES)


def validate_rules(rules) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """Normalises a rule table and checks every name in it."""
    out = []
    for entry in rules:
        if len(entry) != 2:
            raise ValueError(f"mesh.rules entry {entry!r}: must be (logical_axis, mesh_axes)")
        logical, mesh_axes = entry
        if logical not in LOGICAL_AXES:
            raise ValueError(
                f"mesh.rules: unknown logical axis {logical!r}; allowed are {LOGICAL_AXES}"
            )
        targets = (
            ()
            if mesh_axes is None
            else ((mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes))
        )
        for t in targets:
            if t not in MESH_AXES:
                raise ValueError(
                    f"mesh.rules[{logical!r}]: unknown mesh axis {t!r}; allowed are {MESH_AXES}"
                )
        if isinstance(mesh_axes, list):
            mesh_axes = tuple(mesh_axes)
        out.append((logical, mesh_axes))
    return tuple(out)


def logical_to_spec(axes: Sequence[str | None], rules) -> PartitionSpec:
    """PartitionSpec for a tuple of logical axis names under a rule table."""
    for a in axes:
        if a is not None and a not in LOGICAL_AXES:
            raise ValueError(f"unknown logical axis {a!r}; allowed are {LOGICAL_AXES}")
    return nn.logical_to_mesh_axes(tuple(axes), rules)


# Logical axes of the parameters' dimensions (not of activations only).
WEIGHT_AXES = ("embed", "heads", "kv_heads", "mlp", "vocab")


def weight_stationary_rules(rules):
    """`rules` with the activations' rows (`batch`) not split over the mesh axes that split
    the weights: the rules of a decode step. A decode step's activations are kilobytes a
    row and its weights are gigabytes: with the rows split over fsdp, every device needs
    every weight whole and the compiler gathers each layer's into its HBM at every step.
    With the rows whole over fsdp, each device multiplies all rows by its own shard of
    each weight and the partial sums move instead. The KV cache keeps its own layout (its
    constraints are outside the model call), so attention still reads each row's keys on
    the row's device. The same rules (a tuple) when no weight axis splits the rows."""
    rules = tuple(rules)
    table = dict(rules)
    split = lambda axes: (axes,) if isinstance(axes, str) else tuple(axes or ())
    weights = {a for name in WEIGHT_AXES for a in split(table.get(name))}
    rows = split(table.get("batch"))
    kept = tuple(a for a in rows if a not in weights)
    if kept == rows:
        return rules
    new = kept if len(kept) > 1 else (kept[0] if kept else None)
    return tuple((name, new if name == "batch" else axes) for name, axes in rules)


def named(mesh: Mesh, axes: Sequence[str | None], rules) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(axes, rules))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def data_parallel_size(mesh: Mesh, rules) -> int:
    """Number of shards of the `batch` axis: every batch must be divisible by it."""
    spec = logical_to_spec(("batch",), rules)[0]
    if spec is None:
        return 1
    names = (spec,) if isinstance(spec, str) else spec
    return int(np.prod([mesh.shape[n] for n in names]))


def check_batch(name: str, size: int, mesh: Mesh, rules) -> None:
    """Raises a one-line error when the data axes do not divide a batch dimension."""
    n = data_parallel_size(mesh, rules)
    if size % n:
        raise ValueError(
            f"{name}={size} is not divisible by the {n} data-parallel shards of the mesh "
            f"{dict(mesh.shape)}: use a multiple of {n}"
        )


def params_shardings(mesh: Mesh, abstract_variables, rules):
    """NamedShardings for (boxed) abstract parameters from `jax.eval_shape(model.init, ...)`."""
    logical = nn.get_partition_spec(abstract_variables)
    return nn.logical_to_mesh_sharding(logical, mesh, rules)


def abstract_key(mesh: Mesh) -> jax.ShapeDtypeStruct:
    """A PRNG key as a compiled program takes it, replicated over `mesh`, abstract."""
    key = jax.eval_shape(lambda: jax.random.key(0))
    return jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated(mesh))


def abstract_like(tree):
    """ShapeDtypeStructs with the shape, dtype and sharding of each jax.Array in `tree`
    (other leaves pass through): the target that restores a checkpoint, or compiles a
    function, into the layout `tree` already has."""

    def leaf(x):
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        return x

    return jax.tree_util.tree_map(leaf, tree)


@contextlib.contextmanager
def activation_rules(mesh: Mesh, rules):
    """Context under which the model's activation constraints resolve to this mesh."""
    # Flax resolves constraints against the abstract mesh, which `jax.set_mesh` sets and
    # the deprecated `with mesh:` does not (the constraints would silently be no-ops).
    if hasattr(jax, "set_mesh"):
        mesh_context = jax.set_mesh(mesh)
    elif hasattr(jax.sharding, "use_mesh"):
        mesh_context = jax.sharding.use_mesh(mesh)
    else:
        mesh_context = mesh
    with mesh_context:
        with nn.logical_axis_rules(rules):
            yield


def shard_batch(batch, mesh: Mesh, rules, axes=("batch",)):
    """Places a host batch (pytree of arrays with leading batch dim) on the mesh.

    Every process passes the same, whole batch; each keeps the rows its devices hold.
    (A batch that each process has only its own rows of goes through `processes.global_batch`.)
    """

    def put(x):
        spec = logical_to_spec(tuple(axes) + (None,) * (np.ndim(x) - len(axes)), rules)
        return jax.device_put(x, NamedSharding(mesh, spec))

    return jax.tree_util.tree_map(put, batch)


# -- Several processes ------------------------------------------------------------------
# Each process holds a block of rows of every array split over `batch`; these helpers
# move between that block on the host and the global jax.Array. With one process they
# return host arrays unchanged, which jit places as it always did.


def jit_state_step(step, mesh: Mesh, rules, state_shardings, batch_sharding):
    """jit of step(state, batch) -> (state, replicated outputs) with explicit shardings and
    the state donated, called under the activation rules. `run.jitted` is the jitted
    function (for compilation counts)."""
    jitted = jax.jit(
        step,
        in_shardings=(state_shardings, batch_sharding),
        out_shardings=(state_shardings, replicated(mesh)),
        donate_argnums=(0,),
    )

    def run(state, batch):
        with activation_rules(mesh, rules):
            return jitted(state, batch)

    run.jitted = jitted
    return run


def check_divisible(what: str, mesh: Mesh, abstract_params, shardings) -> None:
    """Raises a one-line error when a mesh axis does not divide the parameter dimension it
    shards (jit would fail on the first call, less clearly). what: the mesh's name in the
    message, e.g. 'sampler mesh'."""
    leaves = jax.tree_util.tree_leaves_with_path(abstract_params)
    for (path, leaf), target in zip(leaves, jax.tree_util.tree_leaves(shardings)):
        for dim, axes in zip(leaf.shape, target.spec):
            axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
            shards = int(np.prod([mesh.shape[a] for a in axes]))
            if dim % shards:
                raise ValueError(
                    f"{what} {dict(mesh.shape)}: parameter "
                    f"{jax.tree_util.keystr(path)} dimension {dim} is not divisible by the "
                    f"{shards} shards of mesh axes {axes}: allowed are meshes whose axes "
                    "divide the dimensions they shard"
                )
