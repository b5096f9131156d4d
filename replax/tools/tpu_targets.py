"""TPU slices to compile for: chips' published figures, slice names, topologies.

`target(name)` describes a slice (e.g. `v5e:2x2`, or a Cloud name such as `v5e-8`) as
libtpu's devices to lower and compile for, on any host; `roofline_s` is a program's time
on one chip at its peak compute or bandwidth, whichever bounds it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from typing import Any

GIB = 2**30

# A program fits when its peak is at most this share of a chip's HBM: the rest is the
# runtime's own buffers and fragmentation.
FIT_FRACTION = 0.9


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU chip's published figures."""

    hbm_bytes: int
    bf16_flops_per_s: float
    hbm_bytes_per_s: float


# Per chip, from Google Cloud's TPU system-architecture pages (cloud.google.com/tpu/docs/
# v4, /v5e, /v5p and /v6e): HBM capacity, peak bf16 compute, HBM bandwidth. v4: 32 GiB,
# 275 TFLOP/s, 1,228 GB/s; v5e: 16 GiB, 197 TFLOP/s, 819 GB/s; v5p: 95 GB, 459 TFLOP/s,
# 2,765 GB/s; v6e (Trillium): 32 GiB, 918 TFLOP/s, 1,640 GB/s.
CHIPS: Mapping[str, Chip] = {
    "v4": Chip(32 * GIB, 275e12, 1228e9),
    "v5e": Chip(16 * GIB, 197e12, 819e9),
    "v5p": Chip(95 * 10**9, 459e12, 2765e9),
    "v6e": Chip(32 * GIB, 918e12, 1640e9),
}

# The Cloud TPU names of common slices (accelerator types count chips for v5e / v6e and
# TensorCores for v4 / v5p), as topologies.
ALIASES: Mapping[str, str] = {
    "v5e-1": "v5e:1x1",
    "v5e-4": "v5e:2x2",
    "v5e-8": "v5e:2x4",
    "v5e-16": "v5e:4x4",
    "v5e-64": "v5e:8x8",
    "v5e-256": "v5e:16x16",
    "v6e-1": "v6e:1x1",
    "v6e-4": "v6e:2x2",
    "v6e-8": "v6e:2x4",
    "v4-8": "v4:2x2x1",
    "v5p-8": "v5p:2x2x1",
    "v5p-128": "v5p:4x4x4",
}
# Topologies checked to compile here (any slice of these generations whose shape libtpu
# accepts works; these are the ones the error message offers).
KNOWN = (
    "v5e:1x1",
    "v5e:2x2",
    "v5e:2x4",
    "v5e:4x4",
    "v5e:16x16",
    "v6e:2x2",
    "v6e:2x4",
    "v4:2x2x1",
    "v5p:2x2x1",
    "v5p:4x4x4",
)


@dataclasses.dataclass(frozen=True)
class Target:
    """A TPU slice to compile for: its devices (one per chip, or per TensorCore where
    libtpu lays a chip out as two), hosts and chips."""

    name: str
    generation: str
    chip: Chip
    devices: tuple[Any, ...]
    hosts: int
    chips: int

    @property
    def hbm_bytes_per_device(self) -> int:
        return self.chip.hbm_bytes * self.chips // len(self.devices)


def _dims(name: str) -> tuple[str, tuple[int, ...]]:
    match = re.fullmatch(r"(v4|v5e|v5p|v6e):(\d+(?:x\d+){1,2})", name)
    if not match:
        raise ValueError(
            f"--topology={name}: unknown; known are {', '.join(KNOWN)} (or GEN:AxB[xC] of "
            f"{', '.join(CHIPS)}; aliases {', '.join(ALIASES)})"
        )
    return match.group(1), tuple(int(d) for d in match.group(2).split("x"))


def _chips_per_host(generation: str, dims: tuple[int, ...]) -> tuple[int, int, int]:
    """The host shape of a slice: v5e and v6e hosts hold up to 8 chips (a single-host
    slice of 1, 4 or 8; 4 a host in multi-host slices), v4 and v5p hosts 4 (2x2x1)."""
    dims3 = (*dims, 1)[:3]
    chips = math.prod(dims3)
    if generation in ("v5e", "v6e") and chips <= 8:
        return dims3
    return (2, 2, 1)


def _quiet_libtpu() -> None:
    """libtpu on a host that is not a TPU VM asks the VM's metadata and warns; compiling
    for a described topology needs neither."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    # Compiling takes no TPU, so several processes (tests in parallel) may load libtpu.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def target(name: str) -> Target:
    """The slice `name` (e.g. 'v5e:2x2', or a Cloud name such as 'v5e-8'). ValueError for
    an unknown name, ImportError when libtpu is not installed."""
    name = ALIASES.get(name, name)
    generation, dims = _dims(name)
    try:
        import libtpu  # noqa: F401 - only whether it is there
    except ImportError:
        raise ImportError(
            "libtpu is not installed: pip install -e '.[tpu]' (it compiles for TPUs on any host)"
        ) from None
    from jax.experimental import topologies

    _quiet_libtpu()
    host = _chips_per_host(generation, dims)
    try:
        topology = topologies.get_topology_desc(
            platform="tpu", topology_name=name, chips_per_host_bounds=host
        )
    except Exception as e:  # noqa: BLE001 - libtpu's message for a shape it does not lay out
        first = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"--topology={name}: libtpu cannot lay it out ({first})") from None
    devices = tuple(topology.devices)
    return Target(
        name=name,
        generation=generation,
        chip=CHIPS[generation],
        devices=devices,
        hosts=len({d.process_index for d in devices}),
        chips=math.prod(dims),
    )


def roofline_s(flops: float, bytes_accessed: float, chip: Chip) -> float:
    """A program's time on one chip if it ran at the chip's peak compute or bandwidth,
    whichever bounds it: max(FLOPs / peak FLOP/s, bytes / HBM bandwidth)."""
    return max(flops / chip.bf16_flops_per_s, bytes_accessed / chip.hbm_bytes_per_s)


def slice_chips(name: str) -> tuple[str, int]:
    """(generation, chips) of a topology or Cloud name, without libtpu."""
    generation, dims = _dims(ALIASES.get(name, name))
    return generation, math.prod(dims)
