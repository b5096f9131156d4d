"""The RL loop: generate -> score -> add -> sample -> step.

Each generating step samples R = prompts_per_step x group_size fresh rollouts with the
KV-cache sampler, scores them on the host (the only host round trip: completions out,
rewards in), freezes their group advantages and behaviour log-probs, adds them to the
replay store, samples a batch of B, and takes one optimizer step. On-policy training is
the special case N = B = R.

A run is made in explicit stages, each usable alone: `build` constructs the mesh, model,
tokenizer, task, sampler, replay store and compiled steps (nothing trains, nothing is
read or written); `prepare_data` builds or reads the task's dataset and the held-out
evaluator; `initial_params` picks the starting policy (`model.init`: random, or a
supervised warm start, cached); `init_states` places the train and replay states on the
mesh; `train` runs them and then the loop.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tensorflow_datasets as tfds

from replax import auto_replay, evaluation, rollouts, schedules, sharding
from replax import checkpoint as checkpoint_lib
from replax import configuration as cfg
from replax import data as data_lib
from replax import metrics as metrics_lib
from replax import model as model_lib
from replax import replay as replay_lib
from replax import sampler as sampler_lib
from replax import train_step as train_step_lib
from replax import warmstart as warmstart_lib
from replax.tasks import Example
from replax.tokenizer import ByteTokenizer

TOKENIZERS = {"byte": lambda config: ByteTokenizer()}


@dataclasses.dataclass
class Run:
    """What a run is built from: constructed by `build`, before any data or params."""

    config: Any
    workdir: str
    mesh: Any
    rules: Any
    model_config: model_lib.ModelConfig
    model: Any
    tokenizer: Any
    task: Any
    sampler: sampler_lib.Sampler
    buffer: replay_lib.ReplayBuffer
    optimizer: Any
    schedule: schedules.Schedule
    train_step: Any
    add_and_sample: Any
    replay_shardings: Any

    @property
    def rollouts_per_step(self) -> int:
        return cfg.rollouts_per_step(self.config)

    @property
    def seq_len(self) -> int:
        return self.config.rollout.max_prompt_len + self.config.rollout.max_new_tokens


@dataclasses.dataclass
class Data:
    """The prompt stream for rollouts and the held-out evaluator."""

    prompts: Any  # grain dataset of prompt batches
    evaluator: evaluation.Evaluator


def make_schedule(config) -> schedules.Schedule:
    rc = config.replay
    if rc.mode == "fixed":
        return schedules.EveryStep(rc.max_age or None)
    return auto_replay.AutoReplayController(
        rollouts_per_generation=cfg.rollouts_per_step(config),
        batch_size=config.train.batch_size,
        capacity=rc.capacity,
        mu_override=rc.mu or None,
        update_every=rc.auto_every,
        max_period=cfg.auto_max_period(config),
        design=rc.auto_design,
    )


def build(config, workdir: str) -> Run:
    """Constructs a run's parts from a validated config; reads and writes nothing."""
    cfg.validate(config)
    sharding.maybe_initialize_distributed()
    rules = sharding.validate_rules(config.mesh.rules)
    mesh = sharding.make_mesh(config.mesh.shape)
    mcfg = cfg.model_config(config)
    model = model_lib.Transformer(mcfg)
    tokenizer = TOKENIZERS[config.tokenizer.name](config)
    schedule = make_schedule(config)
    buffer = replay_lib.make_replay_buffer(
        num_shards=sharding.data_parallel_size(mesh, rules), **cfg.replay_buffer_kwargs(config)
    )
    optimizer = train_step_lib.make_optimizer(cfg.optimizer_config(config))
    seq_len = config.rollout.max_prompt_len + config.rollout.max_new_tokens

    # The replay store, sharded over the data axes like the batch.
    item = rollouts.rollout_spec(seq_len)
    data_axes = sharding.logical_to_spec(("buffer",), rules)[0]
    replay_shardings = buffer.state_sharding(
        jax.eval_shape(buffer.init, item), mesh, data_axes=data_axes or ()
    )
    batch_sharding = train_step_lib.batch_shardings(
        mesh, rules, rollouts.batch_spec(config.train.batch_size, seq_len)
    )
    state_shardings = train_step_lib.train_state_shardings(
        model, optimizer, mesh, rules, with_reference=config.loss.kl_coef > 0
    )
    train_step = train_step_lib.make_train_step(
        model,
        optimizer,
        cfg.loss_config(config),
        mesh,
        rules,
        state_shardings,
        batch_sharding,
        temperature=config.rollout.temperature,
        half_batch_stats=schedule.half_batch_stats,
    )
    add_and_sample = jax.jit(
        rollouts.make_add_and_sample(
            buffer,
            group_size=config.rollout.group_size,
            batch_size=config.train.batch_size,
            normalize_std=config.loss.normalize_std,
            drop_zero_advantage=config.replay.drop_zero_advantage,
        ),
        out_shardings=(replay_shardings, batch_sharding, sharding.replicated(mesh)),
        donate_argnums=(0,),
    )
    sampler = sampler_lib.make_sampler(
        mcfg,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        mesh=mesh,
        rules=rules,
        **cfg.sampler_kwargs(config),
    )
    return Run(
        config=config,
        workdir=workdir,
        mesh=mesh,
        rules=rules,
        model_config=mcfg,
        model=model,
        tokenizer=tokenizer,
        task=cfg.make_task_from_config(config),
        sampler=sampler,
        buffer=buffer,
        optimizer=optimizer,
        schedule=schedule,
        train_step=train_step,
        add_and_sample=add_and_sample,
        replay_shardings=replay_shardings,
    )


