"""The train step: tokens/s and MFU of the PPO step on the reference model, each step
paired with the machine probes around it."""

import statistics
import time

from benchmarks.common import (
    _MACHINE_SAMPLES,
    _machine_probe,
    machine_numbers,
    reference_model_config,
)
from benchmarks.replay import ITEM_LEN

TRAIN_BATCH = 64
TRAIN_PROMPT_LEN = 16


def train_batch(config, params, rng):
    """A realistic batch of 64 rollouts: prompts of 8-16 tokens (left-padded), completions
    of 16-144 tokens ending in EOS (padded after), behaviour log-probs = the policy's own
    plus noise (so some ratios clip), GRPO advantages over groups of 8."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from replax.model import logprobs as logprobs_lib
    from replax.model import transformer as model_lib
    from replax.rl import objectives

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
    current = np.asarray(logprobs_lib.token_logprobs(logits, tokens))
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


def reference_train_step():
    """(step, state, batch, config): the jitted PPO train step of the reference model (AdamW,
    global-norm clipping, state donated), its fresh state and a realistic batch, placed."""
    import dataclasses

    import jax
    import numpy as np

    from replax.core import sharding
    from replax.model import transformer as model_lib
    from replax.rl import objectives
    from replax.rl import train_step as train_step_lib

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
    return step, state, batch, config


def bench_train(repeats: int) -> dict:
    import jax
    import numpy as np

    from replax.model import flops as flops_lib

    probe = _machine_probe()
    step, state, batch, config = reference_train_step()
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
