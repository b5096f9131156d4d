"""Tests for replax/core/platforms.py: a process without a TPU never starts libtpu."""

import os
import subprocess
import sys

import pytest

from replax.core import platforms

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What libtpu prints when it starts on a machine without a TPU.
LIBTPU_LINES = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "InitGoogle", "libtpu", "E0000")


def _python(code: str, **env_changes) -> subprocess.CompletedProcess:
    """`python -c code` as a user starts it: JAX choosing its own platforms (none named)
    and libtpu's machine-wide lock lifted, since another process holding it makes libtpu
    fail without a word and would hide what these tests look for."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    env.update(env_changes)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.skipif(platforms.tpu_present(), reason="this machine has a TPU")
@pytest.mark.parametrize(
    "code",
    [
        "import replax.core, jax; print(jax.default_backend())",
        # jax imported first, its backends not yet started: replax still chooses.
        "import jax, replax; print(jax.default_backend())",
    ],
)
def test_a_process_without_a_tpu_prints_nothing_from_libtpu(code):
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu"]
    said = [line for line in proc.stderr.splitlines() if any(s in line for s in LIBTPU_LINES)]
    assert not said, proc.stderr


def test_platforms_the_user_named_are_kept():
    # Even none named: JAX then chooses, as the user asked.
    proc = _python("import os, replax; print(repr(os.environ['JAX_PLATFORMS']))", JAX_PLATFORMS="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "''"


def test_a_machine_without_a_tpu_starts_its_gpu_when_jax_can_drive_it():
    none = dict(tpu=False, nvidia_gpu=False, amd_gpu=False, plugins=set())
    assert platforms.choose({}, **none) == "cpu"
    # A GPU with no plugin for it: JAX could only fall back to the CPU anyway.
    assert platforms.choose({}, **{**none, "nvidia_gpu": True}) == "cpu"
    assert platforms.choose({}, **{**none, "nvidia_gpu": True, "plugins": {"xla_cuda12"}}) == (
        "cuda,cpu"
    )
    assert platforms.choose({}, **{**none, "amd_gpu": True, "plugins": {"xla_rocm7"}}) == (
        "rocm,cpu"
    )
    # A plugin without its device: not started.
    assert platforms.choose({}, **{**none, "plugins": {"xla_cuda12"}}) == "cpu"


@pytest.mark.parametrize(
    "environ", [{"JAX_PLATFORMS": ""}, {"JAX_PLATFORMS": "tpu"}, {"JAX_FORCE_TPU_INIT": "1"}]
)
def test_nothing_is_chosen_where_a_tpu_is_or_the_user_chose(environ):
    none = dict(tpu=False, nvidia_gpu=False, amd_gpu=False, plugins=set())
    assert platforms.choose(environ, **none) is None
    assert platforms.choose({}, **{**none, "tpu": True}) is None
