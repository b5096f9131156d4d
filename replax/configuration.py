"""From a run's ConfigDict to the library's typed arguments, checked before any compute.

`validate(config)` runs every check that needs the configuration alone and raises
`ConfigError` with one line naming the key and what is allowed; scripts turn it into exit
status 2 before anything is written. The other functions turn config sections into the
frozen dataclasses and keyword arguments that library code takes; with `validate` they
are the only readers of the ConfigDict besides the trainer and the scripts.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import os
from typing import Any

import jax
import ml_collections
import numpy as np

from replax import attention, auto_replay, objectives, schedules, sharding
from replax import model as model_lib
from replax import replay as replay_lib
from replax import train_step as train_step_lib
from replax import warmstart as warmstart_lib
from replax.config_utils import ConfigError, number, one_of, positive, require
from replax.tasks import Task, make_task, resolve_factory
from replax.tokenizer import ByteTokenizer

# task.* keys that say where and how much data to build; every other task.* key is an
# argument of the task's factory.
TASK_DATA_KEYS = ("name", "data_dir", "num_train", "num_test", "data_seed")
# model.* keys that are not the architecture.
MODEL_RUN_KEYS = ("init", "checkpoint")
# With model.checkpoint the architecture comes from its config.json; these model.* keys
# still apply (the longest sequence, the numerics, how layers are compiled).
CHECKPOINT_OVERRIDES = (
    "max_len",
    "dtype",
    "param_dtype",
    "scan_layers",
    "remat_policy",
    "attention",
)
INITS = ("random", "warmstart", "checkpoint")
TOKENIZERS = ("byte", "hf")
REPLAY_MODES = ("fixed", "auto")


def rollouts_per_step(config: ml_collections.ConfigDict) -> int:
    """R = prompts_per_step x group_size fresh rollouts per generating step."""
    return config.rollout.prompts_per_step * config.rollout.group_size


def seq_len(config: ml_collections.ConfigDict) -> int:
    """Tokens of a stored rollout: the prompt (left-padded) and the completion."""
    return config.rollout.max_prompt_len + config.rollout.max_new_tokens


def auto_max_period(config: ml_collections.ConfigDict) -> int:
    """The longest generation period auto mode may plan: steps between generations that
    keep the replay ratio B x period / R at most replay.auto_max_y (at least 1)."""
    return max(
        1, int(config.replay.auto_max_y * rollouts_per_step(config) / config.train.batch_size)
    )


def model_config(config) -> model_lib.ModelConfig:
    """The policy's ModelConfig: model.* keys, or with model.checkpoint the checkpoint's
    config.json with CHECKPOINT_OVERRIDES from model.*."""
    if config.model.checkpoint:
        from replax import hf_config

        overrides = {k: config.model[k] for k in CHECKPOINT_OVERRIDES if k in config.model}
        return hf_config.read_config(config.model.checkpoint, **overrides)
    fields = {k: v for k, v in config.model.to_dict().items() if k not in MODEL_RUN_KEYS}
    return model_lib.ModelConfig(**fields)


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
        state_dtype=c.get("state_dtype", "float32"),
    )


def train_step_kwargs(config) -> dict[str, Any]:
    """make_train_step's memory settings (configs written before them get the defaults)."""
    t = config.train
    return dict(
        num_microbatches=t.get("num_microbatches", 1),
        logits_chunk_size=t.get("logits_chunk_size", 0),
        grad_clip=config.optimizer.grad_clip,
    )


def warmstart_config(config) -> warmstart_lib.WarmStartConfig:
    ws = config.warmstart
    return warmstart_lib.WarmStartConfig(
        min_accuracy=ws.min_accuracy,
        max_accuracy=ws.max_accuracy,
        max_steps=ws.max_steps,
        batch_size=ws.batch_size,
        learning_rate=ws.learning_rate,
        eval_every=ws.eval_every,
    )


def replay_buffer_kwargs(config) -> dict[str, Any]:
    """make_replay_buffer's arguments, less num_shards (set by the mesh)."""
    rc = config.replay
    return dict(
        capacity=rc.capacity,
        strategy=rc.strategy,
        sample_mode=rc.sample_mode,
        delta=rc.delta,
        recency_tau=rc.recency_tau,
        priority_alpha=rc.priority_alpha,
        priority_beta=rc.priority_beta,
        max_age=rc.max_age or None,
        max_reuse=rc.max_reuse or None,
    )


