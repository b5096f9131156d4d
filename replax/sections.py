"""The run spec's sections: one frozen dataclass per section of the config files.

Each mirrors one section of a config (model, tokenizer, mesh, task, warmstart, rollout,
train, optimizer, replay, loss, eval, log) and checks its own fields in `__post_init__`,
raising ConfigError with one line naming the key and what is allowed. Methods give the
library's arguments (`LossSection.config()` -> objectives.LossConfig, ...). A section
builds no tokenizer or task and asks JAX for no devices: `replax.configuration.build`
does. `replax.spec.RunSpec` holds them and runs the rules across sections.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from replax import auto_replay, objectives, sharding
from replax import model as model_lib
from replax import replay as replay_lib
from replax import train_step as train_step_lib
from replax import warmstart as warmstart_lib
from replax.config_utils import ConfigError, did_you_mean, number, one_of, positive, require

# task.* keys that say where and how much data to build; every other task.* key is an
# argument of the task's factory.
TASK_DATA_KEYS = ("name", "data_dir", "num_train", "num_test", "data_seed", "long_prompts")
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
    "lora_rank",
    "lora_alpha",
    "lora_targets",
)
LORA_KEYS = ("lora_rank", "lora_alpha", "lora_targets")
INITS = ("random", "warmstart", "checkpoint")
TOKENIZERS = ("byte", "hf")
# What a prompt longer than rollout.max_prompt_len does: stop the run before any compute,
# or leave the data set (counted and reported).
LONG_PROMPTS = ("error", "skip")
REPLAY_MODES = ("fixed", "auto")
# rollout.placement: the sampler on the trainer's devices, one phase after the other, or on
# devices of its own, generating while the trainer steps (replax.placement).
PLACEMENTS = ("colocated", "disjoint")


def library_check(make):
    """make() with the library's own ValueError re-raised as a one-line ConfigError."""
    try:
        return make()
    except ValueError as e:
        raise ConfigError(str(e).splitlines()[0]) from None


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """The policy: how it starts and, in `architecture`, every other model.* key (the
    ModelConfig fields; with a checkpoint only CHECKPOINT_OVERRIDES of them apply)."""

    init: str
    checkpoint: str
    architecture: Mapping[str, Any]

    def __post_init__(self):
        one_of("model.init", self.init, INITS)
        require(
            (self.init == "checkpoint") == bool(self.checkpoint),
            f"model.init={self.init!r} with model.checkpoint={self.checkpoint!r}: "
            "model.init='checkpoint' goes with a model.checkpoint directory, and only with one",
        )
        if self.checkpoint:
            require(
                not _is_gguf(self.checkpoint),
                f"model.checkpoint={self.checkpoint!r} is a GGUF file: convert it to a Hugging "
                "Face directory first (python scripts/gguf_to_hf.py --gguf=FILE --out=DIR) "
                "and give that directory",
            )
            require(
                os.path.isdir(self.checkpoint),
                f"model.checkpoint={self.checkpoint!r}: no such directory",
            )
        require("max_len" in self.architecture, "model.max_len is missing: the longest sequence")
        for key in ("dtype", "param_dtype"):
            if key in self.architecture:
                one_of(f"model.{key}", self.architecture[key], tuple(model_lib.DTYPES))
        # The LoRA keys check themselves with a checkpoint too, before anything is read.
        lora_keys = {k: self.architecture[k] for k in LORA_KEYS if k in self.architecture}
        library_check(lambda: model_lib.ModelConfig(**lora_keys))
        if not self.checkpoint:  # the architecture is the model.* keys: it checks itself
            self.config()

    @property
    def max_len(self) -> int:
        return self.architecture["max_len"]

    def config(self) -> model_lib.ModelConfig:
        """The ModelConfig of the model.* keys (without a checkpoint)."""
        try:
            return model_lib.ModelConfig(**self.architecture)
        except TypeError as e:  # a key ModelConfig does not have
            known = [f"model.{f.name}" for f in dataclasses.fields(model_lib.ModelConfig)]
            unknown = sorted(f"model.{k}" for k in self.architecture if f"model.{k}" not in known)
            if not unknown:
                raise ConfigError(f"model.*: {e}") from None
            raise ConfigError(
                f"unknown config key {unknown[0]}{did_you_mean(unknown[0], known)}: the "
                "model.* keys are ModelConfig's fields (replax/model_config.py)"
            ) from None
        except ValueError as e:
            raise ConfigError(str(e).splitlines()[0]) from None

    def checkpoint_overrides(self) -> dict[str, Any]:
        """The model.* keys that apply over a checkpoint's config.json."""
        return {k: self.architecture[k] for k in CHECKPOINT_OVERRIDES if k in self.architecture}


