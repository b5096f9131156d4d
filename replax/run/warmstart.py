"""Supervised warm start: teacher forcing on demonstrations until the policy solves a
target fraction of held-out prompts.

Below ~10% base accuracy nearly every group of rollouts has zero advantage and RL
stalls; above ~40% there is little left for RL to show. A tiny model's accuracy jumps
sharply after a seed-dependent number of SFT steps, so the stage stops on measured
accuracy, not on a step count: it evaluates often, stops inside [min, max], and if one
interval overshoots it goes back to the last parameters below the window and continues
at a lower learning rate. The result is cached (orbax) and reused by later runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from etils import epath

from replax.config import sections
from replax.config.sections import WarmStartConfig
from replax.core import processes, sharding
from replax.model import logprobs as logprobs_lib
from replax.model import lora
from replax.model import transformer as model_lib
from replax.rl import train_step as train_step_lib
from replax.run import runtime
from replax.text import tokenizer as tokenizer_lib


def demonstration_batch(tokenizer, examples, max_prompt_len: int, max_new_tokens: int):
    """Prompt (left-padded) + answer + EOS (right-padded), in the rollout layout.

    Returns tokens int32[B, P+N], attention_mask bool[B, P+N], loss_mask f32[B, P+N].
    """
    prompt_ids, prompt_mask = tokenizer_lib.encode_prompts(
        tokenizer, [e.prompt for e in examples], max_prompt_len
    )
    completion = np.full((len(examples), max_new_tokens), tokenizer.pad_id, np.int32)
    completion_mask = np.zeros((len(examples), max_new_tokens), bool)
    for i, e in enumerate(examples):
        ids = tokenizer.encode(e.answer) + [tokenizer.eos_id]
        if len(ids) > max_new_tokens:
            raise ValueError(
                f"answer {e.answer!r} needs {len(ids)} tokens with EOS, more than "
                f"rollout.max_new_tokens={max_new_tokens}"
            )
        completion[i, : len(ids)] = ids
        completion_mask[i, : len(ids)] = True
    tokens = np.concatenate([prompt_ids, completion], axis=1)
    attention = np.concatenate([prompt_mask, completion_mask], axis=1)
    loss_mask = np.concatenate([np.zeros_like(prompt_mask), completion_mask], axis=1)
    return {
        "tokens": tokens,
        "attention_mask": attention,
        "loss_mask": loss_mask.astype(np.float32),
    }


def make_sft_step(model, optimizer, mesh, rules, state_shardings):
    def loss_fn(params, batch):
        positions = model_lib.positions_from_mask(batch["attention_mask"])
        logits = model.apply(
            {"params": params}, batch["tokens"], positions, batch["attention_mask"]
        )
        logprobs = logprobs_lib.token_logprobs(logits, batch["tokens"])
        mask = batch["loss_mask"]
        return -jnp.sum(logprobs * mask) / jnp.maximum(jnp.sum(mask), 1.0)

    def step(state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), loss

    batch_sharding = sharding.named(mesh, ("batch", None), rules)
    return sharding.jit_state_step(step, mesh, rules, state_shardings, batch_sharding)


def cache_key(**parts) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def warm_start(
    *,
    model,
    config: WarmStartConfig,
    tokenizer,
    task,
    evaluator,
    seed: int,
    max_prompt_len: int,
    max_new_tokens: int,
    mesh,
    rules,
    cache_dir: str,
    key: str,
    log=print,
    skip_long_prompts: bool = False,
    stop=None,
):
    """Returns (params, info) with info = {'base_accuracy', 'sft_steps', 'cached', ...};
    `log` gets a warning line when the base ends outside [min_accuracy, max_accuracy].

    stop (a runtime.StopRequest): polled between SFT steps; once requested (on any
    process), raises runtime.Preempted, caching nothing.

    skip_long_prompts (task.long_prompts='skip'): demonstrations whose prompt is longer
    than max_prompt_len are left out of the pool, as the RL data leaves them out.

    With several processes every process trains (on the same batches) and takes part in
    saving and restoring; process 0 decides whether the cache is there and writes info."""
    path = epath.Path(cache_dir) / key
    if "://" not in str(cache_dir):
        path = path.absolute()
    info_path = path / "info.json"
    optimizer = optax.adam(config.learning_rate)
    rng = jax.random.key(seed)
    state, shardings = train_step_lib.init_train_state(model, optimizer, rng, mesh, rules)
    checkpointer = ocp.StandardCheckpointer()
    if processes.from_process_zero(np.int32(info_path.exists())):
        info = json.loads(info_path.read_text())
        params = checkpointer.restore(path / "params", sharding.abstract_like(state.params))
        log(f"warm start: reusing {path} (base accuracy {info['base_accuracy']:.3f})")
        if (warning := outside_window_line(config, info)) is not None:
            log(warning)
        return params, {**info, "cached": True}

    t0 = time.time()
    sft_step = make_sft_step(model, optimizer, mesh, rules, shardings)
    data_rng = np.random.default_rng(seed)
    pool = task.examples("train", config.num_examples, seed=seed)
    if skip_long_prompts:
        lengths = tokenizer_lib.prompt_lengths(tokenizer, [e.prompt for e in pool])
        pool = [e for e, n in zip(pool, lengths) if n <= max_prompt_len]
    lr_scale, eval_every = 1.0, config.eval_every
    below = (_copy(state.params), 0.0)  # last parameters below the window
    accuracy, steps = 0.0, 0
    while steps < config.max_steps:
        for _ in range(eval_every):
            if stop is not None and processes.any_process(stop.requested):
                name = stop.signal_name or "a stop request"
                log(f"warm start: stopped by {name} after SFT step {steps}; nothing cached")
                raise runtime.Preempted(
                    name,
                    steps,
                    f"stopped by {name} during the warm start (after SFT step {steps} of at "
                    f"most {config.max_steps}); no base was cached: run the same command to "
                    "start the warm start again",
                )
            idx = data_rng.integers(0, len(pool), config.batch_size)
            batch = demonstration_batch(
                tokenizer, [pool[i] for i in idx], max_prompt_len, max_new_tokens
            )
            state, loss = sft_step(state, sharding.shard_batch(batch, mesh, rules))
            steps += 1
        accuracy = evaluator.accuracy(state.params, jax.random.key(seed))
        log(f"warm start: step {steps} loss {float(loss):.3f} held-out accuracy {accuracy:.3f}")
        if config.min_accuracy <= accuracy <= config.max_accuracy:
            break
        if accuracy > config.max_accuracy:
            # Overshot the window in one interval: go back and take smaller steps.
            params, accuracy = below
            lr_scale, eval_every = lr_scale / 2, max(eval_every // 2, 5)
            state, shardings = train_step_lib.init_train_state(
                model,
                optax.adam(config.learning_rate * lr_scale),
                rng,
                mesh,
                rules,
                params=params,
            )
            sft_step = make_sft_step(
                model, optax.adam(config.learning_rate * lr_scale), mesh, rules, shardings
            )
        else:
            below = (_copy(state.params), accuracy)
    info = {
        "base_accuracy": accuracy,
        "sft_steps": steps,
        "sft_s": time.time() - t0,
        "in_window": bool(config.min_accuracy <= accuracy <= config.max_accuracy),
    }
    checkpointer.save(path / "params", state.params, force=True)
    checkpointer.wait_until_finished()
    if jax.process_index() == 0:
        info_path.write_text(json.dumps(info))
    if (warning := outside_window_line(config, info)) is not None:
        log(warning)
    return state.params, {**info, "cached": False}


def for_run(run, data, log, stop=None):
    """The warm-started base of a run (`replax.run.assemble.Run`) with its data
    (`assemble.Data`: the held-out evaluator), from the cache when a run of the same base
    made it."""
    c = run.spec
    # What the base depends on (not where it or the data are stored).
    # The warm start trains the whole base; LoRA's adapters start on it afterwards, so the
    # LoRA keys are neither in its model nor in its cache key.
    base_config = lora.base_config(run.model_config)
    key = cache_key(
        model={
            k: v for k, v in dataclasses.asdict(base_config).items() if k not in sections.LORA_KEYS
        },
        # long_prompts='error' leaves the pool as it was: bases cached before the setting
        # existed stay valid.
        task={
            k: v
            for k, v in c.task.to_dict().items()
            if k != "data_dir" and (k, v) != ("long_prompts", "error")
        },
        warmstart=c.warmstart.cache_fields(),
        seed=c.seed,
        rollout=(c.rollout.max_prompt_len, c.rollout.max_new_tokens),
    )
    params, info = warm_start(
        model=model_lib.Transformer(base_config),
        config=c.warmstart.config(num_train=c.task.num_train),
        tokenizer=run.tokenizer,
        task=run.task,
        evaluator=data.evaluator,
        seed=c.seed,
        max_prompt_len=c.rollout.max_prompt_len,
        max_new_tokens=c.rollout.max_new_tokens,
        mesh=run.mesh,
        rules=run.rules,
        cache_dir=c.warmstart.cache_dir or os.path.join(run.workdir, "base"),
        key=key,
        log=log,
        skip_long_prompts=c.task.long_prompts == "skip",
        stop=stop,
    )
    log(
        f"warm start: base accuracy {info['base_accuracy']:.3f} after {info['sft_steps']} SFT steps"
    )
    return params


def outside_window_line(config: WarmStartConfig, info) -> str | None:
    """A warning when the base's accuracy is outside the window (None inside): the window,
    the accuracy reached and the settings that would reach it."""
    accuracy, steps = info["base_accuracy"], info["sft_steps"]
    low, high = config.min_accuracy, config.max_accuracy
    if low <= accuracy <= high:
        return None
    if accuracy < low:
        change = (
            f"raise warmstart.max_steps (now {config.max_steps}) or warmstart.learning_rate "
            f"(now {config.learning_rate:g}), or lower warmstart.min_accuracy"
        )
    else:
        change = (
            f"lower warmstart.learning_rate (now {config.learning_rate:g}) or "
            "warmstart.eval_every, or raise warmstart.max_accuracy"
        )
    return (
        f"warning: the warm start ended outside its accuracy window [{low:g}, {high:g}]: "
        f"held-out accuracy {accuracy:.3f} after {steps} SFT steps; RL goes on from this "
        f"base. To reach the window, {change} (a changed warmstart.* setting trains a new "
        "base)"
    )


def _copy(params):
    """A copy on the devices that outlives the state it came from (the SFT step donates
    it); a host copy would not hold the parts other processes' devices have."""
    return jax.tree.map(jnp.copy, params)
