r"""Benchmarks replax on this machine and writes one JSON object.

  python scripts/bench.py --out=/tmp/bench.json [--only=machine,sampler] [--repeats=5]

Each group is a function returning a dict of keys; the dicts are merged into one JSON
object, written to --out and printed. Times are taken after a warm-up call, blocking on
the result, as the median of --repeats runs. The machine is shared and noisy, so the
load average is recorded next to the numbers.

Groups:
  machine  machine_matmul_gflops (jitted fp32 2048x2048 matmul), machine_read_gbs (sum of
           a 256 MiB fp32 array), machine_matmul_gflops_per_cpu_s (the matmul's FLOPs per
           CPU-second of this process): medians over this group's runs and those the
           sampler and train groups interleave with their own (each sees the same load).
  sampler  sampler_tokens_per_s_b{8,64} (KV cache) and sampler_nocache_tokens_per_s_b{8,64}
           (scripts/baselines/nocache_sampler.py: the full forward over the whole token
           buffer for every new token, also one jitted loop), timed back to back;
           sampler_roofline_fraction_b{8,64} = achieved tokens/s over the roofline
           tokens/s, where each forward call (the prefill and every decode step) takes
           max(flops / machine matmul flops, bytes / machine read bandwidth),
           flops = matmul FLOPs over the valid context and bytes = parameters + the KV
           cache of the valid context. Each cached run sits between two machine probes and
           the fraction is the median over runs of (roofline time at the probes' mean /
           run time), so that a load change between the probes and the runs does not skew
           it; sampler_roofline_tokens_per_s_b* uses the median machine numbers.
           decode_matmul_gflops_b{8,64}, decode_matmul_fraction_b{8,64}: one decode step's
           weight matmuls alone (fused projections, one program) against the probe's
           matmul rate, the ceiling of the roofline fraction for a compute-bound decode.
  top_p    sampler_top_p_s_b8, sampler_top_p1_s_b8: median seconds of one sampler call
           (B = 8, prompt 16, 16 new tokens, temperature 1) with top_p = 0.95 and with
           top_p = 1 (no filter), the reference model with vocabulary 151,936 (Qwen2's)
           and its final norm scaled x8 so that, like a trained model's, the distribution
           is peaked (sampler_top_p_candidate_mass_min: the least probability the 64
           candidates hold over the rows' first step; below 0.95 the full sort runs);
           sampler_top_p_time_ratio = top_p 0.95 / top_p 1.
  replay   replay_add_us, replay_sample_us (N = 4096 slots) and the `_64k` keys (N = 65536):
           median microseconds of one jitted, blocking call (state donated) that adds 64 /
           samples 64 LLM-shaped items (tokens int32[160], behaviour log-probs and loss mask
           f32[160], reward, advantage f32, policy version int32), uniform strategy, one
           shard, buffer filled past capacity. With flashbax installed, its item buffer
           (make_item_buffer, add donated) on the same items is timed interleaved with ours:
           flashbax_add_us, flashbax_sample_us (+ `_64k`) and replay_vs_flashbax_speedup[_64k]
           = (flashbax add + sample) / (ours add + sample). replay_add_kernels,
           replay_sample_kernels (and flashbax_*_kernels): kernels (thunks) in the compiled
           program at N = 4096, which set these calls' cost on XLA:CPU more than the bytes
           they move.
  train    train_step_s, train_tokens_per_s, train_mfu: the replax train step (PPO loss,
           AdamW, global-norm clipping, state donated) on one device, batch 64 x 160 tokens
           (16 prompt, left-padded, + 144 completion, padded after EOS), the reference model
           with max_len 160. MFU = flops.train_flops(config, 64, 160) / step time / machine
           matmul FLOP/s, each step paired with the machine probes around it (as the
           sampler's roofline); train_cpu_s is the median process CPU seconds per step and
           train_mfu_cpu the same ratio per CPU-second of this process (step FLOPs / its CPU
           seconds over the matmul's FLOPs per CPU-second), which other load barely moves.
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


def roofline_seconds(config, batch, prompt_len, new_tokens, flops_per_s, bytes_per_s):
    """Ideal time of prefill + (new_tokens - 1) decode steps for a batch."""
    from replax import flops as flops_lib

    param_bytes = flops_lib.param_count(config) * 4
    kv_bytes_per_slot = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    total = max(
        batch * prompt_len * flops_lib.forward_flops_per_token(config, prompt_len) / flops_per_s,
        param_bytes / bytes_per_s,
    )
    for step in range(1, new_tokens):
        context = prompt_len + step
        flops = batch * flops_lib.forward_flops_per_token(config, context)
        read = param_bytes + batch * context * kv_bytes_per_slot
        total += max(flops / flops_per_s, read / bytes_per_s)
    return total


def decode_matmul_fraction(config, batch: int, repeats: int, probe) -> tuple[float, float]:
    """How fast this machine runs a decode step's weight matmuls alone: one token for a
    batch, through every layer (fused q/k/v and gate/up projections, the most favourable
    shapes) and the LM head, in one jitted program. Returns (GFLOP/s, fraction of the
    probe's matmul rate, median over runs each between two probes). A compute-bound
    sampler cannot beat this fraction of the roofline: it does these matmuls and more."""
    import jax
    import jax.numpy as jnp

    d, hd, mlp = config.d_model, config.head_dim, config.mlp_dim
    qkv = (config.num_heads + 2 * config.num_kv_heads) * hd
    layer = lambda: (
        jnp.full((d, qkv), 0.01),
        jnp.full((config.num_heads * hd, d), 0.01),
        jnp.full((d, 2 * mlp), 0.01),
        jnp.full((mlp, d), 0.01),
    )
    weights = ([layer() for _ in range(config.num_layers)], jnp.full((d, config.vocab_size), 0.01))

    def step(x, weights):
        layers, head = weights
        for w_qkv, w_o, w_gate_up, w_down in layers:
            x = x + (x @ w_qkv)[:, : config.num_heads * hd] @ w_o
            gate, up = jnp.split(x @ w_gate_up, 2, axis=1)
            x = x + (jax.nn.silu(gate) * up) @ w_down
        return x @ head

    flops = 2 * batch * (config.num_layers * (d * qkv + config.num_heads * hd * d + 3 * d * mlp))
    flops += 2 * batch * d * config.vocab_size
    fn, x = jax.jit(step), jnp.ones((batch, d), jnp.float32)
    jax.block_until_ready(fn(x, weights))
    rates, fractions = [], []
    for _ in range(10 * repeats):
        before = probe()
        rates.append(flops / timed(fn, x, weights) / 1e9)
        fractions.append(rates[-1] / ((before[0] + probe()[0]) / 2))
    return statistics.median(rates), statistics.median(fractions)


def bench_sampler(repeats: int) -> dict:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    from baselines import nocache_sampler

    from replax import flops as flops_lib
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
            "cached": sampler_lib.make_sampler(
                config,
                max_prompt_len=PROMPT_LEN,
                max_new_tokens=NEW_TOKENS,
                stop_ids=(1,),
                pad_id=0,
                temperature=1.0,
            ).generate,
            "nocache": nocache_sampler.make_generate(
                config, max_new_tokens=NEW_TOKENS, eos_id=1, pad_id=0, temperature=1.0
            ),
        }
        prompts = np.random.default_rng(batch).integers(2, config.vocab_size, (batch, PROMPT_LEN))
        prompt_ids = jnp.asarray(prompts, jnp.int32)
        prompt_mask = jnp.ones((batch, PROMPT_LEN), bool)
        args = (params, prompt_ids, prompt_mask, jax.random.key(1))
        steps = {}
        for name, generate in samplers.items():  # warm-up: compile, and count the steps
            result = generate(*args)
            steps[name] = int(jnp.max(result.lengths))  # the loop stops when all rows end
        times = {"cached": [], "nocache": []}
        fractions = []
        for _ in range(repeats):
            # The cached run between two machine probes (its roofline at the same load),
            # then the uncached run back to back.
            before = probe()
            times["cached"].append(timed(samplers["cached"], *args))
            after = probe()
            times["nocache"].append(timed(samplers["nocache"], *args))
            roofline_s = roofline_seconds(
                config,
                batch,
                PROMPT_LEN,
                steps["cached"],
                (before[0] + after[0]) / 2 * 1e9,
                (before[1] + after[1]) / 2 * 1e9,
            )
            fractions.append(roofline_s / times["cached"][-1])
        machine = machine_numbers()
        roofline_s = roofline_seconds(
            config,
            batch,
            PROMPT_LEN,
            steps["cached"],
            machine["machine_matmul_gflops"] * 1e9,
            machine["machine_read_gbs"] * 1e9,
        )
        for name, prefix in (("cached", "sampler"), ("nocache", "sampler_nocache")):
            tokens_per_s = batch * steps[name] / statistics.median(times[name])
            out[f"{prefix}_tokens_per_s_b{batch}"] = tokens_per_s
            out[f"{prefix}_seconds_b{batch}"] = sorted(times[name])
        out[f"sampler_roofline_tokens_per_s_b{batch}"] = batch * steps["cached"] / roofline_s
        out[f"sampler_roofline_fraction_b{batch}"] = statistics.median(fractions)
        out[f"sampler_roofline_fractions_b{batch}"] = sorted(fractions)
        gflops, fraction = decode_matmul_fraction(config, batch, repeats, probe)
        out[f"decode_matmul_gflops_b{batch}"] = gflops
        out[f"decode_matmul_fraction_b{batch}"] = fraction
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
        "param_count": flops_lib.param_count(config),
    }
    return out


TOP_P_VOCAB = 151_936
TOP_P_NEW_TOKENS = 16


def bench_top_p(repeats: int) -> dict:
    import dataclasses

    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    from replax import model as model_lib
    from replax import sampler as sampler_lib

    config = dataclasses.replace(
        reference_model_config(),
        vocab_size=TOP_P_VOCAB,
        max_len=PROMPT_LEN + TOP_P_NEW_TOKENS,
    )
    model = model_lib.Transformer(config)
    dummy = jnp.zeros((1, 1), jnp.int32)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), dummy, dummy))["params"]
    # Logits of std ~8 over 152k tokens: a few tokens hold most of the mass.
    params["final_norm"]["scale"] = params["final_norm"]["scale"] * 8.0
    batch = 8
    prompts = np.random.default_rng(0).integers(2, config.vocab_size, (batch, PROMPT_LEN))
    prompt_ids = jnp.asarray(prompts, jnp.int32)
    prompt_mask = jnp.ones((batch, PROMPT_LEN), bool)
    sampler = sampler_lib.make_sampler(
        config,
        max_prompt_len=PROMPT_LEN,
        max_new_tokens=TOP_P_NEW_TOKENS,
        stop_ids=(1,),
        pad_id=0,
        temperature=1.0,
    )
    args = (params, prompt_ids, prompt_mask, jax.random.key(1))
    generate = {top_p: functools.partial(sampler.generate, top_p=top_p) for top_p in (0.95, 1.0)}
    steps = {top_p: int(jnp.max(fn(*args).lengths)) for top_p, fn in generate.items()}
    times = {top_p: [] for top_p in generate}
    for _ in range(repeats):  # interleaved: each sees the same load
        for top_p, fn in generate.items():
            times[top_p].append(timed(fn, *args))
    positions = model_lib.positions_from_mask(prompt_mask)
    logits = jax.jit(model.apply)({"params": params}, prompt_ids, positions, prompt_mask)
    first = jax.nn.softmax(logits[:, -1], axis=-1)
    candidate_mass = jnp.sum(jax.lax.top_k(first, 64)[0], axis=-1)
    top_p_s, top_p1_s = statistics.median(times[0.95]), statistics.median(times[1.0])
    return {
        "sampler_top_p_s_b8": top_p_s,
        "sampler_top_p1_s_b8": top_p1_s,
        "sampler_top_p_time_ratio": top_p_s / top_p1_s,
        "sampler_top_p_seconds_b8": sorted(times[0.95]),
        "sampler_top_p1_seconds_b8": sorted(times[1.0]),
        "sampler_top_p_steps": [steps[0.95], steps[1.0]],
        "sampler_top_p_candidate_mass_min": float(jnp.min(candidate_mass)),
        "sampler_top_p_vocab_size": TOP_P_VOCAB,
        "sampler_top_p_candidates": sampler.sampling.top_p_candidates,
    }


REPLAY_CAPACITIES = {"": 4096, "_64k": 65536}
ITEM_LEN = 160  # tokens per rollout: 16 prompt + 144 completion
REPLAY_BATCH = 64


def replay_items(rng, num_items):
    """num_items LLM-shaped rollouts in the trainer's stored layout (rollouts.rollout_spec)
    with plausible values: random tokens, log-probs <= 0, 90% of tokens trained on."""
    import jax.numpy as jnp
    import numpy as np

    from replax import rollouts

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

    from replax import replay as replay_lib

    try:
        import flashbax as fbx
    except ImportError:
        fbx = None
    example = jax.tree.map(lambda x: x[0], items)
    step = jnp.int32(7)
    buffer = replay_lib.make_replay_buffer(capacity=capacity, strategy="uniform")
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


TRAIN_BATCH = 64
TRAIN_PROMPT_LEN = 16


def train_batch(config, params, rng):
    """A realistic batch of 64 rollouts: prompts of 8-16 tokens (left-padded), completions
    of 16-144 tokens ending in EOS (padded after), behaviour log-probs = the policy's own
    plus noise (so some ratios clip), GRPO advantages over groups of 8."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from replax import model as model_lib
    from replax import objectives

    b, p, length = TRAIN_BATCH, TRAIN_PROMPT_LEN, ITEM_LEN
    pad, eos = 0, 1
    prompt_len = rng.integers(8, p + 1, b)
    completion_len = rng.integers(16, length - p + 1, b)
    column = np.arange(length)[None, :]
    prompt_valid = (column < p) & (column >= p - prompt_len[:, None])
    completion_valid = (column >= p) & (column < p + completion_len[:, None])
    tokens = rng.integers(2, config.vocab_size, (b, length))
    tokens[np.arange(b), p + completion_len - 1] = eos
    attention_mask = prompt_valid | completion_valid
    tokens = np.where(attention_mask, tokens, pad)
    loss_mask = completion_valid.astype(np.float32)
    tokens, attention_mask = jnp.asarray(tokens, jnp.int32), jnp.asarray(attention_mask)
    logits = jax.jit(model_lib.Transformer(config).apply)(
        {"params": params}, tokens, model_lib.positions_from_mask(attention_mask), attention_mask
    )
    current = np.asarray(model_lib.token_logprobs(logits, tokens))
    behaviour = (current + 0.1 * rng.standard_normal(current.shape)) * loss_mask
    rewards = jnp.asarray(rng.random(b) < 0.5, jnp.float32)
    advantage, baseline = objectives.group_advantages(rewards, 8)
    return {
        "tokens": tokens,
        "attention_mask": attention_mask,
        "loss_mask": jnp.asarray(loss_mask),
        "behaviour_logprobs": jnp.asarray(behaviour, jnp.float32),
        "advantage": advantage,
        "reward": rewards,
        "baseline": baseline,
        "importance_weights": jnp.ones(b, jnp.float32),
        "age": jnp.asarray(rng.integers(0, 4, b), jnp.int32),
        "times_sampled": jnp.asarray(rng.integers(0, 4, b), jnp.int32),
    }


def bench_train(repeats: int) -> dict:
    import dataclasses

    import jax
    import numpy as np

    from replax import flops as flops_lib
    from replax import model as model_lib
    from replax import objectives, sharding
    from replax import train_step as train_step_lib

    probe = _machine_probe()
    config = dataclasses.replace(reference_model_config(), max_len=ITEM_LEN)
    model = model_lib.Transformer(config)
    mesh = sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])
    rules = sharding.validate_rules(sharding.DEFAULT_RULES)
    optimizer = train_step_lib.make_optimizer(
        train_step_lib.OptimizerConfig(learning_rate=1e-6, grad_clip=1.0)
    )
    state, state_shardings = train_step_lib.init_train_state(
        model, optimizer, jax.random.key(0), mesh, rules
    )
    batch = train_batch(config, state.params, np.random.default_rng(0))
    batch_sharding = train_step_lib.batch_shardings(mesh, rules, batch)
    batch = jax.device_put(batch, batch_sharding)
    step = train_step_lib.make_train_step(
        model,
        optimizer,
        objectives.LossConfig(name="ppo"),
        mesh,
        rules,
        state_shardings,
        batch_sharding,
    )
    for _ in range(2):  # warm-up: compile
        state, metrics = jax.block_until_ready(step(state, batch))
    flops = flops_lib.train_flops(config, TRAIN_BATCH, ITEM_LEN)
    seconds, cpu_seconds, mfus, cpu_mfus = [], [], [], []
    per_cpu_s = _MACHINE_SAMPLES["matmul_gflops_per_cpu_s"]
    for _ in range(repeats):
        # Each step between two machine probes: its MFU at the same load.
        before = probe()
        start, cpu_start = time.perf_counter(), time.process_time()
        state, metrics = jax.block_until_ready(step(state, batch))
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - cpu_start)
        after = probe()
        mfus.append(flops / seconds[-1] / ((before[0] + after[0]) / 2 * 1e9))
        cpu_mfus.append(flops / cpu_seconds[-1] / ((per_cpu_s[-1] + per_cpu_s[-2]) / 2 * 1e9))
    step_s = statistics.median(seconds)
    return {
        "train_step_s": step_s,
        "train_tokens_per_s": TRAIN_BATCH * ITEM_LEN / step_s,
        "train_mfu": statistics.median(mfus),
        "train_mfus": sorted(mfus),
        "train_mfu_cpu": statistics.median(cpu_mfus),
        "train_step_seconds": sorted(seconds),
        "train_cpu_s": statistics.median(cpu_seconds),
        "train_flops_per_step": flops,
        "train_trained_tokens": int(np.asarray(batch["loss_mask"]).sum()),
        "train_compiles": step.jitted._cache_size(),
        "train_clip_frac": float(metrics["clip_frac"]),
        **machine_numbers(),
    }


GROUPS = {
    "machine": bench_machine,
    "sampler": bench_sampler,
    "top_p": bench_top_p,
    "replay": bench_replay,
    "train": bench_train,
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
