r"""Benchmarks replax on this machine and writes one JSON object.

  python scripts/bench.py --out=/tmp/bench.json [--only=machine,sampler] [--repeats=5]

Each group is a function returning a dict of keys; the dicts are merged into one JSON
object, written to --out and printed. Times are taken after a warm-up call, blocking on
the result, as the median of --repeats runs. The machine is shared and noisy, so the
load average is recorded next to the numbers.

Groups:
  machine  machine_matmul_gflops (jitted fp32 2048x2048 matmul), machine_read_gbs (sum of
           a 256 MiB fp32 array): medians over this group's runs and those the sampler
           group interleaves with its own (so the roofline sees the same load).
  sampler  sampler_tokens_per_s_b{8,64} (KV cache) and sampler_nocache_tokens_per_s_b{8,64}
           (full forward over the whole buffer for every new token, also one jitted loop),
           timed back to back; sampler_roofline_fraction_b{8,64} = achieved tokens/s over
           the roofline tokens/s, where each forward call (the prefill and every decode
           step) takes max(flops / machine matmul flops, bytes / machine read bandwidth),
           flops = matmul FLOPs over the valid context and bytes = parameters + the KV
           cache of the valid context. Each cached run sits between two machine probes and
           the fraction is the median over runs of (roofline time at the probes' mean /
           run time), so that a load change between the probes and the runs does not skew
           it; sampler_roofline_tokens_per_s_b* uses the median machine numbers.
Reference model (design.md): vocab 512, 4 layers, d_model 256, 4 heads, 2 kv heads,
head_dim 64, MLP 1024, fp32; prompt 16 tokens, 64 new tokens.
"""

import functools
import json
import os
import statistics
import sys
import time

from absl import app, flags

_OUT = flags.DEFINE_string("out", None, "Write the JSON object to this file.")
_ONLY = flags.DEFINE_list("only", None, "Comma-separated groups to run (default: all).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats per measurement (median).")

PROMPT_LEN = 16
NEW_TOKENS = 64
BATCH_SIZES = (8, 64)


def reference_model_config():
    from replax import model as model_lib

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
        """Returns (matmul GFLOP/s, read GB/s) and records them."""
        gflops = 2 * n**3 / timed(matmul, a) / 1e9
        gbs = big.nbytes / timed(read, big) / 1e9
        _MACHINE_SAMPLES["matmul_gflops"].append(gflops)
        _MACHINE_SAMPLES["read_gbs"].append(gbs)
        return gflops, gbs

    return probe


# Every machine measurement of this run: the machine group's, and those interleaved with
# the sampler runs, so that the roofline reflects the load the sampler ran under.
_MACHINE_SAMPLES = {"matmul_gflops": [], "read_gbs": []}


def machine_numbers() -> dict:
    return {f"machine_{k}": statistics.median(v) for k, v in _MACHINE_SAMPLES.items()}


def bench_machine(repeats: int) -> dict:
    probe = _machine_probe()
    for _ in range(repeats):
        probe()
    return machine_numbers()


def roofline_seconds(config, batch, prompt_len, new_tokens, flops_per_s, bytes_per_s):
    """Ideal time of prefill + (new_tokens - 1) decode steps for a batch."""
    from replax import model as model_lib

    param_bytes = model_lib.param_count(config) * 4
    kv_bytes_per_slot = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    total = max(
        batch * prompt_len * model_lib.forward_flops_per_token(config, prompt_len) / flops_per_s,
        param_bytes / bytes_per_s,
    )
    for step in range(1, new_tokens):
        context = prompt_len + step
        flops = batch * model_lib.forward_flops_per_token(config, context)
        read = param_bytes + batch * context * kv_bytes_per_slot
        total += max(flops / flops_per_s, read / bytes_per_s)
    return total


