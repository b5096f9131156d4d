"""The covariance options' cost: the plain train step against the same step with a
covariance option on, on configs/smollm2.py's shape (a SmolLM2-135M-shaped model, random
init: only the shape matters for time), its batch, microbatches, log-prob chunks and
float32, one CPU device. The two steps are compiled first, then timed alternately (plain,
option, plain, option, ...), each the median of its repeats, so that both see the same
load. Also each step's FLOPs by XLA's own cost analysis and by `flops.train_flops` with
the passes the step runs."""

import os
import statistics
import time

# configs/smollm2.py's study variant, and what the covariance step adds to it.
CONFIG_ARG = "replay"
OPTIONS = {"kl_cov": {"kl_cov_frac": 0.002}}


def smollm2_spec():
    """The checked RunSpec of configs/smollm2.py, its model randomly initialised."""
    from replax.config import spec as spec_lib
    from replax.core.config_utils import load_module

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config = load_module(os.path.join(root, "configs", "smollm2.py")).get_config(CONFIG_ARG)
    config.model.init, config.model.checkpoint = "random", ""
    return spec_lib.parse(config)


def rollout_batch(spec, rng):
    """A batch of train.batch_size rollouts shaped as the config's: prompts of 57-74 tokens
    left-padded to max_prompt_len, completions of 20-max_new_tokens tokens, behaviour
    log-probs near a random policy's (-log V) with noise, GRPO advantages."""
    import jax.numpy as jnp
    import numpy as np

    from replax.rl import objectives

    b, p = spec.train.batch_size, spec.rollout.max_prompt_len
    length, vocab = spec.seq_len, spec.model.architecture["vocab_size"]
    prompt_len = rng.integers(57, 75, b)
    completion_len = rng.integers(20, spec.rollout.max_new_tokens + 1, b)
    column = np.arange(length)[None, :]
    prompt_valid = (column < p) & (column >= p - prompt_len[:, None])
    completion_valid = (column >= p) & (column < p + completion_len[:, None])
    attention_mask = prompt_valid | completion_valid
    tokens = np.where(attention_mask, rng.integers(2, vocab, (b, length)), 0)
    loss_mask = completion_valid.astype(np.float32)
    behaviour = (-np.log(vocab) + 0.3 * rng.standard_normal((b, length))) * loss_mask
    rewards = jnp.asarray(rng.random(b) < 0.3, jnp.float32)
    advantage, baseline = objectives.group_advantages(rewards, spec.rollout.group_size)
    return {
        "tokens": jnp.asarray(tokens, jnp.int32),
        "attention_mask": jnp.asarray(attention_mask),
        "loss_mask": jnp.asarray(loss_mask),
        "behaviour_logprobs": jnp.asarray(behaviour, jnp.float32),
        "advantage": advantage,
        "reward": rewards,
        "baseline": baseline,
        "importance_weights": jnp.ones(b, jnp.float32),
        "age": jnp.asarray(rng.integers(0, 8, b), jnp.int32),
        "times_sampled": jnp.asarray(rng.integers(0, 4, b), jnp.int32),
    }


def _steps(spec, loss_configs):
    """{name: (compiled step, state)} of each loss config, and the placed batch."""
    import jax
    import numpy as np

    from replax.core import sharding
    from replax.model import transformer as model_lib
    from replax.rl import train_step as train_step_lib

    model = model_lib.Transformer(spec.model.config())
    mesh = sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])
    rules = sharding.validate_rules(sharding.DEFAULT_RULES)
    optimizer = train_step_lib.make_optimizer(spec.optimizer)
    batch = rollout_batch(spec, np.random.default_rng(0))
    batch_sharding = train_step_lib.batch_shardings(mesh, rules, batch)
    batch = jax.device_put(batch, batch_sharding)
    out = {}
    for name, loss_config in loss_configs.items():
        state, state_shardings = train_step_lib.init_train_state(
            model, optimizer, jax.random.key(0), mesh, rules
        )
        step = train_step_lib.make_train_step(
            model,
            optimizer,
            loss_config,
            mesh,
            rules,
            state_shardings,
            batch_sharding,
            temperature=spec.rollout.temperature,
            num_microbatches=spec.train.num_microbatches,
            logits_chunk_size=spec.train.logits_chunk_size,
            grad_clip=spec.optimizer.grad_clip,
        )
        with sharding.activation_rules(mesh, rules):
            compiled = step.jitted.lower(state, batch).compile()
        out[name] = (step, state, compiled.cost_analysis().get("flops"))
    return out, batch


def bench_covariance(repeats: int) -> dict:
    import dataclasses

    import jax

    from replax.model import flops as flops_lib

    spec = smollm2_spec()
    plain = spec.loss
    configs = {"plain": plain}
    configs.update({k: dataclasses.replace(plain, **v) for k, v in OPTIONS.items()})
    start = time.perf_counter()
    steps, batch = _steps(spec, configs)
    compile_s = time.perf_counter() - start
    states = {name: state for name, (_, state, _) in steps.items()}
    for name, (step, _, _) in steps.items():  # warm-up
        states[name], _ = jax.block_until_ready(step(states[name], batch))
    seconds = {name: [] for name in steps}
    cpu_seconds = {name: [] for name in steps}
    passes = {}
    for _ in range(repeats):
        for name, (step, _, _) in steps.items():
            begin, cpu_begin = time.perf_counter(), time.process_time()
            states[name], metrics = jax.block_until_ready(step(states[name], batch))
            seconds[name].append(time.perf_counter() - begin)
            cpu_seconds[name].append(time.process_time() - cpu_begin)
            passes[name] = flops_lib.TrainPasses(
                forward=float(metrics["forward_passes"]),
                backward=float(metrics["backward_passes"]),
            )
    b, length = spec.train.batch_size, spec.seq_len
    out = {
        "covariance_config": f"configs/smollm2.py:{CONFIG_ARG}",
        "covariance_batch": [b, length],
        "covariance_num_microbatches": spec.train.num_microbatches,
        "covariance_compile_s": compile_s,
    }
    for name, (_, _, xla_flops) in steps.items():
        out[f"covariance_{name}_step_s"] = statistics.median(seconds[name])
        out[f"covariance_{name}_step_seconds"] = seconds[name]
        out[f"covariance_{name}_cpu_s"] = statistics.median(cpu_seconds[name])
        # XLA counts a loop's body once (4 microbatches, log-prob chunks): a lower bound.
        out[f"covariance_{name}_xla_flops"] = xla_flops
        out[f"covariance_{name}_train_passes"] = dataclasses.asdict(passes[name])
        out[f"covariance_{name}_train_flops"] = flops_lib.train_flops(
            spec.model.config(), b, length, passes[name]
        )
    for name in OPTIONS:
        for what in ("step_s", "cpu_s", "train_flops"):
            out[f"covariance_{name}_{what}_ratio"] = (
                out[f"covariance_{name}_{what}"] / out[f"covariance_plain_{what}"]
            )
    return out
