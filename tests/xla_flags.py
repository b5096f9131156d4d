"""XLA flags of the test run, for its own processes and every process a test starts.

The suite's programs are tiny, so compiling them costs more than running them, and most
of a compile on CPU is LLVM's optimisation of the generated code: at level 0 the suite
takes far less time (docs/reference.md, "What is and is not tested"). The programs
compute the same values up to float rounding; every comparison a test makes is between
runs under the same flags, or against a reference within a tolerance. conftest.py sets
these before jax is imported.
"""

import os

FAST_COMPILE = "--xla_backend_optimization_level=0"


def with_devices(count: int) -> str:
    """XLA_FLAGS of a process with `count` simulated CPU devices."""
    return f"--xla_force_host_platform_device_count={count} {FAST_COMPILE}"


def add_to_environment() -> None:
    """This process's XLA_FLAGS: 8 simulated CPU devices, compiled as above; flags already
    in the environment come first (a later flag of the same name wins)."""
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {with_devices(8)}".strip()
