"""A run's parts, built in explicit stages that each do one thing.

`build` constructs the mesh, model, tokenizer, task, sampler, replay store and compiled
steps from a run spec (`replax.config.spec.RunSpec`), after the checks of
`replax.config.build.build` (nothing trains, nothing is written);
`prepare_data` builds or reads the task's dataset and the held-out evaluator;
`initial_params` picks the starting policy (`model.init`: random, a supervised warm start
that is cached, or a Hugging Face checkpoint); `init_states` places the train and replay
states on the mesh, and `abstract_states` gives their shapes and shardings for a restore.
`replax.run.trainer.train` runs them in order, then the loop.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import tensorflow_datasets as tfds

from replax.config import build as cfg
from replax.config import sections
from replax.config import spec as spec_lib
from replax.core import processes, sharding
from replax.core.config_utils import ConfigError
from replax.model import transformer as model_lib
from replax.replay import schedules
from replax.replay import store as replay_lib
from replax.rl import evaluation, placement, rollouts
from replax.rl import train_step as train_step_lib
from replax.run import warmstart as warmstart_lib
from replax.sampling import engine as engine_lib
from replax.sampling import sampler as sampler_lib
from replax.tasks import Example
from replax.tasks import pipeline as data_lib


@dataclasses.dataclass
class Run:
    """What a run is built from: constructed by `build`, before any data or params."""

    spec: spec_lib.RunSpec
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
    onpolicy_train_step: Any  # auto mode's on-policy steps (train_step otherwise)
    add_and_sample: Any
    # Auto mode's on-policy steps draw and train on this many rollouts (B otherwise).
    onpolicy_add_and_sample: Any
    onpolicy_batch_size: int
    replay_shardings: Any
    # task.long_prompts='skip': each split's records left out, its size before (cfg.Built).
    skipped_prompts: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    split_sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def rollouts_per_step(self) -> int:
        return self.spec.rollouts_per_step

    @property
    def seq_len(self) -> int:
        return self.spec.seq_len

    def steps_for(self, once) -> tuple[Any, Any, int]:
        """(add_and_sample, train_step, batch size) of a step: auto mode's on-policy
        programs when `once`, else the replay step's."""
        if once:
            return self.onpolicy_add_and_sample, self.onpolicy_train_step, self.onpolicy_batch_size
        return self.add_and_sample, self.train_step, self.spec.train.batch_size


@dataclasses.dataclass
class Data:
    """The prompt stream for rollouts and the held-out evaluator."""

    prompts: Any  # grain dataset of prompt batches
    evaluator: evaluation.Evaluator
    # split -> (prompts left out as longer than rollout.max_prompt_len, the split's size).
    skipped_prompts: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def skipped_line(self, max_prompt_len: int) -> str | None:
        """The line that reports the prompts left out, or None when none was."""
        if not self.skipped_prompts:
            return None
        counts = " and ".join(
            f"{n} of {total} {split}" for split, (n, total) in self.skipped_prompts.items()
        )
        return f"{counts} prompts longer than max_prompt_len={max_prompt_len} were skipped"


def build(spec: spec_lib.RunSpec, workdir: str) -> Run:
    """Constructs a run's parts from a run spec; writes nothing (a file-backed task reads
    its data file, once, in the checks). On a multi-process launch it first joins the
    other processes (jax.distributed)."""
    processes.maybe_initialize_distributed()
    return assemble(spec, workdir, cfg.build(spec))


