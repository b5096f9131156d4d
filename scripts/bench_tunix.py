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
import inspect
import json
import os
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

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

PAD_ID = 0
LEARNING_RATE = 1e-6


@dataclasses.dataclass(frozen=True)
class Shape:
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    mlp: int
    vocab: int
    prompts: int
    group: int
    prompt_len: int
    new_tokens: int
    train_batch: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def rollouts(self) -> int:
        return self.prompts * self.group

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.new_tokens

    @property
    def stop_id(self) -> int:
        """Never sampled on either side, so every rollout runs to full length."""
        return self.vocab - 1

    def num_params(self) -> int:
        attention = self.d_model * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.d_model * self.mlp
        return self.vocab * self.d_model + self.layers * (attention + mlp + 2 * self.d_model)


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


def random_prompts(shape: Shape, seed: int):
    """int32[prompts, prompt_len], ids in [1, stop_id): no pad, no stop token."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(1, shape.stop_id, (shape.prompts, shape.prompt_len)).astype(np.int32)


def train_tokens(shape: Shape, seed: int):
    """int32[train_batch, seq_len] prompt + completion, every token valid, no pad."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(1, shape.stop_id, (shape.train_batch, shape.seq_len)).astype(np.int32)


def group_advantages(shape: Shape, seed: int):
    """float32[train_batch]: a GRPO advantage per sequence (0/1 rewards, normalised per
    group of G)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rewards = (rng.random((shape.train_batch // shape.group, shape.group)) < 0.5).astype(np.float32)
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    return (centred / (rewards.std(axis=1, keepdims=True) + 1e-6)).reshape(-1)


def optimizer():
    from replax.rl import train_step as train_step_lib

    return train_step_lib.make_optimizer(
        train_step_lib.OptimizerConfig(learning_rate=LEARNING_RATE, grad_clip=1.0)
    )


# REPLAX


class Replax:
    """Replax's sampler and train step at `shape`."""

    def __init__(self, shape: Shape):
        import jax

        from replax.core import sharding
        from replax.model import transformer as model_lib
        from replax.sampling import sampler as sampler_lib

        self.shape = shape
        self.config = model_lib.ModelConfig(
            vocab_size=shape.vocab,
            num_layers=shape.layers,
            d_model=shape.d_model,
            num_heads=shape.heads,
            num_kv_heads=shape.kv_heads,
            head_dim=shape.head_dim,
            mlp_dim=shape.mlp,
            max_len=shape.seq_len,
        )
        self.model = model_lib.Transformer(self.config)
        self.mesh = sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])
        self.rules = sharding.validate_rules(sharding.DEFAULT_RULES)
        self.sampler = sampler_lib.make_sampler(
            self.config,
            max_prompt_len=shape.prompt_len,
            max_new_tokens=shape.new_tokens,
            stop_ids=(shape.stop_id,),
            pad_id=PAD_ID,
            temperature=1.0,
            vocab_size=shape.stop_id,  # the stop row is never sampled
        )
        self.shared_prefill = "num_samples" in inspect.signature(self.sampler.generate).parameters
        self.state = None
        self.step = None

    @property
    def rollout_path(self) -> str:
        return "generate(num_samples=G)" if self.shared_prefill else "sample_k (prompts repeated)"

    def build_train(self):
        import jax

        from replax.rl import objectives
        from replax.rl import train_step as train_step_lib

        self.state, state_shardings = train_step_lib.init_train_state(
            self.model, optimizer(), jax.random.key(0), self.mesh, self.rules
        )
        self.batch = self._train_batch()
        batch_sharding = train_step_lib.batch_shardings(self.mesh, self.rules, self.batch)
        self.batch = jax.device_put(self.batch, batch_sharding)
        self.step = train_step_lib.make_train_step(
            self.model,
            optimizer(),
            objectives.LossConfig(name="ppo", aggregation="sequence_mean"),
            self.mesh,
            self.rules,
            state_shardings,
            batch_sharding,
        )

    def _train_batch(self):
        import numpy as np

        s = self.shape
        tokens = train_tokens(s, seed=1)
        completion = np.arange(s.seq_len)[None, :] >= s.prompt_len  # [1, L]
        loss_mask = np.broadcast_to(completion, tokens.shape).astype(np.float32)
        b = s.train_batch
        return {
            "tokens": tokens,
            "attention_mask": np.ones(tokens.shape, bool),
            "loss_mask": loss_mask,
            # About the uniform policy's log-prob: ratios near 1, as on fresh rollouts.
            "behaviour_logprobs": loss_mask * -np.log(s.vocab).astype(np.float32),
            "advantage": group_advantages(s, seed=2),
            "reward": np.zeros(b, np.float32),
            "baseline": np.zeros(b, np.float32),
            "importance_weights": np.ones(b, np.float32),
            "age": np.zeros(b, np.int32),
            "times_sampled": np.zeros(b, np.int32),
        }

    def rollout(self, seed: int) -> int:
        """Generates prompts x G completions; returns the number of tokens generated."""
        import jax
        import numpy as np

        if self.state is None:
            self.build_train()
        prompts = random_prompts(self.shape, seed)
        mask = np.ones(prompts.shape, bool)
        rng = jax.random.key(seed)
        if self.shared_prefill:
            out = self.sampler.generate(
                self.state.params, prompts, mask, rng, num_samples=self.shape.group
            )
        else:
            out = self.sampler.sample_k(self.state.params, prompts, mask, rng, self.shape.group)
        return int(np.asarray(out.lengths).sum())

    def train_step(self) -> None:
        if self.step is None:
            self.build_train()
        self.state, metrics = self.step(self.state, self.batch)
        return metrics["loss"]


