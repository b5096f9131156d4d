"""The RL loop: generate -> score -> add -> sample -> step.

Each step generates R = prompts_per_step x group_size fresh rollouts with the KV-cache
sampler, scores them on the host (the only host round trip: completions out, rewards
in), freezes their group advantages and behaviour log-probs, adds them to the replay
store, samples a batch of B, and takes one optimizer step. On-policy training is the
special case N = B = R. Only this module and the scripts read the ConfigDict.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tensorflow_datasets as tfds

from replax import auto_replay, evaluation, objectives, sharding
from replax import checkpoint as checkpoint_lib
from replax import config_utils as cu
from replax import data as data_lib
from replax import metrics as metrics_lib
from replax import model as model_lib
from replax import replay as replay_lib
from replax import sampler as sampler_lib
from replax import train_step as train_step_lib
from replax import warmstart as warmstart_lib
from replax.tasks import arith
from replax.tokenizer import ByteTokenizer

TASKS = ("arith",)


def validate(config: ml_collections.ConfigDict) -> None:
    """Every check that can fail on configuration alone, before any compute."""
    cu.one_of(config, "task.name", TASKS)
    for key in (
        "total_steps",
        "rollout.prompts_per_step",
        "rollout.group_size",
        "train.batch_size",
        "replay.capacity",
        "eval.num_prompts",
        "rollout.max_prompt_len",
        "rollout.max_new_tokens",
    ):
        cu.positive(config, key)
    cu.positive(config, "eval.every", allow_zero=True)
    if "total_rollouts" in config:
        cu.positive(config, "total_rollouts", allow_zero=True)
    cu.positive(config, "checkpoint_every")
    r = config.rollout.prompts_per_step * config.rollout.group_size
    cu.require(config.train.batch_size / r > 0, "train.batch_size / R: replay ratio must be > 0")
    cu.require(
        config.replay.capacity >= config.train.batch_size,
        f"replay.capacity={config.replay.capacity} is smaller than train.batch_size="
        f"{config.train.batch_size}: capacity must be >= the batch",
    )
    cu.require(
        not (config.rollout.group_size == 1 and config.loss.normalize_std),
        "rollout.group_size=1 with loss.normalize_std=True: group-normalised advantages "
        "need group_size >= 2",
    )
    cu.one_of(config, "replay.strategy", replay_lib.STRATEGIES)
    cu.one_of(config, "replay.sample_mode", replay_lib.SAMPLE_MODES)
    cu.one_of(config, "replay.mode", ("fixed", "auto"))
    if config.replay.mode == "auto":
        cu.require(
            config.train.batch_size % 2 == 0,
            f"train.batch_size={config.train.batch_size} with replay.mode='auto': the batch "
            "splits into two halves, so it must be even",
        )
        cu.positive(config, "replay.auto_every")
        if "auto_design" in config.replay:
            cu.one_of(config, "replay.auto_design", tuple(auto_replay.DESIGNS))
        if "auto_max_y" in config.replay:
            cu.require(
                config.replay.auto_max_y * r >= config.train.batch_size,
                f"replay.auto_max_y={config.replay.auto_max_y} is below B / R = "
                f"{config.train.batch_size / r:g}, the replay ratio of generating every step: "
                "it must be >= B / R",
            )
    cu.one_of(config, "loss.name", objectives.LOSSES)
    cu.one_of(config, "loss.aggregation", objectives.AGGREGATIONS)
    cu.one_of(config, "model.dtype", tuple(model_lib.DTYPES))
    cu.one_of(config, "model.param_dtype", tuple(model_lib.DTYPES))
    if config.task.data_dir:
        cu.require(
            os.path.isdir(config.task.data_dir),
            f"task.data_dir={config.task.data_dir!r} does not exist",
        )
    total_len = config.rollout.max_prompt_len + config.rollout.max_new_tokens
    cu.require(
        total_len <= config.model.max_len,
        f"rollout.max_prompt_len + rollout.max_new_tokens = {total_len} exceeds "
        f"model.max_len={config.model.max_len}",
    )
    # Prompts and answers must fit: prompts are never truncated.
    try:
        difficulty = _arith_difficulty(config)
    except ValueError as e:
        raise cu.ConfigError(f"task: {str(e).splitlines()[0]}") from None
    prompt_tokens = difficulty.max_prompt_chars() + 1  # + BOS
    cu.require(
        prompt_tokens <= config.rollout.max_prompt_len,
        f"rollout.max_prompt_len={config.rollout.max_prompt_len} is shorter than the task's "
        f"longest prompt ({prompt_tokens} tokens with BOS)",
    )
    answer_tokens = _max_answer_chars(difficulty) + 1  # + EOS
    cu.require(
        answer_tokens <= config.rollout.max_new_tokens,
        f"rollout.max_new_tokens={config.rollout.max_new_tokens} is shorter than the task's "
        f"longest answer ({answer_tokens} tokens with EOS)",
    )
    # Library-level validation, re-raised as one-line config errors.
    try:
        model_config(config)
        loss_config(config)
        _arith_difficulty(config)
        optimizer_config(config)
        rules = sharding.validate_rules(config.mesh.rules)
        mesh_shape = sharding.validate_mesh_shape(config.mesh.shape, jax.device_count())
    except ValueError as e:
        raise cu.ConfigError(str(e).splitlines()[0]) from None
    shards = int(np.prod([mesh_shape[sharding.MESH_AXES.index(a)] for a in ("data", "fsdp")]))
    del rules
    # The pass@k evaluation samples pass_k completions of its first pass_k_prompts prompts.
    pass_k_rows = min(config.eval.pass_k_prompts, config.eval.num_prompts) * config.eval.pass_k
    for key, value in (
        ("rollout R = prompts_per_step x group_size", r),
        ("train.batch_size", config.train.batch_size),
        ("replay.capacity", config.replay.capacity),
        ("eval.num_prompts", config.eval.num_prompts),
        ("eval.pass_k_prompts x eval.pass_k (rows sampled for pass@k)", pass_k_rows),
    ):
        cu.require(
            value % shards == 0,
            f"{key}={value} is not divisible by the {shards} data shards of mesh.shape="
            f"{tuple(config.mesh.shape)}",
        )


def model_config(config) -> model_lib.ModelConfig:
    return model_lib.ModelConfig(**config.model.to_dict())


def loss_config(config) -> objectives.LossConfig:
    c = config.loss
    return objectives.LossConfig(
        name=c.name,
        epsilon_low=c.epsilon_low,
        epsilon_high=c.epsilon_high,
        dual_clip=c.dual_clip or None,
        rho_max=c.rho_max,
        delta_v=c.asymre_delta_v,
        m2po_tau=c.m2po_tau,
        kl_coef=c.kl_coef,
        entropy_coef=c.entropy_coef,
        aggregation=c.aggregation,
    )


def optimizer_config(config) -> train_step_lib.OptimizerConfig:
    c = config.optimizer
    return train_step_lib.OptimizerConfig(
        learning_rate=c.learning_rate,
        schedule=c.schedule,
        warmup_steps=c.warmup_steps,
        total_steps=config.total_steps,
        weight_decay=c.weight_decay,
        grad_clip=c.grad_clip,
        b1=c.b1,
        b2=c.b2,
    )


def _max_answer_chars(d: arith.ArithDifficulty) -> int:
    """An upper bound on the length of an answer of this difficulty."""
    largest = 10**d.max_digits - 1
    if "*" in d.ops:
        largest = max(largest, d.max_mul_operand) * d.max_mul_operand ** (d.max_terms - 1)
    bound = d.max_terms * largest
    return len(str(bound)) + ("-" in d.ops)


def _arith_difficulty(config) -> arith.ArithDifficulty:
    t = config.task
    return arith.ArithDifficulty(
        name="rl",
        min_terms=t.min_terms,
        max_terms=t.max_terms,
        min_digits=t.min_digits,
        max_digits=t.max_digits,
        ops=t.ops,
        max_mul_operand=t.max_mul_operand,
    )


def make_ingest(
    buffer: replay_lib.ReplayBuffer,
    *,
    group_size: int,
    batch_size: int,
    normalize_std: bool,
    drop_zero_advantage: bool,
):
    """The jitted device half of a step after scoring: freeze advantages, build rollout
    items, add them to the store (donated), and sample the training batch."""

    def ingest(
        replay_state, prompt_ids, prompt_mask, completion, rewards, step, rng, generate, max_age
    ):
        """generate (bool[]) and max_age (int32[]) are None except in auto replay, where a
        step without generation stores nothing and the staleness limit moves."""
        # ROLLOUT ITEMS: prompt (left-padded) + completion, log-probs aligned to tokens.
        zeros = jnp.zeros(prompt_ids.shape, jnp.float32)
        completion_mask = completion["mask"]
        advantage, baseline = objectives.group_advantages(
            rewards, group_size, normalize_std=normalize_std
        )
        items = {
            "tokens": jnp.concatenate([prompt_ids, completion["tokens"]], axis=1),
            "attention_mask": jnp.concatenate([prompt_mask, completion_mask], axis=1),
            "loss_mask": jnp.concatenate([zeros, completion_mask.astype(jnp.float32)], axis=1),
            "behaviour_logprobs": jnp.concatenate(
                [zeros, jnp.where(completion_mask, completion["logprobs"], 0.0)], axis=1
            ),
            "reward": rewards,
            "advantage": advantage,
            "baseline": baseline,
            "group_id": step * (rewards.shape[0] // group_size)
            + jnp.arange(rewards.shape[0], dtype=jnp.int32) // group_size,
            "policy_version": jnp.full(rewards.shape, step, jnp.int32),
        }
        keep = None
        if drop_zero_advantage:
            spread = jnp.ptp(rewards.reshape(-1, group_size), axis=1) > 0
            keep = jnp.repeat(spread, group_size)
        if generate is not None:
            keep = jnp.broadcast_to(generate, rewards.shape) & (True if keep is None else keep)
        # ADD, THEN SAMPLE THE TRAINING BATCH.
        replay_state = buffer.add(replay_state, items, step, keep=keep)
        replay_state, sampled, info = buffer.sample(
            replay_state, rng, batch_size, step, max_age=max_age
        )
        batch = {k: sampled[k] for k in train_step_lib.BATCH_KEYS if k in sampled}
        batch.update(
            importance_weights=info.importance_weights,
            age=info.age,
            times_sampled=info.times_sampled,
        )
        stats = {
            "replay_size": jnp.sum(replay_state.count),
            "rollouts_kept": jnp.sum(keep) if keep is not None else rewards.shape[0],
        }
        return replay_state, batch, stats

    return ingest


@dataclasses.dataclass
class Run:
    """Everything a run is built from, made before the first step."""

    config: ml_collections.ConfigDict
    workdir: str
    mesh: Any
    rules: Any
    model: Any
    tokenizer: Any
    task: Any
    dataset: Any
    evaluator: Any
    sampler: Any
    buffer: Any
    train_step: Any
    ingest: Any
    train_state: Any
    replay_state: Any


def build(config, workdir: str, log=print) -> Run:
    validate(config)
    os.makedirs(workdir, exist_ok=True)
    sharding.maybe_initialize_distributed()
    rules = sharding.validate_rules(config.mesh.rules)
    mesh = sharding.make_mesh(config.mesh.shape)
    shards = sharding.data_parallel_size(mesh, rules)
    mcfg = model_config(config)
    model = model_lib.Transformer(mcfg)
    tokenizer = ByteTokenizer()
    difficulty = _arith_difficulty(config)
    task = arith.ArithTask(difficulty)
    data_dir = config.task.data_dir or os.path.join(workdir, "data")
    tfds.disable_progress_bar()
    builder = data_lib.prepare_arith(
        data_dir,
        difficulty,
        num_train=config.task.num_train,
        num_test=max(config.task.num_test, config.eval.num_prompts),
        seed=config.task.data_seed,
    )
    rollout = config.rollout
    dataset = data_lib.prompt_dataset(
        builder.as_data_source("train"),
        tokenizer,
        max_prompt_len=rollout.max_prompt_len,
        batch_size=rollout.prompts_per_step,
        seed=config.seed,
    )
    eval_pairs = data_lib.eval_examples(builder.as_data_source("test"), config.eval.num_prompts)
    evaluator = evaluation.Evaluator(
        mcfg,
        tokenizer,
        task,
        [type("E", (), {"prompt": p, "answer": a}) for p, a in eval_pairs],
        max_prompt_len=rollout.max_prompt_len,
        max_new_tokens=rollout.max_new_tokens,
        pass_k=config.eval.pass_k,
        pass_k_prompts=config.eval.pass_k_prompts,
        mesh=mesh,
        rules=rules,
    )

    # WARM START (cached), then the RL train state initialised from it.
    params = None
    if config.warmstart.enabled:
        ws = config.warmstart
        # What the base depends on (not where it or the data are stored).
        key = warmstart_lib.cache_key(
            model=config.model.to_dict(),
            task={k: v for k, v in config.task.to_dict().items() if k != "data_dir"},
            warmstart={k: v for k, v in ws.to_dict().items() if k != "cache_dir"},
            seed=config.seed,
            rollout=(rollout.max_prompt_len, rollout.max_new_tokens),
        )
        params, info = warmstart_lib.warm_start(
            model=model,
            config=warmstart_lib.WarmStartConfig(
                min_accuracy=ws.min_accuracy,
                max_accuracy=ws.max_accuracy,
                max_steps=ws.max_steps,
                batch_size=ws.batch_size,
                learning_rate=ws.learning_rate,
                eval_every=ws.eval_every,
            ),
            tokenizer=tokenizer,
            task=task,
            evaluator=evaluator,
            seed=config.seed,
            max_prompt_len=rollout.max_prompt_len,
            max_new_tokens=rollout.max_new_tokens,
            mesh=mesh,
            rules=rules,
            cache_dir=ws.cache_dir or os.path.join(workdir, "base"),
            key=key,
            log=log,
        )
        log(
            f"warm start: base accuracy {info['base_accuracy']:.3f} after "
            f"{info['sft_steps']} SFT steps"
        )
    optimizer = train_step_lib.make_optimizer(optimizer_config(config))
    train_state, state_shardings = train_step_lib.init_train_state(
        model,
        optimizer,
        jax.random.key(config.seed),
        mesh,
        rules,
        with_reference=config.loss.kl_coef > 0,
        params=params,
    )

    # REPLAY STORE, sharded over the data axes like the batch.
    rc = config.replay
    buffer = replay_lib.make_replay_buffer(
        capacity=rc.capacity,
        strategy=rc.strategy,
        num_shards=shards,
        sample_mode=rc.sample_mode,
        delta=rc.delta,
        recency_tau=rc.recency_tau,
        priority_alpha=rc.priority_alpha,
        priority_beta=rc.priority_beta,
        max_age=rc.max_age or None,
        max_reuse=rc.max_reuse or None,
    )
    seq_len = rollout.max_prompt_len + rollout.max_new_tokens
    example_item = {
        "tokens": jax.ShapeDtypeStruct((seq_len,), jnp.int32),
        "attention_mask": jax.ShapeDtypeStruct((seq_len,), jnp.bool_),
        "loss_mask": jax.ShapeDtypeStruct((seq_len,), jnp.float32),
        "behaviour_logprobs": jax.ShapeDtypeStruct((seq_len,), jnp.float32),
        "reward": jax.ShapeDtypeStruct((), jnp.float32),
        "advantage": jax.ShapeDtypeStruct((), jnp.float32),
        "baseline": jax.ShapeDtypeStruct((), jnp.float32),
        "group_id": jax.ShapeDtypeStruct((), jnp.int32),
        "policy_version": jax.ShapeDtypeStruct((), jnp.int32),
    }
    data_axes = sharding.logical_to_spec(("buffer",), rules)[0]
    replay_shardings = buffer.state_sharding(
        jax.eval_shape(buffer.init, example_item), mesh, data_axes=data_axes or ()
    )
    replay_state = jax.jit(lambda: buffer.init(example_item), out_shardings=replay_shardings)()

    batch_example = {k: v for k, v in example_item.items() if k in train_step_lib.BATCH_KEYS}
    batch_example.update(
        importance_weights=jnp.zeros(()),
        age=jnp.zeros((), jnp.int32),
        times_sampled=jnp.zeros((), jnp.int32),
    )
    batch_sharding = train_step_lib.batch_shardings(
        mesh, rules, {k: jnp.zeros((1,) + jnp.shape(v)) for k, v in batch_example.items()}
    )
    train_step = train_step_lib.make_train_step(
        model,
        optimizer,
        loss_config(config),
        mesh,
        rules,
        state_shardings,
        batch_sharding,
        temperature=rollout.temperature,
        half_batch_stats=rc.mode == "auto",
    )
    ingest = jax.jit(
        make_ingest(
            buffer,
            group_size=rollout.group_size,
            batch_size=config.train.batch_size,
            normalize_std=config.loss.normalize_std,
            drop_zero_advantage=rc.drop_zero_advantage,
        ),
        out_shardings=(replay_shardings, batch_sharding, sharding.replicated(mesh)),
        donate_argnums=(0,),
    )
    sampler = sampler_lib.make_sampler(
        mcfg,
        max_prompt_len=rollout.max_prompt_len,
        max_new_tokens=rollout.max_new_tokens,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        temperature=rollout.temperature,
        top_k=rollout.top_k,
        top_p=rollout.top_p,
        mesh=mesh,
        rules=rules,
    )
    return Run(
        config=config,
        workdir=workdir,
        mesh=mesh,
        rules=rules,
        model=model,
        tokenizer=tokenizer,
        task=task,
        dataset=dataset,
        evaluator=evaluator,
        sampler=sampler,
        buffer=buffer,
        train_step=train_step,
        ingest=ingest,
        train_state=train_state,
        replay_state=replay_state,
    )


def train(config, workdir: str, log=print) -> dict[str, Any]:
    """Runs (or resumes) one RL run in workdir. Returns a summary dict."""
    run = build(config, workdir, log=log)
    c, mcfg = config, model_config(config)
    r = c.rollout.prompts_per_step * c.rollout.group_size
    b = c.train.batch_size
    seq_len = c.rollout.max_prompt_len + c.rollout.max_new_tokens
    data_iter = iter(run.dataset)
    checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"))
    train_state, replay_state = run.train_state, run.replay_state
    account = metrics_lib.ComputeAccount()
    start_step, base_accuracy, wall_offset = 0, None, 0.0
    latest = checkpointer.latest_step()
    if latest is not None:
        train_state, replay_state, loop_state = checkpointer.restore(
            latest, train_state=train_state, replay_state=replay_state, data_iterator=data_iter
        )
        start_step = loop_state["step"]
        account = metrics_lib.ComputeAccount(**loop_state["account"])
        base_accuracy, wall_offset = loop_state["base_accuracy"], loop_state["wall_s"]
        log(f"resumed from step {start_step}")
    writer = metrics_lib.MetricsWriter(workdir, resume_step=start_step)
    base_key = jax.random.key(c.seed)
    if base_accuracy is None:
        base_accuracy = run.evaluator.accuracy(train_state.params, jax.random.key(0))
        log(f"base held-out accuracy {base_accuracy:.3f}")
    # AUTO REPLAY: the generation period and the staleness horizon, planned online.
    auto = None
    if c.replay.mode == "auto":
        auto = auto_replay.AutoReplayController(
            rollouts_per_generation=r,
            batch_size=b,
            capacity=c.replay.capacity,
            mu_override=c.replay.mu or None,
            update_every=c.replay.auto_every,
            max_period=cu.auto_max_period(c),
            design=c.replay.get("auto_design", "paper"),
        )
        if latest is not None and loop_state.get("auto_replay"):
            auto = auto_replay.AutoReplayController.from_state_dict(loop_state["auto_replay"])
        # What a step without generation feeds the (static-shaped) ingest: nothing kept.
        no_prompt_ids = np.zeros((r, c.rollout.max_prompt_len), np.int32)
        no_prompt_mask = np.zeros((r, c.rollout.max_prompt_len), bool)
        no_completion = {
            "tokens": np.zeros((r, c.rollout.max_new_tokens), np.int32),
            "mask": np.zeros((r, c.rollout.max_new_tokens), bool),
            "logprobs": np.zeros((r, c.rollout.max_new_tokens), np.float32),
        }
    bar = metrics_lib.ProgressBar(c.total_steps, start_step)
    t_start = time.time() - wall_offset
    record: dict[str, Any] = {}
    reward_mean = 0.0
    budget = c.get("total_rollouts", 0)
    budget_spent = lambda: bool(budget) and account.gen_rollouts >= budget
    for step in range(start_step, c.total_steps):
        if budget_spent():
            break  # a resumed run that had already spent its rollout budget
        key = jax.random.fold_in(base_key, step)
        gen_key, sample_key, eval_key = jax.random.split(key, 3)
        generate = auto is None or auto.should_generate(step)
        max_age = None if auto is None else auto.max_age()
        # GENERATE R rollouts: G completions for each prompt.
        t0 = time.time()
        if generate:
            prompts = next(data_iter)
            prompt_ids = np.repeat(prompts["prompt_ids"], c.rollout.group_size, axis=0)
            prompt_mask = np.repeat(prompts["prompt_mask"], c.rollout.group_size, axis=0)
            answers = np.repeat(prompts["answer"], c.rollout.group_size)
            out = run.sampler.generate(train_state.params, prompt_ids, prompt_mask, gen_key)
            completion = {"tokens": out.tokens, "mask": out.mask, "logprobs": out.logprobs}
            completion_tokens = np.asarray(out.tokens)
            gen_s = time.time() - t0
            # SCORE on the host.
            rewards, reward_errors = evaluation.score(
                run.task, run.tokenizer, completion_tokens, answers
            )
            reward_mean = float(rewards.mean())
        else:
            prompt_ids, prompt_mask, completion = no_prompt_ids, no_prompt_mask, no_completion
            rewards, reward_errors, gen_s = np.zeros(r, np.float32), 0, 0.0
        # ADD, SAMPLE, STEP on the devices.
        t1 = time.time()
        replay_state, batch, stats = run.ingest(
            replay_state,
            prompt_ids,
            prompt_mask,
            completion,
            jnp.asarray(rewards),
            jnp.int32(step),
            sample_key,
            None if auto is None else jnp.bool_(generate),
            None if auto is None else jnp.int32(max_age),
        )
        train_state, step_metrics = run.train_step(train_state, batch)
        step_metrics = jax.device_get(step_metrics)
        train_s = time.time() - t1

        # ACCOUNTING
        if generate:
            lengths = np.asarray(out.lengths)
            account.gen_tokens += int(lengths.sum())
            account.gen_flops += model_lib.generate_flops(
                mcfg, r, c.rollout.max_prompt_len, int(lengths.max()), seq_len
            )
            account.gen_rollouts += r
        account.train_flops += model_lib.train_flops(mcfg, b, seq_len)
        account.gen_s += gen_s
        account.train_s += train_s
        account.train_rollouts += b
        account.steps += 1
        record = {
            "wall_s": time.time() - t_start,
            **account.as_dict(),
            "mu_measured": account.mu_measured(),
            "reward_mean": reward_mean,
            "reward_errors": reward_errors,
            **jax.device_get(stats),
            **step_metrics,
        }
        if auto is not None:
            auto.observe(
                gen_s=gen_s if generate else None,
                train_s=train_s,
                stats={k: step_metrics[k] for k in auto_replay.STAT_KEYS},
                kept=int(record["rollouts_kept"]) if generate else None,
            )
            record.update(auto.metrics(), auto_max_age=max_age)  # the limit this step used
        done = step + 1
        last = done == c.total_steps or budget_spent()
        if c.eval.every and (done % c.eval.every == 0 or last):
            record.update(run.evaluator(train_state.params, eval_key))
        if done % c.log_every == 0 or "eval_accuracy" in record:
            writer.write(done, record)
        bar.update(
            done,
            record["reward_mean"],
            account.gen_tokens / max(account.gen_s, 1e-9),
            record.get("eval_accuracy"),
        )
        if done % c.checkpoint_every == 0 or last:
            checkpointer.save(
                done,
                train_state=train_state,
                replay_state=replay_state,
                loop_state={
                    "step": done,
                    "account": account.as_dict(),
                    "base_accuracy": base_accuracy,
                    "wall_s": time.time() - t_start,
                    "rng_key": np.asarray(jax.random.key_data(base_key)).tolist(),
                    "auto_replay": auto.state_dict() if auto is not None else None,
                },
                data_iterator=data_iter,
            )
        if last:
            break
    bar.close()
    checkpointer.close()
    writer.close()
    final = record.get("eval_accuracy")
    if final is None:
        final = run.evaluator.accuracy(train_state.params, jax.random.key(0))
    return {
        "base_accuracy": base_accuracy,
        "final_accuracy": final,
        "steps": account.steps,
        "wall_s": time.time() - t_start,
        **account.as_dict(),
    }
