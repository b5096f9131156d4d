r"""The rollout engine against the static sampler, at long-tailed completion lengths.

  python scripts/bench_engine.py --out=engine.json [--repeats=3] [--prompts=32]
      [--group_size=8] [--slots=64] [--refill_every=2] [--max_admit=0] [--drain_halvings=2]
      [--stream_generations=4] [--cpu_matmul=eigen]

Both generate the same rollouts (rollout keys: each rollout draws from its own key) of the
same prompts with the reference model of scripts/bench.py (vocab 512, 4 layers, d_model
256, fp32; prompt 16 tokens, cap 64 new tokens), back to back in one process, --repeats
times each after a warm-up; the figures are medians.

- static: `Sampler.generate` over the R rollouts in batches of --slots rows (prompts of
  one batch together), each batch decoding until its longest row stops: the same cache
  memory as the engine's. static_whole: all R rows in one batch, what the RL loop decodes
  without the engine (its cache is R rows, not S).
- engine: `Engine.generate`, S = --slots slots refilled every --refill_every steps (at
  most --max_admit a refill after the first fill; 0: every free slot), halved up to
  --drain_halvings times as the last rollouts of the call come to fit.

Completion lengths are long-tailed as those of reasoning tasks are: a logit bias on the
stop token (`SamplingConfig.logit_bias`), found by bisection so that the median completion
is a quarter of the cap, makes the stop a near-constant hazard, so lengths are about
geometric with about 5% of rollouts at the cap. `length_spread` holds the lengths'
quantiles as measured on this run.

Keys: `static`, `static_whole` and `engine`, each with `rollouts_per_s`, `seconds` (median)
and `useful_row_step_frac` (decoded row-steps that produced a kept token over all decoded
row-steps); `speedup` (engine over static, rollouts/s), `speedup_vs_whole`;
`same_rollouts` (every rollout of the engine equals the static sampler's over the whole
batch: identical tokens and masks, log-probs within 1e-6 absolute plus 1e-6 relative; the
largest differences beside it, and how many rollouts differ between the engine, the
whole batch and the batches of S rows, which float32 rounding can make differ at a
token's CDF boundary); `matmul_row_count_max_abs_diff` (each of the decoder's matrix
products at the engine's slot counts against the whole batch's rows: where the CPU's
kernel sums in another order); `length_spread`; `settings`; `commit`. With
--stream_generations=N > 0 also `engine_per_generation`, `stream` and
`stream_same_rollouts`: N generations through the engine one at a time and through the
stream (scripts/benchmarks/stream.py).

--cpu_matmul picks XLA:CPU's matrix-multiply kernels. XLA's default hands dots to
YNNPACK, whose kernels sum a row's products in an order that depends on the row count
below 56 rows, so a rollout's log-probs change in the last bits where the engine steps
down to fewer slots. With `eigen` (the default here: `--xla_cpu_experimental_ynn_fusion_type=`,
no YNNPACK fusions) every product of the reference model gives a row the same bits at 32
rows or more, and the last-bit differences left are small enough for `same_rollouts`'
tolerance. Both sides of the comparison run on the same kernels; `settings.cpu_matmul`
names them.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Write the JSON object here.")
flags.DEFINE_integer("repeats", 3, "Timed runs of each sampler (after one warm-up).")
flags.DEFINE_integer("prompts", 64, "Prompts per call.")
flags.DEFINE_integer("group_size", 8, "Rollouts per prompt (R = prompts x group_size).")
flags.DEFINE_integer("slots", 64, "The engine's slots; the static sampler's batch rows.")
flags.DEFINE_integer("refill_every", 2, "The engine's refill interval, in decode steps.")
flags.DEFINE_integer("max_admit", 0, "The most slots one refill admits (0: every free one).")
flags.DEFINE_integer("drain_halvings", 2, "Times the engine's slots may halve at the end.")
flags.DEFINE_float("median_frac", 0.25, "Target median completion length / cap.")
flags.DEFINE_integer(
    "stream_generations", 0, "With N > 0: N generations through the stream against the engine."
)

flags.DEFINE_enum(
    "cpu_matmul",
    "eigen",
    ["eigen", "ynnpack"],
    "XLA:CPU's dot kernels: eigen (row-count independent at >= 32 rows) or XLA's default.",
)

STOP_ID, PAD_ID = 1, 0
NO_YNNPACK = "--xla_cpu_experimental_ynn_fusion_type="


def static_rows(sampler, params, ids, mask, key, group_size, slots):
    """The static sampler over all rollouts, `slots` rows a batch (prompt blocks of
    slots / G prompts); returns (tokens, logprobs, lengths, decoded row-steps)."""
    import jax
    import numpy as np

    per_call = max(1, slots // group_size)
    total = len(ids) * group_size
    outs = []
    for start in range(0, len(ids), per_call):
        block = ids[start : start + per_call]
        rows = len(block) * group_size
        # The block's rollout indices start at start G: row_block (i, n) numbers rows
        # i rows ... , so rows must divide start G (the blocks are of equal size).
        out = sampler.generate(
            params,
            block,
            mask[start : start + per_call],
            key,
            num_samples=group_size,
            row_block=(start * group_size // rows, total // rows),
            rollout_keys=True,
        )
        outs.append(out)
    jax.block_until_ready(outs)
    tokens = np.concatenate([np.asarray(o.tokens) for o in outs])
    logprobs = np.concatenate([np.asarray(o.logprobs) for o in outs])
    lengths = np.concatenate([np.asarray(o.lengths) for o in outs])
    # Each batch decodes until its longest row stops (or the cap).
    row_steps = sum(len(o.lengths) * int(np.max(o.lengths)) for o in outs)
    return tokens, logprobs, lengths, row_steps


def row_count_differences(config, rows: int, slot_counts) -> dict:
    """Why log-probs differ with the batch's row count: each of the decoder's matrix
    products (K x N, one per weight shape) on `rows` random rows, against the same product
    on its first m rows, for m in slot_counts (the engine's, stepping down). XLA:CPU picks
    its matrix-multiply kernel by the operands' shapes, and kernels sum a row's K products
    in different orders: where a row's result differs (max abs difference > 0), the same
    rollout's log-probs can differ in the last bits between the engine and the whole
    batch, though no row depends on another."""
    import jax
    import numpy as np

    d, heads, kv, hd = config.d_model, config.num_heads, config.num_kv_heads, config.head_dim
    shapes = {
        "q": (d, heads * hd),
        "kv": (d, 2 * kv * hd),
        "attention out": (heads * hd, d),
        "mlp in": (d, config.mlp_dim),
        "mlp out": (config.mlp_dim, d),
        "head": (d, config.vocab_size),
    }
    rng = np.random.default_rng(0)
    product = jax.jit(lambda a, b: a @ b)
    result = {}
    for name, (k, n) in shapes.items():
        x = rng.normal(size=(rows, k)).astype(np.float32)
        w = rng.normal(size=(k, n)).astype(np.float32) / np.sqrt(k)
        whole = np.asarray(product(x, w))
        result[f"{name} {k}x{n}"] = {
            str(m): float(np.abs(np.asarray(product(x[:m], w)) - whole[:m]).max())
            for m in slot_counts
        }
    return result


def main(argv):
    del argv
    if FLAGS.cpu_matmul == "eigen":  # read when the backend starts: before jax is imported
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {NO_YNNPACK}".strip()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from benchmarks.common import (
        NEW_TOKENS,
        PROMPT_LEN,
        bisect_stop_bias,
        commit,
        print_and_write,
        reference_model_config,
    )

    from replax.model import transformer as model_lib
    from replax.sampling import engine as engine_lib
    from replax.sampling import generation
    from replax.sampling import sampler as sampler_lib

    if FLAGS.slots < 1 or FLAGS.refill_every < 1 or FLAGS.prompts < 1 or FLAGS.group_size < 1:
        print("bench_engine: --slots, --refill_every, --prompts, --group_size must be >= 1")
        return 2
    if not 0 <= FLAGS.max_admit <= FLAGS.slots:
        print(f"bench_engine: --max_admit={FLAGS.max_admit}: allowed is 0 <= max_admit <= --slots")
        return 2
    config = reference_model_config()
    model = model_lib.Transformer(config)
    dummy = jnp.zeros((1, PROMPT_LEN), jnp.int32)
    params = jax.jit(model.init)(jax.random.key(0), dummy, dummy)["params"]
    rng = np.random.default_rng(0)
    ids = rng.integers(2, config.vocab_size, (FLAGS.prompts, PROMPT_LEN)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    for row, pad in enumerate(rng.integers(0, PROMPT_LEN // 2, FLAGS.prompts)):
        mask[row, :pad] = False  # left padding of various lengths
    key = jax.random.key(1)

    def make(bias):
        return sampler_lib.make_sampler(
            config,
            sampler_lib.SamplingConfig(logit_bias=((STOP_ID, float(bias)),)),
            max_prompt_len=PROMPT_LEN,
            max_new_tokens=NEW_TOKENS,
            stop_ids=(STOP_ID,),
            pad_id=PAD_ID,
        )

    def median_length(bias):
        out = make(bias).generate(
            params, ids, mask, key, num_samples=FLAGS.group_size, rollout_keys=True
        )
        return float(np.median(np.asarray(out.lengths)))

    bias = bisect_stop_bias(median_length, FLAGS.median_frac * NEW_TOKENS, -5.0, 15.0, 14)
    sampler = make(bias)
    engine = engine_lib.make_engine(
        sampler,
        slots=FLAGS.slots,
        refill_every=FLAGS.refill_every,
        max_admit=FLAGS.max_admit,
        drain_halvings=FLAGS.drain_halvings,
    )
    total = FLAGS.prompts * FLAGS.group_size

    def run_static():
        return static_rows(sampler, params, ids, mask, key, FLAGS.group_size, FLAGS.slots)

    def run_whole():
        out = sampler.generate(
            params, ids, mask, key, num_samples=FLAGS.group_size, rollout_keys=True
        )
        lengths = np.asarray(out.lengths)
        return out, total * int(lengths.max())

    def run_engine():
        out, stats = engine.generate_with_stats(
            params, ids, mask, key, num_samples=FLAGS.group_size
        )
        jax.block_until_ready(out)
        return out, stats

    # Warm-ups (compiles), then the three back to back, repeats times.
    static_out, whole_out, engine_out = run_static(), run_whole(), run_engine()
    times = {"static": [], "static_whole": [], "engine": []}
    for _ in range(FLAGS.repeats):
        for name, fn in (
            ("static", run_static),
            ("static_whole", run_whole),
            ("engine", run_engine),
        ):
            start = time.perf_counter()
            result = fn()
            jax.block_until_ready(result)
            times[name].append(time.perf_counter() - start)

    tokens, logprobs, lengths, static_row_steps = static_out
    out, stats = engine_out
    whole, whole_row_steps = whole_out
    # The reference is the static sampler over the whole batch (what a run without the
    # engine decodes). Float32 sums run in another order at another batch shape, so
    # log-probs agree to rounding, and a uniform that falls within that rounding of a
    # token's CDF boundary can pick the neighbouring token: the static sampler differs
    # from itself between its two batchings as much (the *_static_blocked keys).
    engine_tokens, engine_lp = np.asarray(out.tokens), np.asarray(out.logprobs)
    whole_tokens, whole_lp = np.asarray(whole.tokens), np.asarray(whole.logprobs)
    diff = np.abs(engine_lp - whole_lp)
    same = bool(
        np.array_equal(engine_tokens, whole_tokens)
        and np.array_equal(np.asarray(out.mask), np.asarray(whole.mask))
        and np.allclose(engine_lp, whole_lp, rtol=1e-6, atol=1e-6)
    )
    differing = lambda a, b: int(np.sum(np.any(a != b, axis=1)))
    kept = int(lengths.sum())
    seconds = {k: statistics.median(v) for k, v in times.items()}
    engine_row_steps = int(stats.row_steps)

    def entry(name, row_steps):
        return {
            "rollouts_per_s": total / seconds[name],
            "seconds": seconds[name],
            "seconds_all": times[name],
            "useful_row_step_frac": kept / row_steps,
            "decoded_row_steps": row_steps,
        }

    quantiles = {f"p{q}": float(np.percentile(lengths, q)) for q in (10, 25, 50, 75, 90, 99)}
    result = {
        "static": entry("static", static_row_steps),
        "static_whole": entry("static_whole", whole_row_steps),
        "engine": {
            **entry("engine", engine_row_steps),
            "decode_steps": int(stats.decode_steps),
            "refills": int(stats.refills),
        },
        "speedup": seconds["static"] / seconds["engine"],
        "speedup_vs_whole": seconds["static_whole"] / seconds["engine"],
        "same_rollouts": same,
        "logprob_max_abs_diff": float(diff.max()),
        "logprob_max_rel_diff": float((diff / np.maximum(1.0, np.abs(whole_lp))).max()),
        "rollouts_differing_engine_vs_static_whole": differing(engine_tokens, whole_tokens),
        "rollouts_differing_engine_vs_static_blocked": differing(engine_tokens, tokens),
        "rollouts_differing_static_whole_vs_static_blocked": differing(whole_tokens, tokens),
        "matmul_row_count_max_abs_diff": row_count_differences(
            config,
            total,
            (FLAGS.slots, *generation.drain_sizes(FLAGS.slots, FLAGS.drain_halvings, 1)),
        ),
        "tokens_kept": int(lengths.sum()),
        "length_spread": {
            **quantiles,
            "mean": float(lengths.mean()),
            "cap": NEW_TOKENS,
            "at_cap_frac": float(np.mean(lengths == NEW_TOKENS)),
            "stop_logit_bias": bias,
            "how": "stop-token logit bias found by bisection for a median of "
            f"{FLAGS.median_frac:g} x the cap: a near-constant stop hazard, lengths about "
            "geometric",
        },
        "settings": {
            "prompts": FLAGS.prompts,
            "group_size": FLAGS.group_size,
            "rollouts": total,
            "slots": FLAGS.slots,
            "refill_every": FLAGS.refill_every,
            "max_admit": FLAGS.max_admit,
            "drain_halvings": FLAGS.drain_halvings,
            "prompt_len": PROMPT_LEN,
            "max_new_tokens": NEW_TOKENS,
            "repeats": FLAGS.repeats,
            "backend": jax.default_backend(),
            "cpu_matmul": FLAGS.cpu_matmul,
            "load_avg_1m": os.getloadavg()[0],
        },
        "commit": commit(),
    }
    if FLAGS.stream_generations > 0:
        from benchmarks import stream

        result.update(
            stream.compare(
                engine,
                params,
                ids,
                mask,
                key,
                FLAGS.group_size,
                FLAGS.stream_generations,
                FLAGS.repeats,
            )
        )
    print_and_write(result, FLAGS.out, indent=2)
    return 0


if __name__ == "__main__":
    from replax.core.config_utils import parse_flags_or_exit

    app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags_or_exit)