def assemble(spec: spec_lib.RunSpec, workdir: str, built: cfg.Built, devices=None) -> Run:
    """The run's meshes, model, sampler, replay store and jitted steps over `devices`
    (default: every device JAX sees), from the build step's model config, tokenizer and
    task. scripts/tpu_compile.py passes a TPU topology's devices to compile the same
    programs ahead of time on a host without one."""
    devices = list(jax.devices() if devices is None else devices)
    rules = sharding.validate_rules(spec.mesh.rules)
    # Disjoint placement: the sampler takes devices of its own, the trainer the rest.
    r = spec.rollout
    sampler_devices = placement.sampler_device_count(r.placement, r.num_devices, len(devices))
    train_devices, rollout_devices = placement.split_devices(sampler_devices, devices)
    rollout_devices = rollout_devices if sampler_devices else train_devices
    mesh = sharding.make_mesh(spec.mesh.shape, devices=train_devices)
    mcfg, tokenizer = built.model_config, built.tokenizer
    model = model_lib.Transformer(mcfg)
    schedule = cfg.make_schedule(spec)
    buffer = replay_lib.make_replay_buffer(spec.replay, sharding.data_parallel_size(mesh, rules))
    optimizer, seq_len = train_step_lib.make_optimizer(spec.optimizer), spec.seq_len

    # The replay store, sharded over the data axes like the batch.
    item = rollouts.rollout_spec(seq_len, spec.rollout.stream)
    data_axes = sharding.logical_to_spec(("buffer",), rules)[0]
    replay_shardings = buffer.state_sharding(
        jax.eval_shape(buffer.init, item), mesh, data_axes=data_axes or ()
    )
    batch_sharding = lambda size: train_step_lib.batch_shardings(
        mesh, rules, rollouts.batch_spec(size, seq_len, spec.rollout.stream)
    )
    state_shardings = train_step_lib.train_state_shardings(
        model, optimizer, mesh, rules, with_reference=spec.loss.kl_coef > 0
    )
    b = spec.train.batch_size
    make_step = lambda loss, size=b, halves=schedule.half_batch_stats: (
        train_step_lib.make_train_step(
            model,
            optimizer,
            loss,
            mesh,
            rules,
            state_shardings,
            batch_sharding(size),
            temperature=r.temperature,
            half_batch_stats=halves,
            vocab_size=tokenizer.sample_limit,
            num_microbatches=spec.train.num_microbatches,
            logits_chunk_size=spec.train.logits_chunk_size,
            grad_clip=spec.optimizer.grad_clip,
        )
    )
    train_step = onpolicy_train_step = make_step(spec.loss)
    make_add_and_sample = lambda size: jax.jit(
        rollouts.make_add_and_sample(
            buffer,
            group_size=r.group_size,
            batch_size=size,
            normalize_std=spec.loss.normalize_std,
            drop_zero_advantage=spec.replay.drop_zero_advantage,
        ),
        out_shardings=(replay_shardings, batch_sharding(size), sharding.replicated(mesh)),
        donate_argnums=(0,),
    )
    add_and_sample = onpolicy_add_and_sample = make_add_and_sample(b)
    onpolicy_b = getattr(schedule, "onpolicy_batch", b)
    if schedule.varies_training:
        # Auto mode's on-policy steps run on-policy's own program (compiled on first use):
        # its batch in train.num_microbatches passes, no covariance option, no halves, so
        # that on the same batch such a step is the on-policy design's, bit for bit.
        onpolicy_loss = spec.loss.without_covariance()
        onpolicy_train_step = make_step(onpolicy_loss, onpolicy_b, halves=False)
    if onpolicy_b != b:
        onpolicy_add_and_sample = make_add_and_sample(onpolicy_b)
    # Decoding may use a mesh of its own (tensor-parallel; disjoint: the sampler's devices).
    sampler = sampler_lib.make_sampler(
        mcfg,
        r,
        max_prompt_len=r.max_prompt_len,
        max_new_tokens=r.max_new_tokens,
        stop_ids=tokenizer.stop_ids,
        vocab_size=tokenizer.sample_limit,
        pad_id=tokenizer.pad_id,
        mesh=sharding.make_mesh(spec.sampler_mesh_shape, devices=rollout_devices),
        rules=rules,
        **r.numerics(),
    )
    if r.slots:  # the engine stands where the sampler does, with its rollouts
        engine = dict(
            slots=r.slots,
            refill_every=r.refill_every,
            drain_halvings=r.drain_halvings,
            max_admit=r.max_admit,
        )
        sampler = engine_lib.make_engine(sampler, **engine)
    return Run(
        spec=spec,
        workdir=workdir,
        mesh=mesh,
        rules=rules,
        model_config=mcfg,
        model=model,
        tokenizer=tokenizer,
        task=built.task,
        sampler=sampler,
        buffer=buffer,
        optimizer=optimizer,
        schedule=schedule,
        train_step=train_step,
        onpolicy_train_step=onpolicy_train_step,
        add_and_sample=add_and_sample,
        onpolicy_add_and_sample=onpolicy_add_and_sample,
        onpolicy_batch_size=onpolicy_b,
        replay_shardings=replay_shardings,
        skipped_prompts=built.skipped_prompts,
        split_sizes=built.split_sizes,
    )


