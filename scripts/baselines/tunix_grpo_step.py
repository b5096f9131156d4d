"""Tunix GRPO training-step throughput on the replax benchmark reference model.

Baseline venv (kept apart from the project's .venv; CPU jax):
    python3 -m venv "$BASELINE_VENV"  # any directory
    "$BASELINE_VENV"/bin/pip install google-tunix==0.1.7 flashbax==0.1.3 \
        jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 optax==0.2.8
Run:
    "$BASELINE_VENV"/bin/python scripts/baselines/tunix_grpo_step.py [--steps=7]

Model: tunix Llama3 at the reference shape (see tunix_sampler.py), fp32.
Timed: the jitted train step of Tunix's actor trainer, built the way RLCluster
and GRPOLearner build it: `tunix.rl.trainer.Trainer` (a PeftTrainer) with
optax.adamw, `with_loss_fn` = `tunix.rl.algo_core.grpo_loss_fn` (the registered
"grpo" policy loss, wrapped exactly as GRPOLearner wraps it) and
`jit_train_and_eval_step(cache_nnx_graph=True)`, i.e. nnx.jit(_train_step,
donate optimizer): forward over prompt+completion, per-token logps, clipped
ratio loss, entropy, nnx.value_and_grad, grad global norm, optimizer update.
Batch: 64 sequences x (16 prompt + 144 completion) = 160 tokens, all unmasked,
one TrainExample with advantages and old per-token logps (beta=0 by default, so
no KL term; --beta=0.04 adds Tunix's default KL against given ref logps).
Not timed: rollout, reward, advantage, reference/old-logp forward passes and
the Python train loop around the step (metrics, checkpoint hooks).
train tokens/s = 64*160 / median step seconds, after 2 warm-up steps,
blocking on loss and grad norm; the median process CPU seconds per step is
printed too (less sensitive to other load on the machine). Prints one JSON line.
"""

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tunix.rl import algo_core, common
from tunix.rl import trainer as rl_trainer
from tunix.rl.grpo import grpo_learner
from tunix.sft import peft_trainer
from tunix_sampler import EOS, PAD, VOCAB, make_model

B, PROMPT, COMPLETION = 64, 16, 144


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--beta", type=float, default=0.0)
    args = ap.parse_args()
    load0 = os.getloadavg()

    model = make_model()
    trainer = rl_trainer.Trainer(
        model=model,
        optimizer=optax.adamw(1e-6),
        training_config=peft_trainer.TrainingConfig(eval_every_n_steps=10**9),
        custom_checkpoint_metadata_fn=lambda: {"global_step": 1, "role": "actor"},
    )
    algo_config = grpo_learner.GRPOConfig(num_generations=8, beta=args.beta)
    algo_config.temperature = 1.0  # GRPOLearner copies the rollout temperature
    # Same wrapping as GRPOLearner.__init__.
    trainer.with_loss_fn(
        lambda model, train_example, algo_config: algo_core.grpo_loss_fn(
            model, train_example, algo_config=algo_config, pad_id=PAD, eos_id=EOS
        ),
        has_aux=True,
    )
    trainer.with_gen_model_input_fn(lambda x: {"train_example": x, "algo_config": algo_config})
    train_step, _ = trainer.jit_train_and_eval_step(cache_nnx_graph=True)

    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(0, VOCAB, (B, PROMPT)), jnp.int32)
    completion = jnp.asarray(rng.integers(0, VOCAB, (B, COMPLETION)), jnp.int32)
    # Old/ref logps from Tunix's own (untimed) logp pass, so ratios start at 1.
    logps = common.compute_per_token_logps(
        *nnx.split(model), prompt, completion, pad_id=PAD, eos_id=EOS
    )
    example = common.TrainExample(
        prompt_ids=prompt,
        prompt_mask=jnp.ones((B, PROMPT), bool),
        completion_ids=completion,
        completion_mask=jnp.ones((B, COMPLETION), jnp.int32),
        advantages=jnp.asarray(rng.standard_normal(B), jnp.float32),
        ref_per_token_logps=logps if args.beta else None,
        old_per_token_logps=logps,
    )

    def step():
        loss, aux, gnorm = train_step(example)
        jax.block_until_ready((loss, gnorm))
        return float(loss)

    t0 = time.perf_counter()
    first_loss = step()
    compile_s = time.perf_counter() - t0
    step()
    times, cpu = [], []
    for _ in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        last_loss = step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    med = statistics.median(times)
    print(
        json.dumps(
            {
                "tunix_grpo_train_tokens_per_s": B * (PROMPT + COMPLETION) / med,
                "step_s_median": med,
                "step_s_all": [round(t, 4) for t in times],
                "step_cpu_s_median": statistics.median(cpu),
                "first_step_s_incl_compile": compile_s,
                "train_step_compiles": train_step.func.jitted_fn._cache_size(),
                "batch": B,
                "prompt_len": PROMPT,
                "completion_len": COMPLETION,
                "beta": args.beta,
                "loss_agg_mode": algo_config.loss_agg_mode,
                "optimizer": "optax.adamw(1e-6)",
                "loss_first_last": [first_loss, last_loss],
                "model": "tunix.models.llama3 Llama3 (weight_tying=True)",
                "jax": jax.__version__,
                "backend": jax.default_backend(),
                "load_avg_start": load0,
                "load_avg_end": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
