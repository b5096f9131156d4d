r"""Replax against Tunix on one shape, back to back: rollout and GRPO train-step tokens/s.

  "$TUNIX_VENV"/bin/python scripts/bench_tunix.py --out=bench_tunix.json

A machine too small for that shape takes flags, e.g. (2 shared CPU cores):

  "$TUNIX_VENV"/bin/python scripts/bench_tunix.py --out=bench_tunix.json \
      --layers=4 --prompts=1 --prompt_len=64 --new_tokens=128 --train_batch=8

$TUNIX_VENV (any directory): `pip install --no-deps google-tunix==0.1.7`, then its requirements with
jax, jaxlib 0.10.2, flax 0.12.8 and optax 0.2.8 pinned to replax's (transformers,
datasets, kagglehub and tensorflow-datasets left out: the modules used here do not import
them), and pandas.

Issue #16 asks for rollout tokens/s >= 2x Tunix's vanilla sampler and train-step tokens/s
>= 1.3x Tunix's GRPO step at about 100M parameters (12 layers, d_model 768, vocabulary
32k; prompt 128 tokens, G = 8, 256 new tokens, 64 rollouts), the defaults here. Both
sides run in this one process (the same jax, jaxlib, flax and optax), random fp32
weights, on whatever devices jax sees; the virtualenv holds google-tunix and replax is
put on the path from this checkout.

Rollout: `--prompts` prompts of `--prompt_len` random tokens, `--group` samples each,
`--new_tokens` each, temperature 1, no top-k / top-p. Neither side can stop early: the
stop id is the last vocabulary row, which replax never samples (sampler `vocab_size`
one below the model's) and Tunix forbids (`forbidden_tokens`). Tunix:
`tunix.generate.sampler.Sampler` over `tunix.models.llama3.model.Llama3` given the
prompts repeated G times (its vanilla path: text in, token lists out, through a tokenizer
that reads ids written as text). Replax: `Sampler.generate(..., num_samples=G)` (the
prompt prefilled once) when the sampler has it, else `Sampler.sample_k`.
rollout tokens/s = tokens generated (counted from each side's output) / wall time.

Train step: one GRPO step over `--train_batch` sequences of prompt_len + new_tokens
tokens, every token valid, AdamW (global-norm clip 1, lr 1e-6) from
`replax.rl.train_step.make_optimizer` on both sides, KL off. Tunix:
`tunix.rl.trainer.Trainer` (the GRPO learner's actor trainer) with
`algo_core.grpo_loss_fn` bound as `GRPOLearner` binds it, its jitted train step
(`jit_train_and_eval_step`). Replax: `train_step.make_train_step` with the PPO-clip loss,
sequence-mean aggregation (Tunix's default). train tokens/s = batch x length / step time.

Every timed call follows one warm-up call (compilation) on the same shapes; each
repetition runs replax and Tunix back to back, the side that goes first alternating.
The JSON holds the medians, every repetition (wall and process CPU seconds, and the
seconds of each XLA compilation inside a timed call, which should be none), the shape,
the versions and the load average at the start and the end. On a shared machine
`*_per_cpu_s` (tokens per CPU-second of this process) moves less with other load than
tokens per wall second.
"""

import dataclasses
import functools
import importlib.metadata
import os
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "baselines"))

from benchmarks.common import print_and_write  # noqa: E402
from grpo_sides import Replax, Shape, Tunix  # noqa: E402

_OUT = flags.DEFINE_string("out", None, "Write the JSON object to this file.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repetitions per side.")
_PARTS = flags.DEFINE_list("parts", ["rollout", "train"], "Which comparisons to run.")
_LAYERS = flags.DEFINE_integer("layers", 12, "Transformer layers.")
_D_MODEL = flags.DEFINE_integer("d_model", 768, "Model width.")
_HEADS = flags.DEFINE_integer("heads", 12, "Query heads (head_dim = d_model / heads).")
_KV_HEADS = flags.DEFINE_integer("kv_heads", 4, "Key / value heads.")
_MLP = flags.DEFINE_integer("mlp", 2048, "SwiGLU hidden width.")
_VOCAB = flags.DEFINE_integer("vocab", 32_000, "Vocabulary size (tied embedding).")
_PROMPTS = flags.DEFINE_integer("prompts", 8, "Distinct prompts per rollout batch.")
_GROUP = flags.DEFINE_integer("group", 8, "Samples per prompt (G).")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 128, "Prompt tokens.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 256, "Generated tokens per rollout.")
_TRAIN_BATCH = flags.DEFINE_integer("train_batch", None, "Train sequences (default prompts x G).")


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# Recorded by jax once per XLA compilation (jax._src.dispatch.BACKEND_COMPILE_EVENT).
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def timed(fn):
    """(wall seconds, process CPU seconds, result, seconds of each XLA compilation) of
    one blocking call."""
    import jax

    compiles = []

    def listener(event, duration, **kwargs):
        if event == BACKEND_COMPILE_EVENT:
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        start, cpu_start = time.perf_counter(), time.process_time()
        result = jax.block_until_ready(fn())
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    return seconds, cpu_seconds, result, compiles