def sampler_kwargs(config) -> dict[str, Any]:
    """make_sampler's sampling, length and numerics arguments for rollouts (not its mesh:
    `sampler_mesh_shape`)."""
    r = config.rollout
    return dict(
        max_prompt_len=r.max_prompt_len,
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        top_k=r.top_k,
        top_p=r.top_p,
        top_p_candidates=r.get("top_p_candidates", 64),
        **sampler_numerics(config),
    )


def sampler_numerics(config) -> dict[str, Any]:
    """The decoding weights' and KV cache's dtypes (None: the model's compute dtype)."""
    r = config.rollout
    return dict(dtype=r.get("dtype") or None, cache_dtype=r.get("cache_dtype") or None)


def sampler_mesh_shape(config) -> tuple[int, ...]:
    """The sampler's mesh: rollout.mesh_shape, or the training mesh when it is empty."""
    return tuple(config.rollout.get("mesh_shape") or config.mesh.shape)


def make_tokenizer(config):
    """tokenizer.name -> the tokenizer: 'byte' (one token per UTF-8 byte) or 'hf' (the
    tokenizer.json, chat template and stop ids of tokenizer.path, by default the
    model.checkpoint directory)."""
    if config.tokenizer.name == "byte":
        return ByteTokenizer()
    from replax.tokenizer import HFTokenizer

    path = config.tokenizer.path or config.model.checkpoint
    if not path:
        raise ConfigError("tokenizer.name='hf' needs tokenizer.path or model.checkpoint")
    return HFTokenizer(path)


def make_schedule(config) -> schedules.Schedule:
    rc = config.replay
    if rc.mode == "fixed":
        return schedules.EveryStep(rc.max_age or None)
    return auto_replay.AutoReplayController(
        rollouts_per_generation=rollouts_per_step(config),
        batch_size=config.train.batch_size,
        capacity=rc.capacity,
        mu_override=rc.mu or None,
        update_every=rc.auto_every,
        max_period=auto_max_period(config),
        design=rc.auto_design,
    )


def task_kwargs(config) -> dict[str, Any]:
    return {k: v for k, v in config.task.to_dict().items() if k not in TASK_DATA_KEYS}


def task_factory_keys(factory) -> tuple[str, ...] | None:
    """The task.* keys a factory takes by name (None: it takes **kwargs, so any key)."""
    parameters = inspect.signature(factory).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in parameters if p.kind in by_name and p.name != "tokenizer")


def fit_task_section(config, file_config):
    """The config with its task section fitted to a task.name given on the command line.

    A config file's task section belongs to the task the file names (configs/arith.py's to
    `arith`): `file_config` is the same file's config without --config.* overrides. When
    task.name names another task, as in `--config=configs/arith.py
    --config.task.name=my_mod:make`, the rule for each task.* key (TASK_DATA_KEYS apart) is:
    - the new factory takes it: it is passed, as for any task;
    - it does not, and the key still has the file's value: it is dropped (it is the file's
      task's setting, left as the file set it);
    - it does not, and the value was changed: ConfigError naming the key, since the change
      would do nothing.
    A factory with **kwargs takes every key. Returns a copy without the dropped keys (the
    same config when task.name is the file's own).
    """
    own, name = file_config.task.name, config.task.name
    if name == own:
        return config
    try:
        takes = task_factory_keys(resolve_factory(name))
    except ValueError as e:  # a task.name that does not resolve
        raise ConfigError(str(e).splitlines()[0]) from None
    if takes is None:
        return config
    dropped = []
    for key, value in task_kwargs(config).items():
        if key in takes:
            continue
        whose = f"belongs to the {own} task, not to" if key in file_config.task else "is not for"
        require(
            key in file_config.task and file_config.task[key] == value,
            f"task.{key}={value!r} {whose} {name} (it takes: "
            f"{', '.join(takes) or 'no task.* keys'}); give your task its own task section, "
            "as tests/user_task_config.py does",
        )
        dropped.append(key)
    fitted = copy.deepcopy(config)
    with fitted.unlocked():
        for key in dropped:
            del fitted.task[key]
    return fitted


def make_task_from_config(config, tokenizer=None) -> Task:
    """The task of task.name with its task.* keys; a factory that takes a `tokenizer`
    argument (GSM8K and MATH: prompts through the chat template) gets the run's."""
    kwargs = task_kwargs(config)
    parameters = inspect.signature(resolve_factory(config.task.name)).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if "tokenizer" in parameters or takes_any:
        kwargs["tokenizer"] = make_tokenizer(config) if tokenizer is None else tokenizer
    return make_task(config.task.name, **kwargs)