@dataclasses.dataclass(frozen=True)
class TokenizerSection:
    """'byte' (one token per UTF-8 byte) or 'hf' (tokenizer.json of `path`, by default
    model.checkpoint)."""

    name: str
    path: str

    def __post_init__(self):
        one_of("tokenizer.name", self.name, TOKENIZERS)
        if self.path:
            require(
                os.path.exists(self.path),
                f"tokenizer.path={self.path!r}: no such file or directory",
            )


@dataclasses.dataclass(frozen=True)
class MeshSection:
    """The (data, fsdp, tensor) device mesh and the logical-axis rule table."""

    shape: tuple[int, ...]
    rules: tuple

    def __post_init__(self):
        # From a config.json the shape and rules are lists: the spec holds tuples.
        object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(
            self,
            "rules",
            tuple((n, tuple(a) if isinstance(a, list) else a) for n, a in self.rules),
        )
        library_check(lambda: sharding.validate_rules(self.rules))


def _is_gguf(path: str) -> bool:
    """A llama.cpp GGUF file: by its magic bytes (or its name, when unreadable)."""
    if not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return path.lower().endswith(".gguf")


@dataclasses.dataclass(frozen=True)
class TaskSection:
    """The task of `name` (its factory takes `kwargs`, the other task.* keys) and how much
    of its data to build where."""

    name: str
    data_dir: str
    num_train: int
    num_test: int
    data_seed: int
    long_prompts: str
    kwargs: Mapping[str, Any]

    def __post_init__(self):
        one_of("task.long_prompts", self.long_prompts, LONG_PROMPTS)
        for key in ("num_train", "num_test"):
            number(f"task.{key}", getattr(self, key), low=0, integer=True)
        if self.data_dir:
            require(os.path.isdir(self.data_dir), f"task.data_dir={self.data_dir!r} does not exist")

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in TASK_DATA_KEYS}
        return {**data, **self.kwargs}


@dataclasses.dataclass(frozen=True)
class WarmstartSection:
    """Supervised warm start (model.init='warmstart') and where its base is cached."""

    min_accuracy: float
    max_accuracy: float
    max_steps: int
    batch_size: int
    learning_rate: float
    eval_every: int
    cache_dir: str

    def __post_init__(self):
        number("warmstart.learning_rate", self.learning_rate, low=0, low_open=True)
        for key in ("batch_size", "max_steps", "eval_every"):
            number(f"warmstart.{key}", getattr(self, key), low=1, integer=True)
        library_check(self.config)

    def config(self) -> warmstart_lib.WarmStartConfig:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del fields["cache_dir"]
        return warmstart_lib.WarmStartConfig(**fields)


@dataclasses.dataclass(frozen=True)
class RolloutSection:
    """R = prompts_per_step x group_size fresh rollouts a step: lengths, sampling,
    numerics and the sampler's mesh (empty: the training mesh)."""

    prompts_per_step: int
    group_size: int
    max_prompt_len: int
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    top_p_candidates: int
    dtype: str
    cache_dtype: str
    mesh_shape: tuple[int, ...]
    placement: str
    num_devices: int
    sync_every: int
    max_policy_lag: int

    def __post_init__(self):
        object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
        one_of("rollout.placement", self.placement, PLACEMENTS)
        number("rollout.num_devices", self.num_devices, low=0, integer=True)
        number("rollout.sync_every", self.sync_every, low=1, integer=True)
        number("rollout.max_policy_lag", self.max_policy_lag, low=0, integer=True)
        for key in ("prompts_per_step", "group_size", "max_prompt_len", "max_new_tokens"):
            positive(f"rollout.{key}", getattr(self, key))
        require(
            self.group_size >= 2,
            f"rollout.group_size={self.group_size}: group advantages compare completions "
            "of one prompt, so a group needs >= 2 (with 1 every advantage is 0)",
        )
        require(
            self.temperature > 0,
            f"rollout.temperature={self.temperature}: must be > 0 (at 0 the G "
            "completions of a prompt are the same greedy one and every advantage is 0)",
        )
        number("rollout.temperature", self.temperature, low=0, low_open=True)
        number("rollout.top_k", self.top_k, low=0, integer=True)
        number("rollout.top_p", self.top_p, low=0, low_open=True, high=1)
        for key in ("dtype", "cache_dtype"):
            if getattr(self, key):
                one_of(f"rollout.{key}", getattr(self, key), tuple(model_lib.DTYPES))
        number("rollout.top_p_candidates", self.top_p_candidates, low=1, integer=True)

    @property
    def rollouts(self) -> int:
        return self.prompts_per_step * self.group_size

    def numerics(self) -> dict[str, Any]:
        """The decoding weights' and KV cache's dtypes (None: the model's compute dtype)."""
        return dict(dtype=self.dtype or None, cache_dtype=self.cache_dtype or None)

    def sampler_kwargs(self) -> dict[str, Any]:
        """make_sampler's sampling, length and numerics arguments (not its mesh)."""
        return dict(
            max_prompt_len=self.max_prompt_len,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            top_p_candidates=self.top_p_candidates,
            **self.numerics(),
        )