def prepare_data(run: Run) -> Data:
    """Builds (once, cached under task.data_dir or WORKDIR/data) the task's dataset and
    returns the prompt stream and the held-out evaluator on its first test prompts."""
    c = run.config
    tfds.disable_progress_bar()
    builder = data_lib.prepare_task_data(
        c.task.data_dir or os.path.join(run.workdir, "data"),
        run.task,
        num_train=c.task.num_train,
        num_test=c.task.num_test,
        seed=c.task.data_seed,
    )
    prompts = data_lib.prompt_dataset(
        builder.as_data_source("train"),
        run.tokenizer,
        max_prompt_len=c.rollout.max_prompt_len,
        batch_size=c.rollout.prompts_per_step,
        seed=c.seed,
    )
    pairs = data_lib.eval_examples(builder.as_data_source("test"), c.eval.num_prompts)
    evaluator = evaluation.Evaluator(
        run.model_config,
        run.tokenizer,
        run.task,
        [Example(prompt, answer) for prompt, answer in pairs],
        max_prompt_len=c.rollout.max_prompt_len,
        max_new_tokens=c.rollout.max_new_tokens,
        pass_k=c.eval.pass_k,
        pass_k_prompts=c.eval.pass_k_prompts,
        mesh=run.mesh,
        rules=run.rules,
    )
    return Data(prompts=prompts, evaluator=evaluator)


def _warm_start(run: Run, data: Data, log):
    c = run.config
    # What the base depends on (not where it or the data are stored).
    key = warmstart_lib.cache_key(
        model=dataclasses.asdict(run.model_config),
        task={k: v for k, v in c.task.to_dict().items() if k != "data_dir"},
        warmstart={k: v for k, v in c.warmstart.to_dict().items() if k != "cache_dir"},
        seed=c.seed,
        rollout=(c.rollout.max_prompt_len, c.rollout.max_new_tokens),
    )
    params, info = warmstart_lib.warm_start(
        model=run.model,
        config=cfg.warmstart_config(c),
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
    )
    log(
        f"warm start: base accuracy {info['base_accuracy']:.3f} after {info['sft_steps']} SFT steps"
    )
    return params


# model.init -> the starting parameters (None: a random init from the run's seed).
INITIAL_PARAMS = {"random": lambda run, data, log: None, "warmstart": _warm_start}
assert set(INITIAL_PARAMS) == set(cfg.INITS)


