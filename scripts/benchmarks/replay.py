"""The replay buffer: add / sample latency at N = 4096 and 65536, against flashbax's item
buffer when it is installed, and the kernels of each compiled call."""

import statistics
import time

REPLAY_CAPACITIES = {"": 4096, "_64k": 65536}
ITEM_LEN = 160  # tokens per rollout: 16 prompt + 144 completion
REPLAY_BATCH = 64


def replay_items(rng, num_items):
    """num_items LLM-shaped rollouts in the trainer's stored layout (rollouts.rollout_spec)
    with plausible values: random tokens, log-probs <= 0, 90% of tokens trained on."""
    import jax.numpy as jnp
    import numpy as np

    from replax.rl import rollouts

    def fill(name, spec):
        shape = (num_items, *spec.shape)
        values = {
            "tokens": lambda: rng.integers(0, 512, shape),
            "attention_mask": lambda: np.ones(shape, bool),
            "loss_mask": lambda: rng.random(shape) < 0.9,
            "behaviour_logprobs": lambda: -rng.exponential(size=shape),
            "reward": lambda: rng.random(shape) < 0.5,
        }.get(name, lambda: rng.standard_normal(shape))
        return jnp.asarray(values(), spec.dtype)

    return {k: fill(k, spec) for k, spec in rollouts.rollout_spec(ITEM_LEN).items()}


def kernel_count(compiled) -> int:
    """Kernels XLA:CPU runs for a compiled program: the entry computation's instructions
    other than parameters, constants, tuples and bitcasts (each fusion, copy or custom
    call is one kernel, with its own launch and scheduling on the runtime's threads)."""
    import re

    text = compiled.as_text()
    entry = text[text.index("\nENTRY") :].split("\n}", 1)[0].splitlines()[1:]
    free = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}
    ops = [re.match(r"\s*(?:ROOT )?%\S+ = .*? ([a-z][\w-]*)\(", line) for line in entry]
    return sum(1 for m in ops if m and m.group(1) not in free)


def replay_latencies(capacity: int, items, calls: int) -> tuple[dict, dict]:
    """Median microseconds of add / sample on a buffer of `capacity` items, ours and (when
    installed) flashbax's, interleaved call by call; and the kernels of each program."""
    import jax
    import jax.numpy as jnp

    from replax.replay import store as replay_lib

    try:
        import flashbax as fbx
    except ImportError:
        fbx = None
    example = jax.tree.map(lambda x: x[0], items)
    step = jnp.int32(7)
    buffer = replay_lib.make_replay_buffer(
        replay_lib.ReplayConfig(capacity=capacity, strategy="uniform")
    )
    ours_add = jax.jit(buffer.add, donate_argnums=0)
    ours_sample = jax.jit(buffer.sample, static_argnums=2, donate_argnums=0)
    states = {"ours": buffer.init(example)}

    # Each timed call takes a PRNG key, stores the new state and returns what to block on.
    def add_ours(key):
        states["ours"] = ours_add(states["ours"], items, step)
        return states["ours"]

    def sample_ours(key):
        states["ours"], batch, info = ours_sample(states["ours"], key, REPLAY_BATCH, step)
        return states["ours"], batch, info

    timers = {"replay_add_us": add_ours, "replay_sample_us": sample_ours}
    if fbx is not None:
        flashbax = fbx.make_item_buffer(
            max_length=capacity,
            min_length=REPLAY_BATCH,
            sample_batch_size=REPLAY_BATCH,
            add_batches=True,
        )
        fbx_add = jax.jit(flashbax.add, donate_argnums=0)
        fbx_sample = jax.jit(flashbax.sample)
        states["flashbax"] = flashbax.init(example)

        def add_flashbax(key):
            states["flashbax"] = fbx_add(states["flashbax"], items)
            return states["flashbax"]

        timers["flashbax_add_us"] = add_flashbax
        timers["flashbax_sample_us"] = lambda key: fbx_sample(states["flashbax"], key)
    kernels = {
        "replay_add_kernels": ours_add.lower(states["ours"], items, step),
        "replay_sample_kernels": ours_sample.lower(
            states["ours"], jax.random.key(0), REPLAY_BATCH, step
        ),
    }
    if fbx is not None:
        kernels["flashbax_add_kernels"] = fbx_add.lower(states["flashbax"], items)
        kernels["flashbax_sample_kernels"] = fbx_sample.lower(
            states["flashbax"], jax.random.PRNGKey(0)
        )
    kernels = {name: kernel_count(lowered.compile()) for name, lowered in kernels.items()}
    for _ in range(capacity // REPLAY_BATCH + 2):  # fill past capacity (wraps around)
        for name, fn in timers.items():
            if "_add_" in name:
                jax.block_until_ready(fn(None))
    # flashbax draws with jax.random.randint on raw uint32 keys; ours takes typed keys.
    keys = {
        "replay": jax.random.split(jax.random.key(1), calls + 10),
        "flashbax": jax.random.split(jax.random.PRNGKey(1), calls + 10),
    }
    seconds = {name: [] for name in timers}
    for i in range(calls + 10):  # interleaved; the first 10 rounds warm up
        for name, fn in timers.items():
            key = keys[name.split("_")[0]][i]
            start = time.perf_counter()
            jax.block_until_ready(fn(key))
            if i >= 10:
                seconds[name].append(time.perf_counter() - start)
    latencies = {name: 1e6 * statistics.median(times) for name, times in seconds.items()}
    return latencies, kernels


def bench_replay(repeats: int) -> dict:
    import numpy as np

    calls = 100 * repeats
    items = replay_items(np.random.default_rng(0), REPLAY_BATCH)
    out = {"replay_calls": calls}
    for suffix, capacity in REPLAY_CAPACITIES.items():
        latencies, kernels = replay_latencies(capacity, items, calls)
        out.update({name + suffix: us for name, us in latencies.items()})
        if not suffix:
            out.update(kernels)
        ours_us = latencies["replay_add_us"] + latencies["replay_sample_us"]
        if "flashbax_add_us" in latencies:
            fbx_us = latencies["flashbax_add_us"] + latencies["flashbax_sample_us"]
            out[f"replay_vs_flashbax_speedup{suffix}"] = fbx_us / ours_us
    # The latency target: N = 65536 within 1.3x of N = 4096.
    out["replay_64k_over_4k"] = (out["replay_add_us_64k"] + out["replay_sample_us_64k"]) / (
        out["replay_add_us"] + out["replay_sample_us"]
    )
    return out
