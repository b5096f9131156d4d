"""How a run learns: the rollout, replay, train and eval sections of a RunSpec, each checking
its own keys (the loss and optimizer sections are the library's own `objectives.LossConfig`
and `train_step.OptimizerConfig`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from replax.config import sections
from replax.core.config_utils import number, one_of, positive, require
from replax.model import transformer as model_lib
from replax.replay import auto as auto_replay
from replax.replay import store as replay_lib
from replax.sampling import distributions


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutSection(distributions.SamplingConfig):
    """R = prompts_per_step x group_size fresh rollouts a step: the sampling distribution
    (`distributions.SamplingConfig`, whose fields it inherits: make_sampler takes the
    section as it is), lengths, numerics and the sampler's mesh (empty: the training mesh)."""

    prompts_per_step: int
    group_size: int
    max_prompt_len: int
    max_new_tokens: int
    dtype: str
    cache_dtype: str
    mesh_shape: tuple[int, ...]
    placement: str
    num_devices: int
    sync_every: int
    max_policy_lag: int
    slots: int
    refill_every: int
    max_admit: int
    drain_halvings: int
    stream: bool

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
        number("rollout.slots", self.slots, low=0, integer=True)
        number("rollout.refill_every", self.refill_every, low=1, integer=True)
        number("rollout.max_admit", self.max_admit, low=0, integer=True)
        number("rollout.drain_halvings", self.drain_halvings, low=0, integer=True)
        one_of("rollout.placement", self.placement, sections.PLACEMENTS)
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
        for key in ("dtype", "cache_dtype"):
            if getattr(self, key):
                one_of(f"rollout.{key}", getattr(self, key), tuple(model_lib.DTYPES))
        require(
            not self.slots or self.refill_every <= self.max_new_tokens,
            f"rollout.refill_every={self.refill_every} exceeds the length cap "
            f"rollout.max_new_tokens={self.max_new_tokens}: allowed is 1 <= refill_every <= "
            f"{self.max_new_tokens}",
        )
        require(
            self.max_admit <= self.slots,
            f"rollout.max_admit={self.max_admit} exceeds rollout.slots={self.slots}: allowed "
            f"is 0 (every free slot) or 1 <= max_admit <= {self.slots}",
        )
        require(
            self.slots <= self.rollouts,
            f"rollout.slots={self.slots} exceeds the rollouts a step generates (rollout R = "
            f"prompts_per_step x group_size={self.rollouts}): allowed is 0 (the static "
            f"sampler) or 1 <= slots <= {self.rollouts}",
        )

    @property
    def rollouts(self) -> int:
        return self.prompts_per_step * self.group_size

    def numerics(self) -> dict[str, Any]:
        """The decoding weights' and KV cache's dtypes (None: the model's compute dtype)."""
        return dict(dtype=self.dtype or None, cache_dtype=self.cache_dtype or None)


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplaySection(replay_lib.ReplayConfig):
    """The replay store's own settings (`replay_lib.ReplayConfig`, whose fields it inherits:
    the section is one, as make_replay_buffer takes it) and the run's: how generation is
    scheduled (mode, auto mode's knobs), which rollouts are stored, the replay ratio."""

    mode: str
    drop_zero_advantage: bool
    mu: float
    auto_every: int
    auto_max_y: float
    auto_design: str
    auto_min_y: float
    auto_onpolicy_batches: int

    def __post_init__(self):
        super().__post_init__()
        number("replay.mu", self.mu, low=0)
        one_of("replay.mode", self.mode, sections.REPLAY_MODES)
        if self.mode == "auto":
            positive("replay.auto_every", self.auto_every)
            number("replay.auto_min_y", self.auto_min_y, low=0)
            require(
                self.auto_min_y == 0 or 1 <= self.auto_min_y <= self.auto_max_y,
                f"replay.auto_min_y={self.auto_min_y!r}: allowed are 0 (never below B / R, "
                "generating every step) or 1 <= auto_min_y <= replay.auto_max_y="
                f"{self.auto_max_y!r} (1: down to on-policy)",
            )
            one_of("replay.auto_design", self.auto_design, tuple(auto_replay.DESIGNS))
            number("replay.auto_onpolicy_batches", self.auto_onpolicy_batches, low=1, integer=True)


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
