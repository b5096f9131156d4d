"""Run metrics: metrics.jsonl, samples.jsonl, TensorBoard event files, and compute
accounting (generated tokens, FLOPs and seconds of generation vs training, mu). What the
run prints as it goes is `replax.run.progress`."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Any

import numpy as np

# metrics.jsonl keys that measure time, which differs between any two runs (the rest of a
# run's record is the same on every run of its config and machine).
TIMING_KEYS = (
    "wall_s",
    "gen_s",
    "train_s",
    "mu_measured",
    "step_s",
    "gen_tokens_per_s",
    # Disjoint placement's (replax.run.disjoint).
    "sampler_busy_frac",
    "trainer_busy_frac",
    "sync_s",
    "wait_s",
    "gen_start_s",
    "gen_end_s",
    "train_start_s",
    "train_end_s",
)


# metrics.jsonl keys that TensorBoard shows under placement/ (disjoint placement's,
# replax.run.disjoint) and under replay/ besides those named replay_* (the off-policy
# correction of replayed rollouts, the auto schedule's).
PLACEMENT_KEYS = (
    "policy_lag_mean",
    "policy_lag_max",
    "token_lag_mean",
    "groups_dropped",
    "sampler_busy_frac",
    "trainer_busy_frac",
    "sync_s",
    "sync_bytes",
    "wait_s",
    "gen_start_s",
    "gen_end_s",
    "train_start_s",
    "train_end_s",
    "replay_ratio_realised",
)
REPLAY_PREFIXES = ("replay_", "is_", "auto_", "halves_")
REPLAY_KEYS = ("clip_frac", "rollouts_kept")


def tensorboard_tag(key: str) -> str:
    """The TensorBoard tag of a metrics.jsonl key, grouped by what it is about: eval/
    (held-out evaluation), replay/ (the store and its corrections), placement/ (disjoint
    sampling), train/ (the rest: rewards, losses, cost). The key itself is unchanged."""
    if key in PLACEMENT_KEYS:
        return f"placement/{key}"
    if key.startswith("eval_") or key == "entropy":
        return f"eval/{key}"
    if key.startswith(REPLAY_PREFIXES) or key in REPLAY_KEYS:
        return f"replay/{key}"
    return f"train/{key}"


def _to_python(value):
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.item() if np.ndim(value) == 0 else value.tolist()
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends one JSON object per logged step to DIR/metrics.jsonl, one per held-out
    sample of an evaluation to DIR/samples.jsonl, and mirrors the scalars (and the samples,
    as text) to TensorBoard (DIR/tensorboard) when tensorboardX is installed, under tags
    grouped train/, eval/, replay/, placement/ (`tensorboard_tag`). A writer
    that is not `enabled` (on processes other than 0) writes nothing."""

    def __init__(
        self,
        workdir: str,
        *,
        resume_step: int = -1,
        enabled: bool = True,
        wandb_mode: str | None = None,
        config: dict[str, Any] | None = None,
    ):
        """wandb_mode: also log to Weights & Biases ('offline' or 'online'; None: not),
        the run named by its workdir and given its config."""
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.samples_path = os.path.join(workdir, "samples.jsonl")
        self._file = self._samples = self._tb = self._wandb = None
        if not enabled:
            return
        if wandb_mode is not None:
            import wandb

            # One W&B run per workdir: a resumed run continues it.
            name = os.path.basename(os.path.abspath(workdir))
            self._wandb = wandb.init(
                project="replax",
                name=name,
                id=name,
                resume="allow",
                dir=workdir,
                mode=wandb_mode,
                config=config or {},
            )
        # A resumed run rewrites history after its checkpoint: drop the records of
        # steps past it, and a last line cut short by a kill, so each file reads as one
        # uninterrupted run.
        for path in (self.path, self.samples_path):
            if os.path.exists(path):
                kept = [r for r in _parse_lines(path) if r["step"] <= resume_step]
                with open(path, "w") as f:
                    f.writelines(json.dumps(r) + "\n" for r in kept)
        self._file = open(self.path, "a")
        self._samples = open(self.samples_path, "a")
        try:
            writer = _summary_writer()
        except ImportError:  # TensorBoard output is optional.
            writer = None
        if writer is not None:
            self._tb = writer(os.path.join(workdir, "tensorboard"), flush_secs=30)

    def write(self, step: int, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        record = {"step": int(step), **{k: _to_python(v) for k, v in record.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self._tb.add_scalar(tensorboard_tag(key), value, step)
        if self._wandb is not None:
            scalars = {
                tensorboard_tag(k): v
                for k, v in record.items()
                if k != "step" and isinstance(v, (int, float))
            }
            self._wandb.log(scalars, step=int(step))

    def write_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        """One line per sample (prompt, completion, reward, answer, ...) with the step."""
        if self._samples is None or not samples:
            return
        records = [{"step": int(step), **s} for s in samples]
        self._samples.writelines(json.dumps(r) + "\n" for r in records)
        self._samples.flush()
        if self._tb is not None:
            self._tb.add_text("eval/samples", _markdown_table(samples), step)

    def close(self) -> None:
        for f in (self._file, self._samples, self._tb):
            if f is not None:
                f.close()
        if self._wandb is not None:
            self._wandb.finish()


def _markdown_table(samples: list[dict[str, Any]]) -> str:
    """Samples as a markdown table (TensorBoard renders a text summary as markdown)."""
    keys = list(samples[0])
    cell = lambda v: json.dumps(v) if not isinstance(v, str) else v.replace("|", "\\|")
    rows = [" | ".join(cell(s.get(k)).replace("\n", "<br>") for k in keys) for s in samples]
    return "\n".join([" | ".join(keys), " | ".join("---" for _ in keys), *rows])


def _parse_lines(path: str) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl; a last line cut short by a kill is skipped."""
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except ValueError:
            if i < len(lines) - 1:
                raise ValueError(f"{path}:{i + 1}: not a JSON record") from None
    return records


def read_metrics(workdir: str) -> list[dict[str, Any]]:
    return _parse_lines(os.path.join(workdir, "metrics.jsonl"))


@dataclasses.dataclass
class ComputeAccount:
    """Cumulative cost of a run. Carried in checkpoints so resumed runs keep counting."""

    gen_tokens: int = 0
    gen_flops: float = 0.0
    train_flops: float = 0.0
    gen_s: float = 0.0
    train_s: float = 0.0
    # Rollouts generated and trained on; with gen_s/train_s they give the measured mu.
    gen_rollouts: int = 0
    train_rollouts: int = 0
    # The cost model's training part: each step's B rollouts times the step's FLOPs over a
    # plain step's (one forward, one backward), so a step that runs more passes (a KL
    # reference, a covariance option's in microbatches) costs more than B.
    train_cost: float = 0.0
    # Loop steps taken, and those that took an optimizer step (skipped ones included).
    steps: int = 0
    updates: int = 0

    def mu_measured(self) -> float | None:
        """Generation cost / training cost per rollout, in seconds on this machine."""
        if not (self.gen_rollouts and self.train_rollouts and self.train_s > 0):
            return None
        return (self.gen_s / self.gen_rollouts) / (self.train_s / self.train_rollouts)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, saved: dict[str, Any], batch_size: int) -> ComputeAccount:
        """The account of a checkpoint; one saved before train_cost was kept resumes it
        from train_rollouts, the cost it counted until then, and one saved before updates
        were counted from train_rollouts / batch_size (every update then took B)."""
        trained = saved.get("train_rollouts", 0)
        older = {"train_cost": float(trained), "updates": trained // batch_size}
        return cls(**{**older, **saved})


# replax.rl.objectives.COVARIANCE_OPTIONS, named here so that reading runs does not import JAX.
COVARIANCE_OPTIONS = ("cov_cut_frac", "clip_cov_ratio", "kl_cov_frac")


def legacy_step_cost(config: dict[str, Any] | None) -> float:
    """A step's FLOPs over a plain step's in a run from before metrics.jsonl kept
    train_cost, from its config.json: the step then ran a forward and a backward of the
    batch, one more forward with a KL reference (loss.kl_coef > 0), and one more with a
    covariance option on in train.num_microbatches > 1 (to rank its tokens over the whole
    batch). A backward costs two forwards."""
    loss, train = (config or {}).get("loss", {}), (config or {}).get("train", {})
    covariance = any(loss.get(k) for k in COVARIANCE_OPTIONS)
    forward = (
        1 + (loss.get("kl_coef", 0) > 0) + (covariance and train.get("num_microbatches", 1) > 1)
    )
    return (forward + 2.0) / 3.0


def backfill_train_cost(records, config: dict[str, Any] | None):
    """records with train_cost in each, from train_rollouts x `legacy_step_cost` of the
    run's config where a record lacks it (a run from before it was kept)."""
    factor = legacy_step_cost(config)
    return [
        r
        if "train_cost" in r or "train_rollouts" not in r
        else {**r, "train_cost": r["train_rollouts"] * factor}
        for r in records
    ]


def _summary_writer():
    """tensorboardX's SummaryWriter, imported with torch hidden. tensorboardX imports torch
    whenever it is installed (as on Colab), only to accept torch tensors, which a run never
    passes: over 2 s of every run's start-up and a few hundred MB for nothing."""
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # `import torch` raises ImportError meanwhile
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hide:
            del sys.modules["torch"]
    return SummaryWriter