@dataclasses.dataclass(frozen=True)
class TrainSection:
    """The learner's batch B and its memory settings."""

    batch_size: int
    num_microbatches: int
    logits_chunk_size: int
    max_steps_per_generation: int

    def __post_init__(self):
        positive("train.batch_size", self.batch_size)
        number("train.max_steps_per_generation", self.max_steps_per_generation, low=1, integer=True)
        number("train.num_microbatches", self.num_microbatches, low=1, integer=True)
        number("train.logits_chunk_size", self.logits_chunk_size, low=0, integer=True)


@dataclasses.dataclass(frozen=True)
class OptimizerSection:
    """Adam(W) with clipping and a schedule (its length is RunSpec.total_steps)."""

    learning_rate: float
    schedule: str
    warmup_steps: int
    weight_decay: float
    grad_clip: float
    b1: float
    b2: float
    state_dtype: str

    def __post_init__(self):
        number("optimizer.learning_rate", self.learning_rate, low=0, low_open=True)
        for key in ("b1", "b2"):
            number(f"optimizer.{key}", getattr(self, key), low=0, high=1, high_open=True)
        number("optimizer.weight_decay", self.weight_decay, low=0)
        number("optimizer.grad_clip", self.grad_clip, low=0)
        number("optimizer.warmup_steps", self.warmup_steps, low=0, integer=True)
        one_of("optimizer.schedule", self.schedule, train_step_lib.SCHEDULES)
        one_of("optimizer.state_dtype", self.state_dtype, train_step_lib.STATE_DTYPES)

    def config(self, total_steps: int) -> train_step_lib.OptimizerConfig:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return train_step_lib.OptimizerConfig(total_steps=total_steps, **fields)


@dataclasses.dataclass(frozen=True)
class ReplaySection:
    """The replay store (capacity N, sampling strategy, limits) and auto mode's settings."""

    mode: str
    capacity: int
    strategy: str
    sample_mode: str
    delta: float
    recency_tau: float
    priority_alpha: float
    priority_beta: float
    max_age: int
    max_reuse: int
    drop_zero_advantage: bool
    mu: float
    auto_every: int
    auto_max_y: float
    auto_design: str

    def __post_init__(self):
        positive("replay.capacity", self.capacity)
        number("replay.delta", self.delta, low=0, high=1)
        for key in ("max_age", "max_reuse"):
            number(f"replay.{key}", getattr(self, key), low=0, integer=True)
        number("replay.mu", self.mu, low=0)
        one_of("replay.strategy", self.strategy, replay_lib.STRATEGIES)
        one_of("replay.sample_mode", self.sample_mode, replay_lib.SAMPLE_MODES)
        one_of("replay.mode", self.mode, REPLAY_MODES)
        if self.mode == "auto":
            positive("replay.auto_every", self.auto_every)
            one_of("replay.auto_design", self.auto_design, tuple(auto_replay.DESIGNS))

    def buffer_kwargs(self) -> dict[str, Any]:
        """make_replay_buffer's arguments, less num_shards (set by the mesh)."""
        return dict(
            capacity=self.capacity,
            strategy=self.strategy,
            sample_mode=self.sample_mode,
            delta=self.delta,
            recency_tau=self.recency_tau,
            priority_alpha=self.priority_alpha,
            priority_beta=self.priority_beta,
            max_age=self.max_age or None,
            max_reuse=self.max_reuse or None,
        )