def bench_sampler(repeats: int) -> dict:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    from replax import model as model_lib
    from replax import sampler as sampler_lib

    probe = _machine_probe()
    config = reference_model_config()
    dummy = jnp.zeros((1, 1), jnp.int32)
    variables = jax.jit(model_lib.Transformer(config).init)(jax.random.key(0), dummy, dummy)
    params = nn.unbox(variables)["params"]
    out = {}
    for batch in BATCH_SIZES:
        samplers = {
            kv_cache: sampler_lib.make_sampler(
                config,
                max_prompt_len=PROMPT_LEN,
                max_new_tokens=NEW_TOKENS,
                eos_id=1,
                pad_id=0,
                temperature=1.0,
                kv_cache=kv_cache,
            )
            for kv_cache in (True, False)
        }
        prompts = np.random.default_rng(batch).integers(2, config.vocab_size, (batch, PROMPT_LEN))
        prompt_ids = jnp.asarray(prompts, jnp.int32)
        prompt_mask = jnp.ones((batch, PROMPT_LEN), bool)
        args = (params, prompt_ids, prompt_mask, jax.random.key(1))
        steps = {}
        for kv_cache, sampler in samplers.items():  # warm-up: compile, and count the steps
            result = sampler.generate(*args)
            steps[kv_cache] = int(jnp.max(result.lengths))  # the loop stops when all rows end
        times = {True: [], False: []}
        fractions = []
        for _ in range(repeats):
            # The cached run between two machine probes (its roofline at the same load),
            # then the uncached run back to back.
            before = probe()
            times[True].append(timed(samplers[True].generate, *args))
            after = probe()
            times[False].append(timed(samplers[False].generate, *args))
            roofline_s = roofline_seconds(
                config,
                batch,
                PROMPT_LEN,
                steps[True],
                (before[0] + after[0]) / 2 * 1e9,
                (before[1] + after[1]) / 2 * 1e9,
            )
            fractions.append(roofline_s / times[True][-1])
        machine = machine_numbers()
        roofline_s = roofline_seconds(
            config,
            batch,
            PROMPT_LEN,
            steps[True],
            machine["machine_matmul_gflops"] * 1e9,
            machine["machine_read_gbs"] * 1e9,
        )
        out[f"sampler_tokens_per_s_b{batch}"] = batch * steps[True] / statistics.median(times[True])
        out[f"sampler_nocache_tokens_per_s_b{batch}"] = (
            batch * steps[False] / statistics.median(times[False])
        )
        out[f"sampler_roofline_tokens_per_s_b{batch}"] = batch * steps[True] / roofline_s
        out[f"sampler_roofline_fraction_b{batch}"] = statistics.median(fractions)
        out[f"sampler_roofline_fractions_b{batch}"] = sorted(fractions)
        out[f"sampler_seconds_b{batch}"] = sorted(times[True])
        out[f"sampler_nocache_seconds_b{batch}"] = sorted(times[False])
    out.update(machine_numbers())  # the roofline used these
    out["sampler_shapes"] = {
        "vocab_size": config.vocab_size,
        "num_layers": config.num_layers,
        "d_model": config.d_model,
        "num_heads": config.num_heads,
        "num_kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "mlp_dim": config.mlp_dim,
        "dtype": config.dtype,
        "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
        "batch_sizes": list(BATCH_SIZES),
        "param_count": model_lib.param_count(config),
    }
    return out


GROUPS = {
    "machine": bench_machine,
    "sampler": bench_sampler,
}


def main(argv):
    del argv
    import jax

    only = _ONLY.value or list(GROUPS)
    unknown = [g for g in only if g not in GROUPS]
    if unknown:
        print(f"error: --only={','.join(unknown)}: allowed are {','.join(GROUPS)}", file=sys.stderr)
        sys.exit(2)
    if _REPEATS.value < 1:
        print(f"error: --repeats={_REPEATS.value}: must be >= 1", file=sys.stderr)
        sys.exit(2)
    result = {
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "cpu_count": os.cpu_count(),
        "repeats": _REPEATS.value,
        "loadavg_start": list(os.getloadavg()),
    }
    for name in only:
        start = time.perf_counter()
        result.update(GROUPS[name](_REPEATS.value))
        result[f"{name}_bench_s"] = time.perf_counter() - start
    result["loadavg_end"] = list(os.getloadavg())
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    app.run(main)
