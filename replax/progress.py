"""What a run prints as it goes: the start-up banner and the progress of its steps.

Progress takes the form of where it is shown (`make_progress`): a terminal gets a bar
redrawn in place (`ProgressBar`), a notebook a live tqdm bar (`NotebookBar`, when tqdm is
installed), and anything else (a log file, a batch job's captured stderr) a plain line
at most every `log.print_every_s` seconds and at the last step (`ProgressLog`). All three
take `update(step, reward, tokens_per_s, accuracy)` once a step.
"""

from __future__ import annotations

import sys
import time

import jax
import numpy as np


def _eta(elapsed: float, done: int, total: int, step: int) -> float:
    """Seconds left at the mean pace of the steps since the (re)start."""
    return elapsed / max(done, 1) * (total - step)


def _accuracy(accuracy: float | None) -> str:
    return "  -  " if accuracy is None else f"{100 * accuracy:5.1f}%"


class _Latest:
    """The figures a progress display keeps showing: the last reward (None on a step that
    generated nothing) and the last held-out accuracy (None between evaluations)."""

    last_accuracy = None
    last_reward = None

    def _remember(self, reward: float | None, accuracy: float | None) -> None:
        if accuracy is not None:
            self.last_accuracy = accuracy
        if reward is not None:
            self.last_reward = reward


class ProgressBar(_Latest):
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
        self._remember(reward, accuracy)
        eta = _eta(time.time() - self.t0, step - self.start_step, self.total, step)
        width = 24
        filled = int(width * step / max(self.total, 1))
        line = (
            f"\r[{'#' * filled}{'.' * (width - filled)}] step {step}/{self.total} "
            f"reward {self.last_reward:.3f} acc {_accuracy(self.last_accuracy)} "
            f"{tokens_per_s:,.0f} tok/s ETA {eta:4.0f}s"
        )
        if self.enabled:
            self.stream.write(line)
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


class ProgressLog(_Latest):
    """Progress off a terminal: one line (step N/TOTAL, reward, last held-out accuracy,
    tokens/s, time left) at the first step, then at most every print_every_s seconds
    (0: every step), and at the last step, so that a log file grows at a known pace."""

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        *,
        print_every_s: float = 60.0,
        stream=sys.stderr,
        clock=time.time,
    ):
        self.total, self.start_step = total_steps, start_step
        self.print_every_s, self.stream, self.clock = print_every_s, stream, clock
        self.t0 = clock()
        self.printed_at = None
        self.last_accuracy = self.last_reward = None

    def update(
        self, step: int, reward: float | None, tokens_per_s: float, accuracy: float | None = None
    ) -> None:
        self._remember(reward, accuracy)
        now = self.clock()
        due = self.printed_at is None or now - self.printed_at >= self.print_every_s
        if not (due or step >= self.total):
            return
        self.printed_at = now
        eta = _eta(now - self.t0, step - self.start_step, self.total, step)
        reward_text = "-" if self.last_reward is None else f"{self.last_reward:.3f}"
        self.stream.write(
            f"step {step}/{self.total} reward {reward_text} acc "
            f"{_accuracy(self.last_accuracy).strip()} {tokens_per_s:,.0f} tok/s "
            f"{duration(eta)} left\n"
        )
        self.stream.flush()

    def close(self) -> None:
        pass


class NotebookBar(_Latest):
    """A live tqdm bar (tqdm.auto draws a widget in a notebook) with the same figures."""

    def __init__(self, total_steps: int, start_step: int = 0, *, tqdm):
        self.bar = tqdm(total=total_steps, initial=start_step, desc="replax", unit="step")
        self.last_accuracy = self.last_reward = None

    def update(
        self, step: int, reward: float | None, tokens_per_s: float, accuracy: float | None = None
    ) -> None:
        self._remember(reward, accuracy)
        figures = {"tok/s": f"{tokens_per_s:,.0f}"}
        if self.last_reward is not None:
            figures["reward"] = f"{self.last_reward:.3f}"
        if self.last_accuracy is not None:
            figures["acc"] = _accuracy(self.last_accuracy).strip()
        self.bar.set_postfix(figures, refresh=False)
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.bar.close()


class _Silent:
    def update(self, *args, **kwargs) -> None:
        del args, kwargs

    def close(self) -> None:
        pass


def in_notebook() -> bool:
    """Whether this process is an IPython kernel (Jupyter, Colab), not a terminal."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


def make_progress(
    total_steps: int,
    start_step: int = 0,
    *,
    print_every_s: float = 60.0,
    stream=None,
    enabled: bool = True,
):
    """The progress display for where `stream` (default stderr) is shown: a bar on a
    terminal, a tqdm bar in a notebook (log lines when tqdm is not installed), log lines
    elsewhere; nothing when not `enabled` (processes other than 0)."""
    stream = sys.stderr if stream is None else stream
    if not enabled:
        return _Silent()
    if stream.isatty():
        return ProgressBar(total_steps, start_step, stream=stream)
    if in_notebook():
        try:
            from tqdm.auto import tqdm
        except ImportError:
            pass
        else:
            return NotebookBar(total_steps, start_step, tqdm=tqdm)
    return ProgressLog(total_steps, start_step, print_every_s=print_every_s, stream=stream)


def duration(seconds: float) -> str:
    """45s, 12m05s, 3h04m."""
    seconds = max(int(round(seconds)), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


# ---------------------------------------------------------------- start-up banner


def bytes_per_device(tree) -> int:
    """Bytes of a tree of (global) arrays or ShapeDtypeStructs with shardings that the
    most loaded device holds, from the shapes of their shards (nothing is read)."""
    per_device: dict = {}
    for x in jax.tree.leaves(tree):
        shard = x.sharding.shard_shape(x.shape)
        nbytes = int(np.prod(shard, dtype=np.int64)) * np.dtype(x.dtype).itemsize
        for device in x.sharding.device_set:
            per_device[device] = per_device.get(device, 0) + nbytes
    return max(per_device.values(), default=0)


def _mesh(mesh) -> str:
    return " ".join(f"{name}={size}" for name, size in mesh.shape.items())


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def banner(run, train_state) -> list[str]:
    """A few lines on what the run runs on and what a step moves, for its log: backend,
    devices and processes, the training and the sampler's meshes, parameter and optimizer
    bytes per device, and tokens per step."""
    c, devices = run.spec, jax.devices()
    r, b, seq_len = run.rollouts_per_step, c.train.batch_size, run.seq_len
    return [
        f"{jax.default_backend()} backend: {len(devices)} x {devices[0].device_kind}, "
        f"{jax.process_count()} process(es)",
        f"mesh {_mesh(run.mesh)}; sampler mesh {_mesh(run.sampler.mesh)}",
        f"per device: parameters {_mib(bytes_per_device(train_state.params))}, "
        f"optimizer state {_mib(bytes_per_device(train_state.opt_state))}",
        f"per step: {r} rollouts x {seq_len} tokens ({c.rollout.max_prompt_len} prompt + "
        f"{c.rollout.max_new_tokens} new) = {r * seq_len:,} rollout tokens; "
        f"train batch {b} x {seq_len} = {b * seq_len:,} tokens",
    ]


def slow_backend_warning(spec) -> str | None:
    """One line when a Hugging Face model is to train on the CPU backend."""
    if not spec.model.checkpoint or jax.default_backend() != "cpu":
        return None
    return (
        f"warning: model.checkpoint={spec.model.checkpoint} runs on the CPU backend, which "
        "will be very slow; for a TPU or GPU install its jax: pip install -e '.[tpu]' or "
        "pip install -e '.[cuda]'"
    )