def compare(sides: dict, call, repeats: int, tokens_of) -> dict:
    """Warm-up then `repeats` timed calls of call(side, rep) per side, back to back, the
    first side alternating. Returns per-side lists of seconds and tokens/s."""
    runs = {
        name: {
            "seconds": [],
            "cpu_seconds": [],
            "tokens": [],
            "tokens_per_s": [],
            "tokens_per_cpu_s": [],
            "compile_s_in_timed_calls": [],
        }
        for name in sides
    }
    for name, side in sides.items():
        seconds, _, _, _ = timed(functools.partial(call, side, -1))
        runs[name]["compile_and_first_call_s"] = round(seconds, 2)
        print(f"  warm-up {name}: {seconds:.1f}s", flush=True)
    order = list(sides)
    for rep in range(repeats):
        for name in order if rep % 2 == 0 else order[::-1]:
            seconds, cpu_seconds, result, compiles = timed(
                functools.partial(call, sides[name], rep)
            )
            tokens = tokens_of(result)
            r = runs[name]
            r["compile_s_in_timed_calls"].append([round(c, 3) for c in compiles])
            r["seconds"].append(round(seconds, 3))
            r["cpu_seconds"].append(round(cpu_seconds, 3))
            r["tokens"].append(tokens)
            r["tokens_per_s"].append(round(tokens / seconds, 1))
            r["tokens_per_cpu_s"].append(round(tokens / cpu_seconds, 1))
            print(
                f"  rep {rep} {name}: {seconds:.2f}s ({cpu_seconds:.2f} CPU-s), "
                f"{tokens / seconds:.1f} tokens/s, load {load_average()[0]}",
                flush=True,
            )
    return runs


def summarise(prefix: str, runs: dict) -> dict:
    out = {}
    for name, r in runs.items():
        out[f"{name}_{prefix}_tokens_per_s"] = statistics.median(r["tokens_per_s"])
        out[f"{name}_{prefix}_tokens_per_cpu_s"] = statistics.median(r["tokens_per_cpu_s"])
        out[f"{name}_{prefix}_runs"] = r
    for suffix in ("tokens_per_s", "tokens_per_cpu_s"):
        ratio = out[f"replax_{prefix}_{suffix}"] / out[f"tunix_{prefix}_{suffix}"]
        key = f"{prefix}_speedup" if suffix == "tokens_per_s" else f"{prefix}_speedup_per_cpu_s"
        out[key] = round(ratio, 3)
    return out


def versions() -> dict:
    import jax

    names = ("jax", "jaxlib", "flax", "optax", "google-tunix")
    out = {name: importlib.metadata.version(name) for name in names}
    out["python"] = sys.version.split()[0]
    out["devices"] = [str(d) for d in jax.devices()]
    out["cpu_count"] = os.cpu_count()
    return out


def main(argv):
    del argv
    shape = Shape(
        layers=_LAYERS.value,
        d_model=_D_MODEL.value,
        heads=_HEADS.value,
        kv_heads=_KV_HEADS.value,
        mlp=_MLP.value,
        vocab=_VOCAB.value,
        prompts=_PROMPTS.value,
        group=_GROUP.value,
        prompt_len=_PROMPT_LEN.value,
        new_tokens=_NEW_TOKENS.value,
        train_batch=_TRAIN_BATCH.value or _PROMPTS.value * _GROUP.value,
    )
    result = {
        "shape": {**dataclasses.asdict(shape), "head_dim": shape.head_dim},
        "num_params": shape.num_params(),
        "load_average_start": load_average(),
        "start_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": versions(),
    }
    start = time.perf_counter()
    sides = {"replax": Replax(shape), "tunix": Tunix(shape)}
    result["replax_rollout_path"] = sides["replax"].rollout_path
    if "rollout" in _PARTS.value:
        print("rollout", flush=True)
        runs = compare(sides, lambda side, rep: side.rollout(seed=rep + 1), _REPEATS.value, int)
        result.update(summarise("rollout", runs))
    if "train" in _PARTS.value:
        print("train step", flush=True)
        tokens = shape.train_batch * shape.seq_len
        runs = compare(sides, lambda side, rep: side.train_step(), _REPEATS.value, lambda _: tokens)
        result.update(summarise("train", runs))
    result["load_average_end"] = load_average()
    result["total_s"] = round(time.perf_counter() - start, 1)
    print_and_write(result, _OUT.value, indent=2)


if __name__ == "__main__":
    app.run(main)
