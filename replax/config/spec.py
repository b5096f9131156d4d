"""The run spec: a run's ConfigDict read once into frozen sections that check themselves.

`parse(config)` is called once, at the top of a script (or by `replax.run.trainer.train` when
it is handed a ConfigDict); what flows down to `replax.run.assemble` and the library is the
`RunSpec`, never the ConfigDict. Its sections are the config files' sections, each checking
its own fields: the library's own config types where a package has one (the loss, the
optimizer), or a section that inherits it and adds only the run's keys (replay, rollout,
warmstart), so that a setting is written once; the run-wide keys sit on RunSpec itself, and
the rules that span sections are the `validate_*` functions of `replax.config.validation`, run
when a RunSpec is made. A config from an earlier replax goes through
`replax.config.migration.migrate` first. Nothing here builds a tokenizer or a task or asks JAX
for devices: `replax.config.build.build` does that, once, and checks what needs them.
`RunSpec.to_dict()` is the plain dict the config was: the run's config.json.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections

from replax.config import validation
from replax.config.learning import (
    EvalSection,
    ReplaySection,
    RolloutSection,
    TrainSection,
)
from replax.config.migration import migrate
from replax.config.sections import (
    MODEL_RUN_KEYS,
    TASK_DATA_KEYS,
    LogSection,
    MeshSection,
    ModelSection,
    TaskSection,
    TokenizerSection,
    WarmstartSection,
)
from replax.core.config_utils import did_you_mean, number, positive, require
from replax.rl import objectives
from replax.rl import train_step as train_step_lib


def auto_max_period(auto_max_y: float, rollouts: int, batch_size: int) -> int:
    """The longest generation period auto mode may plan: steps between generations that
    keep the replay ratio B x period / R at most auto_max_y (at least 1)."""
    return max(1, int(auto_max_y * rollouts / batch_size))


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run, checked: the run-wide settings and a section per config section."""

    seed: int
    total_steps: int
    total_rollouts: int
    log_every: int
    checkpoint_every: int
    checkpoint_keep: int
    model: ModelSection
    tokenizer: TokenizerSection
    mesh: MeshSection
    task: TaskSection
    warmstart: WarmstartSection
    rollout: RolloutSection
    train: TrainSection
    optimizer: train_step_lib.OptimizerConfig
    replay: ReplaySection
    loss: objectives.LossConfig
    eval: EvalSection
    log: LogSection

    def __post_init__(self):
        for key in ("total_steps", "checkpoint_every"):
            positive(key, getattr(self, key))
        positive("total_rollouts", self.total_rollouts, allow_zero=True)
        number("seed", self.seed, low=0, integer=True)
        for key in ("log_every", "checkpoint_keep"):
            number(key, getattr(self, key), low=1, integer=True)
        if self.optimizer.total_steps != self.total_steps:  # the schedule runs the whole run
            total = dataclasses.replace(self.optimizer, total_steps=self.total_steps)
            object.__setattr__(self, "optimizer", total)
        validation.validate_spec(self)

    @property
    def rollouts_per_step(self) -> int:
        """R = prompts_per_step x group_size fresh rollouts per generating step."""
        return self.rollout.rollouts

    @property
    def seq_len(self) -> int:
        """Tokens of a stored rollout: the prompt (left-padded) and the completion."""
        return self.rollout.max_prompt_len + self.rollout.max_new_tokens

    @property
    def auto_max_period(self) -> int:
        return auto_max_period(
            self.replay.auto_max_y, self.rollouts_per_step, self.train.batch_size
        )

    @property
    def sampler_mesh_shape(self) -> tuple[int, ...]:
        """The sampler's mesh: rollout.mesh_shape, or when it is empty the training mesh
        (disjoint: a data-parallel mesh over the sampler's devices)."""
        if self.rollout.placement == "disjoint":
            return self.rollout.mesh_shape or (-1, 1, 1)
        return self.rollout.mesh_shape or self.mesh.shape

    def to_dict(self) -> dict[str, Any]:
        """The plain dict of the config this spec was parsed from (what config.json holds)."""
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, ModelSection):
                value = {"init": value.init, "checkpoint": value.checkpoint, **value.architecture}
            elif isinstance(value, TaskSection):
                value = value.to_dict()
            elif dataclasses.is_dataclass(value):
                value = {k: getattr(value, k) for k in config_keys(field.name)}
            out[field.name] = value
        return out


SECTIONS = {
    "model": ModelSection,
    "tokenizer": TokenizerSection,
    "mesh": MeshSection,
    "task": TaskSection,
    "warmstart": WarmstartSection,
    "rollout": RolloutSection,
    "train": TrainSection,
    "optimizer": train_step_lib.OptimizerConfig,
    "replay": ReplaySection,
    "loss": objectives.LossConfig,
    "eval": EvalSection,
    "log": LogSection,
}

# Fields of a library config type that are no key of its config section (they keep the
# library's defaults): the optimizer's schedule runs the run's total_steps; the replay
# store's pool sizes and item keys are those of the rollouts the run stores; a run samples
# from the policy's own distribution (no logit bias).
NOT_CONFIG_KEYS = {
    "optimizer": ("total_steps", "eps"),
    "rollout": ("logit_bias",),
    "replay": (
        "positive_bias_size",
        "priority_eps",
        "correct_key",
        "correct_threshold",
        "advantage_key",
    ),
}


def config_keys(section: str) -> list[str]:
    """The keys of a config section: its type's fields, less NOT_CONFIG_KEYS."""
    skip = NOT_CONFIG_KEYS.get(section, ())
    return [f.name for f in dataclasses.fields(SECTIONS[section]) if f.name not in skip]


def _check_keys(section: str, given, names) -> None:
    """A key the section (or the run-wide keys, section '') does not have, or one it lacks,
    is one line."""
    where = f"{section}." if section else ""
    unknown = sorted(set(given) - set(names))
    if unknown:
        owner = section or "the run-wide keys"
        hint = did_you_mean(f"{where}{unknown[0]}", [f"{where}{n}" for n in names])
        require(
            False,
            f"unknown config key {where}{unknown[0]}{hint}: {owner} has {', '.join(names)}",
        )
    missing = [k for k in names if k not in given]
    require(not missing, f"config key {where}{missing[0] if missing else ''} is missing")


def _section(name: str, values: Mapping[str, Any]):
    """A section from its config keys (model.* and task.* keep the keys of the
    architecture and of the task's factory in one field)."""
    cls = SECTIONS[name]
    values = dict(values)
    if cls is ModelSection:
        run = {k: values.pop(k) for k in MODEL_RUN_KEYS if k in values}
        values = {**run, "architecture": values}
    elif cls is TaskSection:
        data = {k: values.pop(k) for k in TASK_DATA_KEYS if k in values}
        values = {**data, "kwargs": values}
    _check_keys(name, values, config_keys(name))
    return cls(**values)


def parse(config: ml_collections.ConfigDict | Mapping[str, Any]) -> RunSpec:
    """The checked RunSpec of a ConfigDict (or its plain dict, e.g. a config.json), after
    `replax.config.migration.migrate`; raises ConfigError, one line naming the key."""
    values = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
    values = migrate(dict(values))
    sections = {}
    for name in SECTIONS:
        require(isinstance(values.get(name), Mapping), f"config section {name}.* is missing")
        sections[name] = _section(name, values.pop(name))
    _check_keys("", values, [f.name for f in dataclasses.fields(RunSpec) if f.name not in SECTIONS])
    return RunSpec(**values, **sections)