def initial_params(run: Run, data: Data, log=print):
    """The policy RL starts from, as `model.init` says."""
    return INITIAL_PARAMS[run.config.model.init](run, data, log)


def init_states(run: Run, params=None):
    """(train_state, replay_state) on the mesh: params given or initialised from the seed,
    a fresh optimizer state, an empty replay store."""
    train_state = train_step_lib.init_train_state(
        run.model,
        run.optimizer,
        jax.random.key(run.config.seed),
        run.mesh,
        run.rules,
        with_reference=run.config.loss.kl_coef > 0,
        params=params,
    )[0]
    item = rollouts.rollout_spec(run.seq_len)
    replay_state = jax.jit(lambda: run.buffer.init(item), out_shardings=run.replay_shardings)()
    return train_state, replay_state


def train(config, workdir: str, log=print) -> dict[str, Any]:
    """Runs (or resumes) one RL run in workdir. Returns a summary dict."""
    run = build(config, workdir)
    os.makedirs(workdir, exist_ok=True)
    data = prepare_data(run)
    checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"))
    latest = checkpointer.latest_step()
    # A resumed run restores its params: no warm start needed.
    params = None if latest is not None else initial_params(run, data, log)
    train_state, replay_state = init_states(run, params)
    try:
        return run_loop(run, data, checkpointer, train_state, replay_state, log=log)
    finally:
        checkpointer.close()


def run_loop(run: Run, data: Data, checkpointer, train_state, replay_state, log=print):
    """The RL loop from the latest checkpoint (or step 0) to total_steps."""
    c, schedule, evaluator = run.config, run.schedule, data.evaluator
    r, group = run.rollouts_per_step, c.rollout.group_size
    prompt_iter = iter(data.prompts)
    account, start_step, base_accuracy, wall_offset = metrics_lib.ComputeAccount(), 0, None, 0.0
    latest = checkpointer.latest_step()
    if latest is not None:
        train_state, replay_state, loop_state = checkpointer.restore(
            latest, train_state=train_state, replay_state=replay_state, data_iterator=prompt_iter
        )
        start_step, wall_offset = loop_state["step"], loop_state["wall_s"]
        account = metrics_lib.ComputeAccount(**loop_state["account"])
        base_accuracy = loop_state["base_accuracy"]
        if loop_state.get("auto_replay"):
            schedule = auto_replay.AutoReplayController.from_state_dict(loop_state["auto_replay"])
        log(f"resumed from step {start_step}")
    if base_accuracy is None:
        base_accuracy = evaluator.accuracy(train_state.params, jax.random.key(0))
        log(f"base held-out accuracy {base_accuracy:.3f}")
    writer = metrics_lib.MetricsWriter(run.workdir, resume_step=start_step)
    bar = metrics_lib.ProgressBar(c.total_steps, start_step)
    # What a step without generation feeds add_and_sample, which stores none of it.
    idle = _placeholder_rollouts(r, c.rollout.max_prompt_len, c.rollout.max_new_tokens)
    base_key, t_start, record = jax.random.key(c.seed), time.time() - wall_offset, {}
    spent = lambda: bool(c.total_rollouts) and account.gen_rollouts >= c.total_rollouts
    for step in range(start_step, c.total_steps):
        if spent():
            break  # a resumed run that had already spent its rollout budget
        gen_key, sample_key, eval_key = jax.random.split(jax.random.fold_in(base_key, step), 3)
        generated, max_age = schedule.should_generate(step), schedule.max_age()
        # GENERATE R rollouts (G completions of each prompt), SCORE them on the host.
        t0 = time.time()
        if generated:
            prompts = next(prompt_iter)
            prompt_ids = np.repeat(prompts["prompt_ids"], group, axis=0)
            prompt_mask = np.repeat(prompts["prompt_mask"], group, axis=0)
            out = run.sampler.generate(train_state.params, prompt_ids, prompt_mask, gen_key)
            completion = {"tokens": out.tokens, "mask": out.mask, "logprobs": out.logprobs}
            completion_tokens = np.asarray(out.tokens)
            gen_s = time.time() - t0
            answers = np.repeat(prompts["answer"], group)
            rewards, reward_errors = evaluation.score(
                run.task, run.tokenizer, completion_tokens, answers
            )
        else:
            prompt_ids, prompt_mask, completion, rewards = idle
            reward_errors, gen_s = 0, 0.0
        # ADD, SAMPLE, STEP on the devices.
        t1 = time.time()
        replay_state, batch, stats = run.add_and_sample(
            replay_state,
            prompt_ids,
            prompt_mask,
            completion,
            jnp.asarray(rewards),
            jnp.int32(step),
            sample_key,
            jnp.bool_(generated),
            jnp.int32(max_age),
        )
        train_state, step_metrics = run.train_step(train_state, batch)
        step_metrics, stats = jax.device_get((step_metrics, stats))
        train_s = time.time() - t1
        # ACCOUNTING AND METRICS
        lengths = np.asarray(out.lengths) if generated else None
        _account(account, run, lengths, gen_s, train_s)
        schedule.observe(
            gen_s=gen_s if generated else None,
            train_s=train_s,
            stats=step_metrics,
            kept=int(stats["rollouts_kept"]) if generated else None,
        )
        record = {
            "wall_s": time.time() - t_start,
            **account.as_dict(),
            "mu_measured": account.mu_measured(),
            # A step that generates nothing has no reward to report.
            "reward_mean": float(rewards.mean()) if generated else None,
            "reward_errors": reward_errors,
            **stats,
            **step_metrics,
            **schedule.metrics(),
        }
        done = step + 1
        last = done == c.total_steps or spent()
        if c.eval.every and (done % c.eval.every == 0 or last):
            record.update(evaluator(train_state.params, eval_key))
        if done % c.log_every == 0 or "eval_accuracy" in record:
            writer.write(done, record)
        tokens_per_s = account.gen_tokens / max(account.gen_s, 1e-9)
        bar.update(done, record["reward_mean"], tokens_per_s, record.get("eval_accuracy"))
        if done % c.checkpoint_every == 0 or last:
            loop_state = {
                "step": done,
                "account": account.as_dict(),
                "base_accuracy": base_accuracy,
                "wall_s": time.time() - t_start,
                "auto_replay": schedule.state_dict(),
            }
            checkpointer.save(
                done,
                train_state=train_state,
                replay_state=replay_state,
                loop_state=loop_state,
                data_iterator=prompt_iter,
            )
        if last:
            break
    bar.close()
    writer.close()
    final = record.get("eval_accuracy")
    if final is None:
        final = evaluator.accuracy(train_state.params, jax.random.key(0))
    return {
        "base_accuracy": base_accuracy,
        "final_accuracy": final,
        "steps": account.steps,
        "wall_s": time.time() - t_start,
        **account.as_dict(),
    }