# TUNIX


class _IdTokenizer:
    """Ids written as decimal text: Tunix's sampler takes and returns strings."""

    def encode(self, text, **kwargs):
        return [int(t) for t in text.split()]

    def decode(self, ids, **kwargs):
        return ""

    def bos_id(self):
        return None

    def eos_id(self):
        return self._eos

    def pad_id(self):
        return PAD_ID

    def __init__(self, eos_id: int):
        self._eos = eos_id


class Tunix:
    """Tunix's Llama3 model, vanilla sampler and GRPO train step at `shape`."""

    def __init__(self, shape: Shape):
        from flax import nnx
        from tunix.generate import sampler as sampler_lib
        from tunix.models.llama3 import model as llama3

        self.shape = shape
        config = llama3.ModelConfig(
            num_layers=shape.layers,
            vocab_size=shape.vocab,
            embed_dim=shape.d_model,
            hidden_dim=shape.mlp,
            num_heads=shape.heads,
            head_dim=shape.head_dim,
            num_kv_heads=shape.kv_heads,
            rope_theta=10_000,
            norm_eps=1e-6,
            weight_tying=True,
        )
        self.model = llama3.Llama3(config, rngs=nnx.Rngs(0))
        self.sampler = sampler_lib.Sampler(
            self.model,
            _IdTokenizer(shape.stop_id),
            sampler_lib.CacheConfig(
                cache_size=shape.seq_len,
                num_layers=shape.layers,
                num_kv_heads=shape.kv_heads,
                head_dim=shape.head_dim,
            ),
        )
        self.step = None

    def build_train(self):
        import jax.numpy as jnp
        from tunix.rl import algo_core, common
        from tunix.rl import trainer as rl_trainer
        from tunix.rl.grpo import grpo_learner
        from tunix.sft import peft_trainer

        s = self.shape
        algo_config = grpo_learner.GRPOConfig(num_generations=s.group, beta=0.0, epsilon=0.2)
        algo_config.temperature = 1.0
        trainer = rl_trainer.Trainer(
            self.model,
            optimizer(),
            peft_trainer.TrainingConfig(eval_every_n_steps=10**9),
            custom_checkpoint_metadata_fn=lambda: {},
        )
        # As GRPOLearner.__init__ binds it.
        trainer.with_loss_fn(
            lambda model, train_example, algo_config: algo_core.grpo_loss_fn(
                model, train_example, algo_config=algo_config, pad_id=PAD_ID, eos_id=s.stop_id
            ),
            has_aux=True,
        )
        trainer.with_gen_model_input_fn(lambda x: {"train_example": x, "algo_config": algo_config})
        self.step, _ = trainer.jit_train_and_eval_step()
        tokens = train_tokens(s, seed=1)
        completion = jnp.asarray(tokens[:, s.prompt_len :])
        self.example = grpo_learner.TrainExample(
            prompt_ids=jnp.asarray(tokens[:, : s.prompt_len]),
            prompt_mask=jnp.ones((s.train_batch, s.prompt_len), jnp.int32),
            completion_ids=completion,
            completion_mask=common.make_completion_mask(completion, eos_tok=s.stop_id),
            advantages=jnp.asarray(group_advantages(s, seed=2)),
            ref_per_token_logps=None,
            old_per_token_logps=None,
        )

    def rollout(self, seed: int) -> int:
        s = self.shape
        prompts = [" ".join(map(str, row)) for row in random_prompts(s, seed)]
        repeated = [p for p in prompts for _ in range(s.group)]
        out = self.sampler(
            repeated,
            max_generation_steps=s.new_tokens,
            max_prompt_length=s.prompt_len,
            echo=False,
            eos_tokens=[s.stop_id],
            forbidden_tokens=[s.stop_id],
            temperature=1.0,
            top_p=1.0,
            seed=seed,
        )
        return sum(len(t) for t in out.tokens)

    def train_step(self):
        if self.step is None:
            self.build_train()
        loss, _, grad_norm = self.step(self.example)
        return loss, grad_norm


# MEASUREMENT


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
    text = json.dumps(result, indent=2)
    print(text)
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    app.run(main)
