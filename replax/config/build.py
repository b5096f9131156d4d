"""The build step: from a checked run spec to what a run is made of, checked before any
compute.

`build(spec)` makes, once, the tokenizer, the task (a file-backed task reads its data file
here: a missing or malformed file is named now, not after the data build) and the
policy's ModelConfig (with model.checkpoint, from its config.json), then runs the rules of
`replax.config.validation` that need them or the machine. `validate(config)` parses a ConfigDict
and builds it: every check there is, for scripts that check configs before running them.
`fit_task_section` works on the ConfigDict itself, before it is parsed: it fits the task
section to a task.name given on the command line.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections

from replax.config import sections, validation
from replax.config import spec as spec_lib
from replax.config.spec import RunSpec
from replax.core.config_utils import ConfigError, did_you_mean, require
from replax.model import attention
from replax.model import transformer as model_lib
from replax.replay import auto as auto_replay
from replax.replay import schedules
from replax.tasks import Task, resolve_factory
from replax.tasks import make_task as make_named_task
from replax.text.tokenizer import ByteTokenizer, prompt_lengths


def model_config(model: sections.ModelSection) -> model_lib.ModelConfig:
    """The policy's ModelConfig: the model.* keys, or with model.checkpoint the
    checkpoint's config.json with CHECKPOINT_OVERRIDES from model.*."""
    if model.checkpoint:
        from replax.hf import config as hf_config

        return hf_config.read_config(model.checkpoint, **model.checkpoint_overrides())
    return model.config()


def make_tokenizer(tokenizer: sections.TokenizerSection, model: sections.ModelSection):
    """tokenizer.name -> the tokenizer: 'byte' (one token per UTF-8 byte) or 'hf' (the
    tokenizer.json, chat template and stop ids of tokenizer.path, by default the
    model.checkpoint directory)."""
    if tokenizer.name == "byte":
        return ByteTokenizer()
    from replax.text.hf_tokenizer import HFTokenizer

    path = tokenizer.path or model.checkpoint
    if not path:
        raise ConfigError("tokenizer.name='hf' needs tokenizer.path or model.checkpoint")
    return HFTokenizer(path)


def make_task(task: sections.TaskSection, tokenizer) -> Task:
    """The task of task.name with its task.* keys; a factory that takes a `tokenizer`
    argument (GSM8K and MATH: prompts through the chat template) gets the run's."""
    kwargs = dict(task.kwargs)
    parameters = inspect.signature(resolve_factory(task.name)).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if "tokenizer" in parameters or takes_any:
        kwargs["tokenizer"] = tokenizer
    return make_named_task(task.name, **kwargs)


def make_schedule(spec: RunSpec) -> schedules.Schedule:
    """When to generate: every step (replay.mode='fixed') or as auto mode plans."""
    rc = spec.replay
    if rc.mode == "fixed":
        return schedules.EveryStep(rc.max_age or None)
    return auto_replay.AutoReplayController(
        rollouts_per_generation=spec.rollouts_per_step,
        batch_size=spec.train.batch_size,
        capacity=rc.capacity,
        mu_override=rc.mu or None,
        update_every=rc.auto_every,
        max_period=spec.auto_max_period,
        design=rc.auto_design,
        min_y=rc.auto_min_y or None,
        onpolicy_batch=int(rc.auto_onpolicy_batches) * spec.train.batch_size,
    )


@dataclasses.dataclass(frozen=True)
class Built:
    """What the build step made, for `run.build` to use as is: a file-backed task reads
    its data file once per run."""

    model_config: model_lib.ModelConfig
    tokenizer: Any
    task: Task
    # task.long_prompts='skip': the records left out of each split (indices in the split's
    # generation order, the data build's) and each split's size before; empty otherwise.
    skipped_prompts: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    split_sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)