def prepare_data(run: Run) -> Data:
    """Builds (once, cached under task.data_dir or WORKDIR/data) the task's dataset and
    returns the prompt stream and the held-out evaluator on its first test prompts.
    With several processes, each one's stream holds its own block of every global batch
    of prompts: the prompts of the rollouts its devices hold."""
    c = run.spec
    tfds.disable_progress_bar()
    builder = data_lib.prepare_task_data(
        c.task.data_dir or os.path.join(run.workdir, "data"),
        run.task,
        num_train=c.task.num_train,
        num_test=c.task.num_test,
        seed=c.task.data_seed,
    )
    train, test = (_kept(run, split, builder.as_data_source(split)) for split in ("train", "test"))
    # Sizes a file-backed task (task.num_* = 0: all of it) knows only once it is read.
    if len(train) < c.rollout.prompts_per_step or len(test) < c.eval.num_prompts:
        raise ConfigError(
            f"task {run.task.name}: {len(train)} train and {len(test)} test examples; "
            f"rollout.prompts_per_step={c.rollout.prompts_per_step} and eval.num_prompts="
            f"{c.eval.num_prompts} need at least as many"
        )
    rows_mesh = eval_mesh(run)
    prompts = data_lib.prompt_dataset(
        train,
        run.tokenizer,
        max_prompt_len=c.rollout.max_prompt_len,
        batch_size=c.rollout.prompts_per_step,
        seed=c.seed,
        # This process's block of each batch: that of the sampler's rows, or with a
        # sampler of this process's devices alone, that of the trainer's.
        block=processes.process_block(sharding.named(rows_mesh, ("batch",), run.rules)),
    )
    pairs = data_lib.eval_examples(test, c.eval.num_prompts)
    evaluator = evaluation.Evaluator(
        run.model_config,
        run.tokenizer,
        run.task,
        [Example(prompt, answer) for prompt, answer in pairs],
        max_prompt_len=c.rollout.max_prompt_len,
        max_new_tokens=c.rollout.max_new_tokens,
        pass_k=c.eval.pass_k,
        pass_k_prompts=c.eval.pass_k_prompts,
        num_samples=c.eval.num_samples,
        max_rows=c.eval.max_rows,
        # A sampler of this process's devices alone (disjoint, several processes) decodes
        # one block of a batch; the held-out set is split over every process's trainer.
        mesh=rows_mesh,
        rules=run.rules,
        **c.rollout.numerics(),
    )
    skipped = {
        split: (len(rows), run.split_sizes[split]) for split, rows in run.skipped_prompts.items()
    }
    return Data(prompts=prompts, evaluator=evaluator, skipped_prompts=skipped)


def eval_mesh(run: Run):
    """The mesh whose rows the prompt stream and held-out evaluation are split over: the
    sampler's, or with a sampler of this process's devices alone (disjoint, several
    processes), the trainer's."""
    return run.mesh if rollouts.process_local(run.sampler) else run.sampler.mesh


class _Kept:
    """The records of a random-access source less those at `skipped` (sorted indices)."""

    def __init__(self, source, skipped):
        self.source = source
        self.rows = np.setdiff1d(np.arange(len(source)), np.asarray(skipped, np.int64))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        return self.source[int(self.rows[index])]


def _kept(run: Run, split: str, source):
    """A split's source as the run reads it: with task.long_prompts='skip', without the
    records build found longer than rollout.max_prompt_len."""
    skipped = run.skipped_prompts.get(split)
    if not skipped:
        return source
    if len(source) != run.split_sizes[split]:  # the records build measured are these
        raise ConfigError(
            f"task {run.task.name}: the {split} data has {len(source)} records, its prompts "
            f"measured {run.split_sizes[split]}: task.data_dir holds data of another task"
        )
    return _Kept(source, skipped)


def _from_checkpoint(run: Run, data: Data, log, stop=None):
    """The Hugging Face checkpoint's weights, each read straight into its sharding."""
    from replax.hf import checkpoint as hf

    del data, stop
    model = run.spec.model
    _, params = hf.load_pretrained_sharded(
        model.checkpoint, run.mesh, run.rules, **model.checkpoint_overrides()
    )
    log(f"loaded {model.checkpoint}")
    return params


# model.init -> the starting parameters (None: a random init from the run's seed).
INITIAL_PARAMS = {
    "random": lambda run, data, log, stop=None: None,
    "warmstart": warmstart_lib.for_run,
    "checkpoint": _from_checkpoint,
}
assert set(INITIAL_PARAMS) == set(sections.INITS)


def initial_params(run: Run, data: Data, log=print, stop=None):
    """The policy RL starts from, as `model.init` says. `stop` (a runtime.StopRequest)
    ends a warm start between its SFT steps with runtime.Preempted."""
    return INITIAL_PARAMS[run.spec.model.init](run, data, log, stop)


def abstract_states(run: Run):
    """(train_state, replay_state) as ShapeDtypeStructs carrying their shardings: what a
    checkpoint restores into, computed without allocating (a 7B model's fresh state would
    otherwise be initialised only to be overwritten)."""
    train_state = train_step_lib.abstract_train_state(
        run.model,
        run.optimizer,
        run.mesh,
        run.rules,
        with_reference=run.spec.loss.kl_coef > 0,
    )
    item = rollouts.rollout_spec(run.seq_len, run.spec.rollout.stream)
    replay_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        jax.eval_shape(lambda: run.buffer.init(item)),
        run.replay_shardings,
    )
    return train_state, replay_state


def init_states(run: Run, params=None):
    """(train_state, replay_state) on the mesh: params given or initialised from the seed,
    a fresh optimizer state, an empty replay store."""
    train_state = train_step_lib.init_train_state(
        run.model,
        run.optimizer,
        jax.random.key(run.spec.seed),
        run.mesh,
        run.rules,
        with_reference=run.spec.loss.kl_coef > 0,
        params=params,
    )[0]
    item = rollouts.rollout_spec(run.seq_len, run.spec.rollout.stream)
    replay_state = jax.jit(lambda: run.buffer.init(item), out_shardings=run.replay_shardings)()
    return train_state, replay_state