def data_shards(config, num_devices: int | None = None) -> int:
    """How many ways the batch and the buffer split: the data x fsdp mesh axes."""
    shape = sharding.validate_mesh_shape(
        config.mesh.shape, jax.device_count() if num_devices is None else num_devices
    )
    return int(np.prod([shape[sharding.MESH_AXES.index(a)] for a in ("data", "fsdp")]))


def logical_shards(
    config, logical: str, num_devices: int | None = None, shape: tuple[int, ...] | None = None
) -> int:
    """How many ways mesh.rules split a logical axis (e.g. heads over tensor) on the mesh of
    `shape` (default mesh.shape)."""
    shape = sharding.validate_mesh_shape(
        config.mesh.shape if shape is None else shape,
        jax.device_count() if num_devices is None else num_devices,
    )
    spec = sharding.logical_to_spec((logical,), sharding.validate_rules(config.mesh.rules))[0]
    names = () if spec is None else ((spec,) if isinstance(spec, str) else tuple(spec))
    return int(np.prod([shape[sharding.MESH_AXES.index(n)] for n in names]))


@dataclasses.dataclass(frozen=True)
class Validated:
    """What validation had to build to check a config, for `run.build` to use as is:
    a file-backed task reads its data file once per run."""

    model_config: model_lib.ModelConfig
    tokenizer: Any
    task: Task


def sampler_data_shards(config, shape) -> int:
    """How many ways the sampler's batch splits: the data x fsdp axes of its mesh."""
    return logical_shards(config, "batch", shape=shape)


