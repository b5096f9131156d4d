"""The JAX platforms a process starts, named before JAX starts any.

Left to choose, JAX starts every platform it has a plugin for. The `test` and `tpu` extras
install libtpu (the TPU compile needs it on any host), and on a machine without a TPU
libtpu's start fails: it prints its initialisation errors (TPU_ACCELERATOR_TYPE,
TPU_WORKER_HOSTNAMES, "Logging before InitGoogle") into every run's stderr and takes the
machine-wide /tmp/libtpu_lockfile from other processes. So importing replax names the
platforms this machine has devices for, unless the user named them (JAX_PLATFORMS, even
empty) or asked for the TPU anyway (JAX_FORCE_TPU_INIT). Compiling for a TPU topology
(jax.experimental.topologies) loads libtpu on its own and needs no TPU platform started.

Everything here reads files and environment variables only: importing JAX would read
JAX_PLATFORMS before it is set.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import pkgutil
import sys

# Google's PCI vendor id: a TPU chip on this host's bus (what JAX itself looks for).
_GOOGLE_PCI_VENDOR = "0x1ae0"
# Device files of a TPU VM (/dev/accel* up to v4, VFIO groups from v5), of an NVIDIA GPU
# (bare metal, containers, WSL2) and of AMD's GPU driver.
_TPU_DEVICE_FILES = ("/dev/accel*", "/dev/vfio/[0-9]*")
_NVIDIA_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")
_AMD_DEVICE_FILE = "/dev/kfd"


def tpu_present() -> bool:
    if any(glob.glob(pattern) for pattern in _TPU_DEVICE_FILES):
        return True
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == _GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return False


def jax_plugins() -> set[str]:
    """The names of the installed JAX PJRT plugins (xla_cuda12, xla_rocm7, ...), found as
    JAX finds them: entry points of the `jax_plugins` group and modules of the
    `jax_plugins` namespace package."""
    names = {ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")}
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
        names |= {m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)}
    return names


def choose(
    environ,
    *,
    tpu: bool | None = None,
    nvidia_gpu: bool | None = None,
    amd_gpu: bool | None = None,
    plugins: set[str] | None = None,
) -> str | None:
    """JAX_PLATFORMS for this machine ("cpu", "cuda,cpu", ...), or None to leave JAX's
    own choice: the user named the platforms, asked for the TPU, or a TPU is here. A GPU
    is named only with a plugin to drive it, since a named platform that fails to start
    stops JAX where an unnamed one falls back to the CPU. The keywords stand for what
    this machine has (tests); None looks."""
    if "JAX_PLATFORMS" in environ or "JAX_FORCE_TPU_INIT" in environ:
        return None
    if tpu_present() if tpu is None else tpu:
        return None
    plugins = jax_plugins() if plugins is None else plugins
    if nvidia_gpu is None:
        nvidia_gpu = any(os.path.exists(path) for path in _NVIDIA_DEVICE_FILES)
    if amd_gpu is None:
        amd_gpu = os.path.exists(_AMD_DEVICE_FILE)
    named = [
        platform
        for platform, present in (("cuda", nvidia_gpu), ("rocm", amd_gpu))
        if present and any(platform in name for name in plugins)
    ]
    return ",".join([*named, "cpu"])


def skip_absent_tpu() -> None:
    """Names this machine's platforms (`choose`) before JAX starts any; nothing when JAX
    has started them already."""
    platforms = choose(os.environ)
    if platforms is None:
        return
    if "jax" not in sys.modules:  # JAX reads the variable when it is imported
        os.environ["JAX_PLATFORMS"] = platforms
        return
    import jax
    from jax._src import xla_bridge

    if jax.config.jax_platforms is None and not xla_bridge.backends_are_initialized():
        jax.config.update("jax_platforms", platforms)
