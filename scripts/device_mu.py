r"""Measures mu, decode tokens/s and train-step MFU on this machine's first device.

  python scripts/device_mu.py --out=FILE.json [--shape=qwen2.5-0.5b] [--dtype=bfloat16]
      [--prompts=64] [--group_size=8] [--prompt_len=128] [--new_tokens=512]
      [--batch_size=1024] [--microbatches=16] [--slots=128] [--repeats=3]

mu is the paper's ratio of generating a rollout to training on one: here (seconds to
generate R rollouts / R) / (seconds of a train step on B rollouts / B), both measured on
the same device with the same random-init model of --shape, completions long-tailed as
a reasoning task's (a stop-token logit bias found by bisection gives a median of a
quarter of the cap; `length_spread` records what was measured). Generation is timed for
the static sampler (all R rows in one batch) and for the rollout engine (--slots slots);
the train step (PPO loss, AdamW, clipping, --microbatches, logits chunked 256 positions
at a time) is timed on B rollouts whose completion lengths are drawn from the measured
ones. MFU = the step's model FLOPs (replax.model.flops.train_flops) / its seconds / the
device's peak dense FLOP/s (a table of accelerators; on a CPU, the measured float32
matmul rate). Medians of --repeats after a warm-up.

scripts/device_mu.sh runs it on an accelerator within 8 minutes; `--shape=tiny` runs in
seconds anywhere (the test's shape).

Keys: `device`, `peak_flops_per_s` (`peak_source`), `shape`, `dtype`, `settings`,
`generation.{static,engine}.{seconds, rollouts_per_s, decode_tokens_per_s,
useful_row_step_frac}`, `train.{step_s, rollouts_per_s, tokens_per_s, mfu, flops}`,
`mu_static`, `mu_engine`, `length_spread`, `commit`.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from absl import app, flags

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Write the JSON object here.")
flags.DEFINE_enum("shape", "qwen2.5-0.5b", ["tiny", "bench", "qwen2.5-0.5b"], "Model shape.")
flags.DEFINE_string("dtype", "bfloat16", "Compute and cache dtype (float32 on a CPU).")
flags.DEFINE_integer("prompts", 64, "Prompts per generation.")
flags.DEFINE_integer("group_size", 8, "Rollouts per prompt (R = prompts x group_size).")
flags.DEFINE_integer("prompt_len", 128, "Prompt tokens (left-padded to it).")
flags.DEFINE_integer("new_tokens", 512, "The completion length cap.")
flags.DEFINE_integer("batch_size", 1024, "B, rollouts per train step.")
flags.DEFINE_integer("microbatches", 16, "Gradient accumulation slices of B.")
flags.DEFINE_integer("slots", 128, "The rollout engine's slots.")
flags.DEFINE_integer("refill_every", 8, "The engine's refill interval (decode steps).")
flags.DEFINE_integer("repeats", 3, "Timed runs of each program after a warm-up.")
flags.DEFINE_float("stop_bias", None, "The stop token's logit bias (default: found by bisection).")

STOP_ID, PAD_ID = 1, 0

# Peak dense FLOP/s per chip in 16-bit floats, from the vendors' data sheets (without
# sparsity); a device kind not listed is measured as a CPU is.
PEAK_FLOPS = {
    "H200": 989.4e12,
    "H100": 989.4e12,
    "A100": 312e12,
    "L4": 121e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
}


def model_config(shape: str, dtype: str, max_len: int):
    from replax.model import transformer as model_lib

    shapes = {
        # tests/conftest.py's tiny policy.
        "tiny": dict(
            vocab_size=64, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8
        ),
        # scripts/bench.py's reference model.
        "bench": dict(
            vocab_size=512, num_layers=4, d_model=256, num_heads=4, num_kv_heads=2, head_dim=64
        ),
        # Qwen2.5-0.5B-Instruct's architecture (tied embeddings, q/k/v biases).
        "qwen2.5-0.5b": dict(
            vocab_size=151936,
            num_layers=24,
            d_model=896,
            num_heads=14,
            num_kv_heads=2,
            head_dim=64,
            qkv_bias=True,
            tie_embeddings=True,
            rope_theta=1e6,
        ),
    }
    mlp = {"tiny": 64, "bench": 1024, "qwen2.5-0.5b": 4864}[shape]
    return model_lib.ModelConfig(
        **shapes[shape],
        mlp_dim=mlp,
        max_len=max_len,
        dtype=dtype,
        param_dtype="float32",
        scan_layers=shape == "qwen2.5-0.5b",
    )


def peak_flops(device) -> tuple[float, str]:
    kind = getattr(device, "device_kind", "")
    for name, flops in PEAK_FLOPS.items():
        if name.lower() in kind.lower():
            return flops, f"data sheet ({kind})"
    from benchmarks.common import _machine_probe

    probe = _machine_probe()
    gflops = statistics.median(probe()[0] for _ in range(3))
    return gflops * 1e9, f"measured float32 2048x2048 matmul ({kind or 'cpu'})"


def median_seconds(fn, repeats: int):
    import jax

    jax.block_until_ready(fn())  # warm-up: compiles
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def train_batch(config, lengths, rng, batch_size: int, prompt_len: int, new_tokens: int):
    """B rollouts of prompt_len + new_tokens, completion lengths drawn from `lengths`,
    group advantages over groups of 8, behaviour log-probs near a plausible value."""
    import jax.numpy as jnp
    import numpy as np

    from replax.rl import objectives

    length = prompt_len + new_tokens
    completion = rng.choice(lengths, batch_size)
    column = np.arange(length)[None, :]
    prompt_valid = column < prompt_len
    completion_valid = (column >= prompt_len) & (column < prompt_len + completion[:, None])
    mask = prompt_valid | completion_valid
    tokens = np.where(mask, rng.integers(2, config.vocab_size, (batch_size, length)), PAD_ID)
    loss_mask = completion_valid.astype(np.float32)
    behaviour = -rng.uniform(0.5, 4.0, (batch_size, length)) * loss_mask
    rewards = jnp.asarray(rng.random(batch_size) < 0.5, jnp.float32)
    advantage, baseline = objectives.group_advantages(rewards, 8)
    return {
        "tokens": jnp.asarray(tokens, jnp.int32),
        "attention_mask": jnp.asarray(mask),
        "loss_mask": jnp.asarray(loss_mask),
        "behaviour_logprobs": jnp.asarray(behaviour, jnp.float32),
        "advantage": advantage,
        "reward": rewards,
        "baseline": baseline,
        "importance_weights": jnp.ones(batch_size, jnp.float32),
        "age": jnp.zeros(batch_size, jnp.int32),
        "times_sampled": jnp.zeros(batch_size, jnp.int32),
    }


def measure(args) -> dict:
    import jax
    import numpy as np
    from benchmarks.common import bisect_stop_bias, commit

    from replax.core import sharding
    from replax.model import flops as flops_lib
    from replax.model import transformer as model_lib
    from replax.rl import objectives
    from replax.rl import train_step as train_step_lib
    from replax.sampling import engine as engine_lib
    from replax.sampling import sampler as sampler_lib

    p, n, g = args.prompt_len, args.new_tokens, args.group_size
    config = model_config(args.shape, args.dtype, p + n)
    model = model_lib.Transformer(config)
    device = jax.devices()[0]
    mesh = sharding.make_mesh((1, 1, 1), devices=[device])
    rules = sharding.validate_rules(sharding.DEFAULT_RULES)
    optimizer = train_step_lib.make_optimizer(
        train_step_lib.OptimizerConfig(learning_rate=1e-6, grad_clip=1.0)
    )
    state, state_shardings = train_step_lib.init_train_state(
        model, optimizer, jax.random.key(0), mesh, rules
    )
    rng = np.random.default_rng(0)
    prompt_ids = rng.integers(2, config.vocab_size, (args.prompts, p)).astype(np.int32)
    prompt_mask = np.ones_like(prompt_ids, dtype=bool)
    key = jax.random.key(1)

    def make(bias):
        return sampler_lib.make_sampler(
            config,
            sampler_lib.SamplingConfig(logit_bias=((STOP_ID, float(bias)),)),
            max_prompt_len=p,
            max_new_tokens=n,
            stop_ids=(STOP_ID,),
            pad_id=PAD_ID,
            mesh=mesh,
            rules=rules,
        )

    # LENGTHS: the stop bias whose median completion is a quarter of the cap, found on a
    # probe of a quarter of the prompts.
    probe = max(1, args.prompts // 4)

    def median_length(bias):
        out = make(bias).generate(
            state.params, prompt_ids[:probe], prompt_mask[:probe], key, num_samples=g
        )
        return float(np.median(np.asarray(out.lengths)))

    if args.stop_bias is None:
        bias = bisect_stop_bias(median_length, n / 4, -5.0, 25.0, 10)
    else:
        bias = args.stop_bias
    sampler = make(bias)
    engine = engine_lib.make_engine(sampler, slots=args.slots, refill_every=args.refill_every)
    params = sampler.prepare_params(state.params)
    total = args.prompts * g

    # GENERATION: the static sampler's whole batch, and the engine.
    def static():
        return sampler.generate(
            params, prompt_ids, prompt_mask, key, num_samples=g, rollout_keys=True
        )

    def through_engine():
        return engine.generate_with_stats(params, prompt_ids, prompt_mask, key, num_samples=g)

    static_s, static_all = median_seconds(static, args.repeats)
    engine_s, engine_all = median_seconds(through_engine, args.repeats)
    out = static()
    lengths = np.asarray(out.lengths)
    kept = int(lengths.sum())
    engine_out, stats = through_engine()
    generation = {
        "static": {
            "seconds": static_s,
            "seconds_all": static_all,
            "rollouts_per_s": total / static_s,
            "decode_tokens_per_s": kept / static_s,
            "useful_row_step_frac": kept / (total * int(lengths.max())),
        },
        "engine": {
            "seconds": engine_s,
            "seconds_all": engine_all,
            "rollouts_per_s": total / engine_s,
            "decode_tokens_per_s": kept / engine_s,
            "useful_row_step_frac": kept / int(stats.row_steps),
            "same_tokens_as_static": bool(
                np.array_equal(np.asarray(engine_out.tokens), np.asarray(out.tokens))
            ),
        },
    }

    # TRAINING: B rollouts of the measured lengths, one optimizer step.
    batch = train_batch(config, lengths, rng, args.batch_size, p, n)
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
        logits_chunk_size=min(256, p + n),
        num_microbatches=args.microbatches,
        grad_clip=1.0,
    )
    holder = {"state": state}

    def train():
        holder["state"], metrics = step(holder["state"], batch)
        return metrics

    step_s, step_all = median_seconds(train, args.repeats)
    flops = flops_lib.train_flops(config, args.batch_size, p + n)
    peak, peak_source = peak_flops(device)
    train = {
        "step_s": step_s,
        "step_s_all": step_all,
        "rollouts_per_s": args.batch_size / step_s,
        "tokens_per_s": args.batch_size * (p + n) / step_s,
        "flops": flops,
        "mfu": flops / step_s / peak,
    }
    per_rollout_train = step_s / args.batch_size
    quantiles = {f"p{q}": float(np.percentile(lengths, q)) for q in (10, 25, 50, 75, 90, 99)}
    return {
        "device": f"{device.platform}: {getattr(device, 'device_kind', '')}",
        "peak_flops_per_s": peak,
        "peak_source": peak_source,
        "shape": args.shape,
        "dtype": args.dtype,
        "settings": {
            "prompts": args.prompts,
            "group_size": g,
            "rollouts": total,
            "prompt_len": p,
            "new_tokens": n,
            "batch_size": args.batch_size,
            "microbatches": args.microbatches,
            "slots": args.slots,
            "refill_every": args.refill_every,
            "repeats": args.repeats,
            "params": int(flops_lib.param_count(config)),
        },
        "generation": generation,
        "train": train,
        "mu_static": (static_s / total) / per_rollout_train,
        "mu_engine": (engine_s / total) / per_rollout_train,
        "length_spread": {
            **quantiles,
            "mean": float(lengths.mean()),
            "cap": n,
            "at_cap_frac": float(np.mean(lengths == n)),
            "stop_logit_bias": bias,
        },
        "commit": commit(),
    }


def main(argv):
    del argv
    for name in ("prompts", "group_size", "prompt_len", "new_tokens", "batch_size", "slots"):
        if getattr(FLAGS, name) < 1:
            print(f"device_mu: --{name}={getattr(FLAGS, name)}: allowed is an integer >= 1")
            return 2
    if FLAGS.batch_size % FLAGS.microbatches or FLAGS.batch_size % 8:
        print("device_mu: --batch_size must be a multiple of 8 and of --microbatches")
        return 2
    from benchmarks.common import print_and_write

    result = measure(FLAGS)
    print_and_write(result, FLAGS.out, indent=2)
    return 0


if __name__ == "__main__":
    from replax.core.config_utils import parse_flags_or_exit

    app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags_or_exit)