@dataclasses.dataclass(frozen=True)
class LossSection:
    """The objective on (possibly stale) rollouts and how advantages are normalised."""

    name: str
    epsilon_low: float
    epsilon_high: float
    dual_clip: float
    rho_max: float
    asymre_delta_v: float
    m2po_tau: float
    kl_coef: float
    entropy_coef: float
    aggregation: str
    normalize_std: bool
    positive_weight: float
    cov_clip_frac: float

    def __post_init__(self):
        number("loss.epsilon_low", self.epsilon_low, low=0, high=1, high_open=True)
        for key in ("epsilon_high", "dual_clip", "kl_coef"):
            number(f"loss.{key}", getattr(self, key), low=0)
        number("loss.rho_max", self.rho_max, low=0, low_open=True)
        number("loss.entropy_coef", self.entropy_coef)
        number("loss.positive_weight", self.positive_weight, low=0, low_open=True)
        number("loss.cov_clip_frac", self.cov_clip_frac, low=0, high=1, high_open=True)
        one_of("loss.name", self.name, objectives.LOSSES)
        one_of("loss.aggregation", self.aggregation, objectives.AGGREGATIONS)
        library_check(self.config)

    def config(self) -> objectives.LossConfig:
        return objectives.LossConfig(
            name=self.name,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            dual_clip=self.dual_clip or None,
            rho_max=self.rho_max,
            delta_v=self.asymre_delta_v,
            m2po_tau=self.m2po_tau,
            kl_coef=self.kl_coef,
            entropy_coef=self.entropy_coef,
            aggregation=self.aggregation,
            positive_weight=self.positive_weight,
            cov_clip_frac=self.cov_clip_frac,
        )


@dataclasses.dataclass(frozen=True)
class EvalSection:
    """Held-out evaluation: greedy pass@1 on num_prompts, pass@k on pass_k_prompts, and
    the first num_samples prompts' greedy completions written to samples.jsonl."""

    every: int
    num_prompts: int
    pass_k: int
    pass_k_prompts: int
    num_samples: int
    # Rows decoded per call (0: all of a kind at once): bounds evaluation's KV cache.
    max_rows: int = 0

    def __post_init__(self):
        positive("eval.every", self.every, allow_zero=True)
        positive("eval.num_prompts", self.num_prompts)
        for key in ("pass_k", "pass_k_prompts", "num_samples", "max_rows"):
            number(f"eval.{key}", getattr(self, key), low=0, integer=True)
        if self.max_rows and self.num_prompts > self.max_rows:
            require(
                self.num_prompts % self.max_rows == 0,
                f"eval.max_rows={self.max_rows}: must divide eval.num_prompts="
                f"{self.num_prompts} (0: decode all rows at once)",
            )
        prompts = min(self.pass_k_prompts, self.num_prompts)
        if self.max_rows and self.pass_k and prompts * self.pass_k > self.max_rows:
            per_block = self.max_rows // self.pass_k
            require(
                self.max_rows % self.pass_k == 0 and per_block and prompts % per_block == 0,
                f"eval.max_rows={self.max_rows}: must be a multiple of eval.pass_k="
                f"{self.pass_k} whose prompts divide eval.pass_k_prompts={prompts} "
                "(0: decode all rows at once)",
            )

    def blocks(self, prompts: int, rows_per_prompt: int) -> int:
        """How many calls decode `prompts` x `rows_per_prompt` rows, at most max_rows each."""
        if not self.max_rows or prompts * rows_per_prompt <= self.max_rows:
            return 1
        return prompts * rows_per_prompt // self.max_rows

    @property
    def pass_k_rows(self) -> int:
        """Rows sampled for pass@k: pass_k completions of the first pass_k_prompts."""
        return min(self.pass_k_prompts, self.num_prompts) * self.pass_k


@dataclasses.dataclass(frozen=True)
class LogSection:
    """What the run prints: off a terminal, a progress line at most every print_every_s
    seconds (0: every step) and at the last step."""

    print_every_s: float
    # Mirror metrics.jsonl to Weights & Biases (the `wandb` extra), in wandb_mode:
    # 'offline' (files under WORKDIR/wandb, `wandb sync` later) or 'online'.
    wandb: bool = False
    wandb_mode: str = "offline"

    def __post_init__(self):
        number("log.print_every_s", self.print_every_s, low=0)
        one_of("log.wandb", self.wandb, (False, True))
        one_of("log.wandb_mode", self.wandb_mode, ("offline", "online"))
        if self.wandb:
            import importlib.util

            require(
                importlib.util.find_spec("wandb") is not None,
                "log.wandb=True needs the wandb package: pip install -e '.[wandb]'",
            )