def _placeholder_rollouts(r: int, prompt_len: int, new_tokens: int):
    """Zero prompts, completions and rewards of the shapes a generating step has."""
    completion = {
        "tokens": np.zeros((r, new_tokens), np.int32),
        "mask": np.zeros((r, new_tokens), bool),
        "logprobs": np.zeros((r, new_tokens), np.float32),
    }
    prompt_ids = np.zeros((r, prompt_len), np.int32)
    return prompt_ids, prompt_ids.astype(bool), completion, np.zeros(r, np.float32)


def _account(account: metrics_lib.ComputeAccount, run: Run, lengths, gen_s, train_s) -> None:
    """Adds one step's generation (lengths int[R] of the completions, or None when the
    step generated nothing) and training to the cumulative compute account."""
    c, r, b = run.config, run.rollouts_per_step, run.config.train.batch_size
    if lengths is not None:
        account.gen_tokens += int(lengths.sum())
        account.gen_flops += model_lib.generate_flops(
            run.model_config, r, c.rollout.max_prompt_len, int(lengths.max()), run.seq_len
        )
        account.gen_rollouts += r
    account.train_flops += model_lib.train_flops(run.model_config, b, run.seq_len)
    account.gen_s += gen_s
    account.train_s += train_s
    account.train_rollouts += b
    account.steps += 1