def validate(config: ml_collections.ConfigDict) -> Validated:
    """Every check that can fail on configuration alone, before any compute."""
    # Sizes and counts.
    for key in (
        "total_steps",
        "rollout.prompts_per_step",
        "rollout.group_size",
        "train.batch_size",
        "replay.capacity",
        "eval.num_prompts",
        "rollout.max_prompt_len",
        "rollout.max_new_tokens",
        "checkpoint_every",
    ):
        positive(config, key)
    positive(config, "eval.every", allow_zero=True)
    positive(config, "total_rollouts", allow_zero=True)
    r, b = rollouts_per_step(config), config.train.batch_size
    require(
        config.replay.capacity >= b,
        f"replay.capacity={config.replay.capacity} is smaller than train.batch_size={b}: "
        "capacity must be >= the batch",
    )
    # Replay keeps at least one step's fresh rollouts (on-policy: N = B = R).
    require(
        config.replay.capacity >= r,
        f"R = rollout.prompts_per_step x rollout.group_size = "
        f"{config.rollout.prompts_per_step} x {config.rollout.group_size} = {r} fresh rollouts "
        f"a step exceeds replay.capacity={config.replay.capacity}: the buffer must hold one "
        "step's rollouts (R <= replay.capacity)",
    )
    require(
        config.rollout.group_size >= 2,
        f"rollout.group_size={config.rollout.group_size}: group advantages compare completions "
        "of one prompt, so a group needs >= 2 (with 1 every advantage is 0)",
    )
    require(
        config.rollout.temperature > 0,
        f"rollout.temperature={config.rollout.temperature}: must be > 0 (at 0 the G "
        "completions of a prompt are the same greedy one and every advantage is 0)",
    )
    # Numbers and their ranges.
    for key, bounds in (
        ("seed", dict(low=0, integer=True)),
        ("log_every", dict(low=1, integer=True)),
        ("checkpoint_keep", dict(low=1, integer=True)),
        ("rollout.temperature", dict(low=0, low_open=True)),
        ("rollout.top_k", dict(low=0, integer=True)),
        ("rollout.top_p", dict(low=0, low_open=True, high=1)),
        ("optimizer.learning_rate", dict(low=0, low_open=True)),
        ("optimizer.b1", dict(low=0, high=1, high_open=True)),
        ("optimizer.b2", dict(low=0, high=1, high_open=True)),
        ("optimizer.weight_decay", dict(low=0)),
        ("optimizer.grad_clip", dict(low=0)),
        ("optimizer.warmup_steps", dict(low=0, integer=True)),
        ("loss.epsilon_low", dict(low=0, high=1, high_open=True)),
        ("loss.epsilon_high", dict(low=0)),
        ("loss.dual_clip", dict(low=0)),
        ("loss.rho_max", dict(low=0, low_open=True)),
        ("loss.kl_coef", dict(low=0)),
        ("loss.entropy_coef", dict()),
        ("replay.delta", dict(low=0, high=1)),
        ("replay.max_age", dict(low=0, integer=True)),
        ("replay.max_reuse", dict(low=0, integer=True)),
        ("replay.mu", dict(low=0)),
        ("eval.pass_k", dict(low=0, integer=True)),
        ("eval.pass_k_prompts", dict(low=0, integer=True)),
        ("warmstart.learning_rate", dict(low=0, low_open=True)),
        ("warmstart.batch_size", dict(low=1, integer=True)),
        ("warmstart.max_steps", dict(low=1, integer=True)),
        ("warmstart.eval_every", dict(low=1, integer=True)),
    ):
        number(config, key, **bounds)
    # Examples written of each split; 0 takes all that a file-backed task has.
    for key, least in (
        ("task.num_train", config.rollout.prompts_per_step),
        ("task.num_test", config.eval.num_prompts),
    ):
        number(config, key, low=0, integer=True)
        if config.task[key.split(".")[1]]:
            number(config, key, low=least, integer=True)
    one_of(config, "tokenizer.name", TOKENIZERS)
    one_of(config, "model.init", INITS)
    checkpoint = config.model.checkpoint
    require(
        (config.model.init == "checkpoint") == bool(checkpoint),
        f"model.init={config.model.init!r} with model.checkpoint={checkpoint!r}: "
        "model.init='checkpoint' goes with a model.checkpoint directory, and only with one",
    )
    if checkpoint:
        require(os.path.isdir(checkpoint), f"model.checkpoint={checkpoint!r}: no such directory")
    if config.tokenizer.path:
        require(
            os.path.exists(config.tokenizer.path),
            f"tokenizer.path={config.tokenizer.path!r}: no such file or directory",
        )

    # Choices.
    one_of(config, "replay.strategy", replay_lib.STRATEGIES)
    one_of(config, "replay.sample_mode", replay_lib.SAMPLE_MODES)
    one_of(config, "replay.mode", REPLAY_MODES)
    if config.replay.mode == "auto":
        require(
            b % 2 == 0,
            f"train.batch_size={b} with replay.mode='auto': the batch splits into two "
            "halves, so it must be even",
        )
        positive(config, "replay.auto_every")
        one_of(config, "replay.auto_design", tuple(auto_replay.DESIGNS))
        require(
            config.replay.auto_max_y * r >= b,
            f"replay.auto_max_y={config.replay.auto_max_y} is below B / R = {b / r:g}, the "
            "replay ratio of generating every step: it must be >= B / R",
        )
    one_of(config, "loss.name", objectives.LOSSES)
    one_of(config, "loss.aggregation", objectives.AGGREGATIONS)
    one_of(config, "model.dtype", tuple(model_lib.DTYPES))
    one_of(config, "model.param_dtype", tuple(model_lib.DTYPES))
    for key in ("dtype", "cache_dtype"):
        if config.rollout.get(key):
            one_of(config, f"rollout.{key}", tuple(model_lib.DTYPES))
    for key, low in (
        ("train.num_microbatches", 1),
        ("train.logits_chunk_size", 0),
        ("rollout.top_p_candidates", 1),
    ):
        if key.split(".")[1] in config[key.split(".")[0]]:
            number(config, key, low=low, integer=True)
    if config.task.data_dir:
        require(
            os.path.isdir(config.task.data_dir),
            f"task.data_dir={config.task.data_dir!r} does not exist",
        )
    total_len = seq_len(config)
    require(
        total_len <= config.model.max_len,
        f"rollout.max_prompt_len + rollout.max_new_tokens = {total_len} exceeds "
        f"model.max_len={config.model.max_len}",
    )

    # Library-level validation, re-raised as one-line config errors.
    try:
        tokenizer = make_tokenizer(config)
        task = make_task_from_config(config, tokenizer)
        # A file-backed task reads its data here: a missing or malformed file is named
        # now, not after the data build.
        for split in ("train", "test"):
            task.examples(split, 1, config.task.data_seed)
        longest = {"prompt": task.max_prompt_chars(), "answer": task.max_answer_chars()}
        mcfg = model_config(config)
        loss_config(config)
        optimizer_config(config)
        warmstart_config(config)
        replay_lib.make_replay_buffer(**replay_buffer_kwargs(config))
        sharding.validate_rules(config.mesh.rules)
        shards = data_shards(config)
        attention.check_attention_backend(mcfg, jax.default_backend())
    except TypeError as e:  # a task factory given keys it does not take
        raise ConfigError(f"task.name={config.task.name!r}: {e}") from None
    except (ValueError, OSError, ImportError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    try:
        sampler_shape = sharding.validate_mesh_shape(sampler_mesh_shape(config), jax.device_count())
    except ValueError as e:
        message = str(e).splitlines()[0].replace("mesh.shape", "rollout.mesh_shape", 1)
        raise ConfigError(message) from None

    require(
        mcfg.vocab_size >= tokenizer.vocab_size,
        f"model.vocab_size={mcfg.vocab_size} is smaller than the tokenizer's "
        f"vocabulary ({tokenizer.vocab_size} ids): it must be >= {tokenizer.vocab_size}",
    )

    # Prompts and answers must fit: prompts are never truncated. A byte-level tokenizer
    # spends one token per character; BOS and EOS take one more each.
    if config.tokenizer.name == "byte":
        for chars, key, what, extra in (
            (longest["prompt"], "rollout.max_prompt_len", "prompt", "BOS"),
            (longest["answer"], "rollout.max_new_tokens", "answer", "EOS"),
        ):
            if chars is not None:
                require(
                    chars + 1 <= config.rollout[key.split(".")[1]],
                    f"{key}={config.rollout[key.split('.')[1]]} is shorter than the task's "
                    f"longest {what} ({chars + 1} tokens with {extra})",
                )

    # Attention heads split over the tensor axis, of training's mesh and of the sampler's;
    # each process reads its own block of every batch of prompts.
    for mesh_key, shape in (
        ("mesh.shape", config.mesh.shape),
        ("rollout.mesh_shape", sampler_shape),
    ):
        for key, value, logical in (
            ("model.num_heads", mcfg.num_heads, "heads"),
            ("model.num_kv_heads", mcfg.num_kv_heads, "kv_heads"),
        ):
            split = logical_shards(config, logical, shape=shape)
            require(
                value % split == 0,
                f"{key}={value} is not divisible by the {split} shards of '{logical}' on "
                f"{mesh_key}={tuple(shape)}: use a multiple of {split} or a smaller tensor axis",
            )
    # Auto mode takes the gradient of each half of the batch: each half is split.
    micro = config.train.get("num_microbatches", 1)
    split = b // 2 if config.replay.mode == "auto" else b
    what = "half of train.batch_size" if config.replay.mode == "auto" else "train.batch_size"
    require(
        split % micro == 0 and (split // micro) % shards == 0,
        f"train.num_microbatches={micro}: must divide {what}={split} into microbatches "
        f"that split over the {shards} data shards",
    )
    require(
        micro == 1 or config.loss.name != "m2po",
        f"train.num_microbatches={micro} with loss.name='m2po': m2po masks tokens over the "
        "whole batch, so it needs train.num_microbatches=1",
    )
    require(
        r % sampler_data_shards(config, sampler_shape) == 0,
        f"rollout R = prompts_per_step x group_size={r} is not divisible by the "
        f"{sampler_data_shards(config, sampler_shape)} data shards of rollout.mesh_shape="
        f"{tuple(sampler_shape)}",
    )
    require(
        config.rollout.prompts_per_step % jax.process_count() == 0,
        f"rollout.prompts_per_step={config.rollout.prompts_per_step} is not divisible by the "
        f"{jax.process_count()} processes: each process reads as many prompts",
    )

    # Every batch splits over the data shards. The pass@k evaluation samples pass_k
    # completions of its first pass_k_prompts prompts.
    pass_k_rows = min(config.eval.pass_k_prompts, config.eval.num_prompts) * config.eval.pass_k
    for key, value in (
        ("rollout R = prompts_per_step x group_size", r),
        ("train.batch_size", b),
        ("replay.capacity", config.replay.capacity),
        ("eval.num_prompts", config.eval.num_prompts),
        ("eval.pass_k_prompts x eval.pass_k (rows sampled for pass@k)", pass_k_rows),
    ):
        require(
            value % shards == 0,
            f"{key}={value} is not divisible by the {shards} data shards of mesh.shape="
            f"{tuple(config.mesh.shape)}",
        )
    return Validated(model_config=mcfg, tokenizer=tokenizer, task=task)
