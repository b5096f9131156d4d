"""Run metrics: metrics.jsonl, TensorBoard event files, a terminal progress bar, and
compute accounting (generated tokens, FLOPs and seconds of generation vs training, mu)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from typing import Any

import numpy as np


def _to_python(value):
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.item() if np.ndim(value) == 0 else value.tolist()
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends one JSON object per logged step to DIR/metrics.jsonl and mirrors the
    scalars to TensorBoard (DIR/tensorboard) when tensorboardX is installed. A writer
    that is not `enabled` (on processes other than 0) writes nothing."""

    def __init__(self, workdir: str, *, resume_step: int = -1, enabled: bool = True):
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._file = self._tb = None
        if not enabled:
            return
        # A resumed run rewrites history after its checkpoint: drop the records of
        # steps past it, and a last line cut short by a kill, so the file reads as one
        # uninterrupted run.
        if os.path.exists(self.path):
            kept = [r for r in _parse_lines(self.path) if r["step"] <= resume_step]
            with open(self.path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in kept)
        self._file = open(self.path, "a")
        try:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"), flush_secs=30)
        except ImportError:  # TensorBoard output is optional.
            pass

    def write(self, step: int, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        record = {"step": int(step), **{k: _to_python(v) for k, v in record.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


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
    # Train steps taken.
    steps: int = 0

    def mu_measured(self) -> float | None:
        """Generation cost / training cost per rollout, in seconds on this machine."""
        if not (self.gen_rollouts and self.train_rollouts and self.train_s > 0):
            return None
        return (self.gen_s / self.gen_rollouts) / (self.train_s / self.train_rollouts)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ProgressBar:
    """One-line terminal progress: step, reward, accuracy, tokens/s and ETA."""

    def __init__(
        self, total_steps: int, start_step: int = 0, stream=sys.stderr, enabled: bool = True
    ):
        self.total = total_steps
        self.start_step = start_step
        self.t0 = time.time()
        self.stream = stream
        self.enabled = enabled and stream.isatty()
        self.last_accuracy = None
        self.last_reward = 0.0

    def update(
        self, step: int, reward: float | None, tokens_per_s: float, accuracy: float | None = None
    ) -> None:
        """reward: this step's mean reward, None on a step that generated nothing (the bar
        keeps showing the last one)."""
        if accuracy is not None:
            self.last_accuracy = accuracy
        if reward is not None:
            self.last_reward = reward
        done = step - self.start_step
        elapsed = time.time() - self.t0
        eta = elapsed / max(done, 1) * (self.total - step)
        width = 24
        filled = int(width * step / max(self.total, 1))
        acc = "  -  " if self.last_accuracy is None else f"{100 * self.last_accuracy:5.1f}%"
        line = (
            f"\r[{'#' * filled}{'.' * (width - filled)}] step {step}/{self.total} "
            f"reward {self.last_reward:.3f} acc {acc} {tokens_per_s:,.0f} tok/s ETA {eta:4.0f}s"
        )
        if self.enabled:
            self.stream.write(line)
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