def build(spec: RunSpec, num_devices: int | None = None) -> Built:
    """The tokenizer, task and ModelConfig of a spec, checked with the rules that need
    them and the machine (the devices JAX sees, unless num_devices says)."""
    num_devices = jax.device_count() if num_devices is None else num_devices
    # The device counts first: a run that cannot be placed fails before any file is read.
    validation.placement_devices(spec, num_devices, jax.process_count())
    try:  # the library's checks, re-raised as one-line config errors
        tokenizer = make_tokenizer(spec.tokenizer, spec.model)
        task = make_task(spec.task, tokenizer)
        for split in ("train", "test"):
            task.examples(split, 1, spec.task.data_seed)
        prompts = {}
        if not validation.prompts_fit_by_bound(spec, task.max_prompt_chars()):
            prompts = split_prompts(spec, task)
        lengths = {split: prompt_lengths(tokenizer, texts) for split, texts in prompts.items()}
        mcfg = model_config(spec.model)
    except TypeError as e:  # a task factory given keys it does not take
        raise ConfigError(task_keys_error(spec.task, e)) from None
    except (ValueError, OSError, ImportError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    validation.validate_vocab(mcfg, tokenizer)
    skipped = validation.long_prompts(spec, prompts, lengths)
    validation.validate_answers_fit(spec, task.max_answer_chars())
    check_machine(spec, mcfg, num_devices, jax.process_count(), jax.default_backend())
    train_devices, _ = validation.placement_devices(spec, num_devices, jax.process_count())
    check_split_sizes(
        spec,
        whole_split_sizes(spec, task),
        validation.data_shards(spec, train_devices),
        task_source(spec.task),
    )
    check_engine_memory(spec, mcfg, num_devices, jax.process_count())
    return Built(
        model_config=mcfg,
        tokenizer=tokenizer,
        task=task,
        skipped_prompts=skipped,
        split_sizes={split: len(texts) for split, texts in prompts.items()} if skipped else {},
    )


def check_machine(
    spec: RunSpec, mcfg: model_lib.ModelConfig, num_devices: int, processes: int, platform: str
) -> None:
    """The rules between a spec and the machine it runs on: num_devices devices over
    `processes` processes of `platform` ('cpu', 'gpu', 'tpu'); `build` passes what JAX
    sees, scripts/tpu_compile.py a TPU topology's."""
    train_devices, sampler_devices = validation.placement_devices(spec, num_devices, processes)
    try:
        shards = validation.data_shards(spec, train_devices)
        attention.check_attention_backend(mcfg, platform)
    except ValueError as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    sampler_shape = validation.sampler_mesh(spec, sampler_devices)
    validation.validate_heads_split(spec, mcfg, sampler_shape, train_devices, sampler_devices)
    validation.validate_microbatches(spec, shards)
    validation.validate_rollout_batch(spec, sampler_shape, sampler_devices, processes)
    validation.validate_data_shards(spec, shards)


def check_engine_memory(spec: RunSpec, mcfg, num_devices: int, processes: int) -> None:
    """The rollout engine's cache against the memory the devices report (accelerators
    report it; a CPU does not, and nothing is checked)."""
    if not spec.rollout.slots:
        return
    stats = jax.local_devices()[0].memory_stats() or {}
    _, sampler_devices = validation.placement_devices(spec, num_devices, processes)
    sampler_shape = validation.sampler_mesh(spec, sampler_devices)
    validation.validate_engine_cache(
        spec, mcfg, sampler_shape, sampler_devices, stats.get("bytes_limit")
    )


def split_prompts(spec: RunSpec, task: Task) -> dict[str, list[str]]:
    """Every prompt of the data set, per split, as the data build writes it (the task's
    examples with task.num_* and task.data_seed: formatted, chat template and all)."""
    sizes = {"train": spec.task.num_train, "test": spec.task.num_test}
    return {
        split: [e.prompt for e in task.examples(split, num, spec.task.data_seed)]
        for split, num in sizes.items()
    }


def whole_split_sizes(spec: RunSpec, task: Task) -> dict[str, int]:
    """The size of each split that the data set takes whole (task.num_* = 0: all a
    file-backed task holds), known only once the task is read."""
    sizes = {"train": spec.task.num_train, "test": spec.task.num_test}
    return {
        split: len(task.examples(split, 0, spec.task.data_seed))
        for split, num in sizes.items()
        if num == 0
    }


def task_source(task: sections.TaskSection) -> str:
    """Where a task's examples come from, as a message names it."""
    path = task.kwargs.get("data_path", "")
    return f"task.data_path={path!r}" if path else f"task {task.name}"


def check_split_sizes(spec: RunSpec, sizes: Mapping[str, int], shards: int, source: str) -> None:
    """The splits taken whole (sizes: split -> count, from `whole_split_sizes`) hold a
    step's prompts, the warm start's demonstrations and the evaluation's prompts (a
    multiple of the data shards): one line naming the key and a value that fits."""
    train, test = sizes.get("train"), sizes.get("test")
    if train is not None:
        least = spec.rollout.prompts_per_step
        require(
            least <= train,
            f"rollout.prompts_per_step={least} is more than the {train} train examples of "
            f"{source}: set rollout.prompts_per_step to {train} or less",
        )
        pool = spec.warmstart.num_examples
        require(
            spec.model.init != "warmstart" or pool <= train,
            f"warmstart.num_examples={pool} is more than the {train} train examples of "
            f"{source}: set warmstart.num_examples to {train} or less (0: all of them)",
        )
    if test is None or spec.eval.num_prompts <= test:
        return
    wanted, fits = spec.eval.num_prompts, test // shards * shards
    more = f"eval.num_prompts={wanted} is more than the {test} held-out examples of {source}"
    if fits:
        per_shard = f", a multiple of the {shards} data shards" if shards > 1 else ""
        raise ConfigError(f"{more}: set eval.num_prompts={fits} (or less{per_shard})")
    raise ConfigError(
        f"{more}, and {shards} data shards need at least {shards}: give the task more held-out "
        "examples (with task.name='jsonl', more records or a larger task.test_fraction)"
    )


def task_keys_error(task: sections.TaskSection, error: TypeError) -> str:
    """The line of a task factory called with a key it does not take: the key, the
    closest one it does take, and all of them."""
    try:
        takes = task_factory_keys(resolve_factory(task.name))
    except ValueError:
        takes = None
    unknown = sorted(k for k in task.kwargs if takes is not None and k not in takes)
    if not unknown:
        return f"task.name={task.name!r}: {error}"
    hint = did_you_mean(f"task.{unknown[0]}", [f"task.{k}" for k in takes])
    return (
        f"unknown config key task.{unknown[0]}{hint}: task {task.name} takes "
        f"{', '.join(takes) or 'no task.* keys'}"
    )


def validate(config: ml_collections.ConfigDict) -> Built:
    """Every check of a ConfigDict, before any compute: parse, then build."""
    return build(spec_lib.parse(config))


def _task_kwargs(config: ml_collections.ConfigDict) -> dict[str, Any]:
    return {k: v for k, v in config.task.to_dict().items() if k not in spec_lib.TASK_DATA_KEYS}


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
    for key, value in _task_kwargs(config).items():
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
