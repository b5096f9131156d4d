"""The reference model of the benchmark (design.md), timing helpers, the machine's
matmul rate and memory bandwidth probed around each measurement, and how a benchmark
script hands back its JSON."""

import functools
import json
import os
import statistics
import subprocess
import time

PROMPT_LEN = 16
NEW_TOKENS = 64
BATCH_SIZES = (8, 64)


def reference_model_config():
    from replax.model import transformer as model_lib

    return model_lib.ModelConfig(
        vocab_size=512,
        num_layers=4,
        d_model=256,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        mlp_dim=1024,
        max_len=PROMPT_LEN + NEW_TOKENS,
        dtype="float32",
        param_dtype="float32",
    )


def timed(fn, *args):
    """Seconds for one blocking call."""
    import jax

    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def median_time(fn, *args, repeats):
    import jax

    jax.block_until_ready(fn(*args))  # warm-up (compiles)
    return statistics.median(timed(fn, *args) for _ in range(repeats))


@functools.cache
def _machine_probe():
    """One timed fp32 2048x2048 matmul and one timed read of 256 MiB, already compiled."""
    import jax
    import jax.numpy as jnp

    n = 2048
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    big = jnp.ones((64 * 1024 * 1024,), jnp.float32)  # far above the caches
    matmul, read = jax.jit(lambda x: x @ x), jax.jit(jnp.sum)
    jax.block_until_ready((matmul(a), read(big)))

    def probe():
        """Returns (matmul GFLOP/s, read GB/s) and records them, and the matmul's GFLOP per
        CPU-second of this process (all its threads; less sensitive to other load)."""
        cpu_start = time.process_time()
        gflops = 2 * n**3 / timed(matmul, a) / 1e9
        gflops_per_cpu_s = 2 * n**3 / (time.process_time() - cpu_start) / 1e9
        gbs = big.nbytes / timed(read, big) / 1e9
        _MACHINE_SAMPLES["matmul_gflops"].append(gflops)
        _MACHINE_SAMPLES["read_gbs"].append(gbs)
        _MACHINE_SAMPLES["matmul_gflops_per_cpu_s"].append(gflops_per_cpu_s)
        return gflops, gbs

    return probe


# Every machine measurement of this run: the machine group's, and those interleaved with
# the sampler runs, so that the roofline reflects the load the sampler ran under.
_MACHINE_SAMPLES = {"matmul_gflops": [], "read_gbs": [], "matmul_gflops_per_cpu_s": []}


def machine_numbers() -> dict:
    return {f"machine_{k}": statistics.median(v) for k, v in _MACHINE_SAMPLES.items()}


def bench_machine(repeats: int) -> dict:
    probe = _machine_probe()
    for _ in range(repeats):
        probe()
    return machine_numbers()


def commit() -> str:
    """The checkout's HEAD, so that a result names the code that made it ("unknown" outside
    a git checkout)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True)
    except OSError:
        return "unknown"
    return out.stdout.decode().strip() or "unknown"


def print_and_write(result: dict, out: str | None, **dumps) -> None:
    """A script's result: printed as JSON (json.dumps with `dumps`, e.g. indent) and, when
    `out` names a file, written there too with a final newline."""
    text = json.dumps(result, **dumps)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


def bisect_stop_bias(median_length, target: float, low: float, high: float, iterations: int):
    """The stop token's logit bias whose median completion length is `target`: bisection
    on median_length(bias), which falls as the bias rises (long-tailed lengths for the
    samplers' benchmarks without a trained model)."""
    for _ in range(iterations):
        bias = (low + high) / 2
        if median_length(bias) > target:
            low = bias
        else:
            high = bias
    return (low + high) / 2
