"""flashbax 0.1.3 replay-buffer add / sample latency for replax's item layout.

Baseline venv (kept apart from the project's .venv; CPU jax):
    python3 -m venv "$BASELINE_VENV"  # any directory
    "$BASELINE_VENV"/bin/pip install google-tunix==0.1.7 flashbax==0.1.3 \
        jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 optax==0.2.8
(flashbax alone needs only `pip install flashbax==0.1.3`, which brings chex.)
Run:
    "$BASELINE_VENV"/bin/python scripts/baselines/flashbax_buffer.py [--calls=300]

Item: tokens int32[160], logprobs f32[160], mask f32[160], reward f32,
advantage f32, version int32. Each add writes 64 items, each sample draws 64
uniformly. Buffers (capacity N = 4096 and 65536 items):
  item:  fbx.make_item_buffer(max_length=N, add_batches=True) - the reference;
         storage [1, N, ...], add = scatter of 64 rows along the time axis.
  traj1: fbx.make_trajectory_buffer(add_batch_size=64, sample_sequence_length=1,
         period=1, max_length_time_axis=N//64): one time step per row per add.
  flat:  fbx.make_flat_buffer(add_batch_size=64): samples (s, s') pairs, i.e.
         twice the bytes an item sample needs; shown only for completeness.
add is jax.jit(buffer.add, donate_argnums=0) (in place), sample is
jax.jit(buffer.sample). The buffer is filled past capacity first; each timed
call blocks on its whole result. Median microseconds over --calls calls.
Prints one JSON line; `flashbax_add_us` / `flashbax_sample_us` are the item
buffer at N=4096, the `_64k` keys at N=65536.
"""

import argparse
import importlib.metadata
import json
import os
import statistics
import time

import flashbax as fbx
import jax
import jax.numpy as jnp
import numpy as np

L, B = 160, 64


def batch(rng, n=B):
    return {
        "tokens": jnp.asarray(rng.integers(0, 512, (n, L)), jnp.int32),
        "logprobs": jnp.asarray(rng.standard_normal((n, L)), jnp.float32),
        "mask": jnp.ones((n, L), jnp.float32),
        "reward": jnp.asarray(rng.standard_normal(n), jnp.float32),
        "advantage": jnp.asarray(rng.standard_normal(n), jnp.float32),
        "version": jnp.zeros((n,), jnp.int32),
    }


def make(kind, n):
    if kind == "item":
        return fbx.make_item_buffer(
            max_length=n, min_length=B, sample_batch_size=B, add_batches=True
        )
    if kind == "traj1":
        return fbx.make_trajectory_buffer(
            add_batch_size=B,
            sample_batch_size=B,
            sample_sequence_length=1,
            period=1,
            min_length_time_axis=1,
            max_length_time_axis=n // B,
        )
    return fbx.make_flat_buffer(max_length=n, min_length=B, sample_batch_size=B, add_batch_size=B)


def median_us(fn, calls):
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(ts)


def bench(kind, n, calls, rng):
    buf = make(kind, n)
    items = batch(rng)
    # traj1 adds [64, 1 step, ...]; item/flat add [64, ...] (their add wrappers).
    add_in = jax.tree.map(lambda x: x[:, None], items) if kind == "traj1" else items
    state = buf.init(jax.tree.map(lambda x: x[0], items))
    add = jax.jit(buf.add, donate_argnums=0)
    sample = jax.jit(buf.sample)
    for _ in range(n // B + 2):  # fill past capacity (wraps around)
        state = add(state, add_in)
    jax.block_until_ready(state)
    old = state
    state = add(state, add_in)
    donated = jax.tree.leaves(old)[0].is_deleted()

    def do_add():
        nonlocal state
        state = jax.block_until_ready(add(state, add_in))

    keys = iter(list(jax.random.split(jax.random.PRNGKey(0), 3 * calls + 10)))
    do_sample = lambda: jax.block_until_ready(sample(state, next(keys)))
    for _ in range(5):
        do_add(), do_sample()
    out = sample(state, next(keys)).experience
    out = out.first if kind == "flat" else out  # traj1 keeps a length-1 time axis
    assert out["tokens"].shape == ((B, 1, L) if kind == "traj1" else (B, L))
    return median_us(do_add, calls), median_us(do_sample, calls), donated


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--kinds", default="item,traj1,flat")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    res = {
        "flashbax": importlib.metadata.version("flashbax"),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "calls": args.calls,
        "load_avg_start": os.getloadavg(),
    }
    for kind in args.kinds.split(","):
        for n, suffix in ((4096, ""), (65536, "_64k")):
            add_us, sample_us, donated = bench(kind, n, args.calls, rng)
            pre = "flashbax" if kind == "item" else f"flashbax_{kind}"
            res[f"{pre}_add_us{suffix}"] = round(add_us, 1)
            res[f"{pre}_sample_us{suffix}"] = round(sample_us, 1)
            res[f"{pre}_add_donated{suffix}"] = donated
    res["load_avg_end"] = os.getloadavg()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
