"""What a run prints as it goes: the start-up banner and the progress of its steps.

Progress takes the form of where it is shown (`make_progress`): a terminal gets a bar
redrawn in place (`ProgressBar`), a notebook a live tqdm bar (`NotebookBar`, when tqdm is
installed), and anything else (a log file, a batch job's captured stderr) a plain line
at most every `log.print_every_s` seconds and at the last step (`ProgressLog`). All three
take `update(step, reward, gen_tokens, gen_s, accuracy)` once a step.

The first step after a (re)start compiles the programs, which can take longer than
hundreds of steps: every display measures its rate of generated tokens and its time left
from the end of that step on (`_Pace`), and shows none until there is one.
"""

from __future__ import annotations

import sys
import time

import jax
import numpy as np


class _Pace:
    """Generated tokens per second of generation, and seconds left, measured from the end of
    the first step a display sees (the one that compiled) to the latest: None for both
    until a later step is done (and no rate while nothing more was generated)."""

    def __init__(self, total: int):
        self.total = total
        self.first = None  # (time, step, gen_tokens, gen_s) at the end of the first step
        self.first_step_s = None
        self.tokens_per_s = None  # the latest rate, for a display's "doing" line

    def update(self, now: float, step: int, gen_tokens: float, gen_s: float, started: float):
        """(tokens_per_s, seconds_left) after `step`; `started` is when the display began."""
        if self.first is None:
            self.first = (now, step, gen_tokens, gen_s)
            self.first_step_s = now - started
            return None, None
        t0, step0, tokens0, gen_s0 = self.first
        tokens_per_s = (gen_tokens - tokens0) / (gen_s - gen_s0) if gen_s > gen_s0 else None
        self.tokens_per_s = tokens_per_s
        seconds_left = (now - t0) / (step - step0) * (self.total - step) if step > step0 else None
        return tokens_per_s, seconds_left


def _rate(tokens_per_s: float | None) -> str:
    return "-" if tokens_per_s is None else f"{tokens_per_s:,.0f}"


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
    """One-line terminal progress: step, reward, accuracy, tokens/s and ETA (`compiling`
    until the first step is done, `-` until a second one gives a pace)."""

    def __init__(
        self, total_steps: int, start_step: int = 0, stream=sys.stderr, enabled: bool = True
    ):
        self.total = total_steps
        self.start_step = start_step
        self.t0 = time.time()
        self.pace = _Pace(total_steps)
        self.stream = stream
        self.enabled = enabled and stream.isatty()
        self.last_accuracy = None
        self.last_reward = 0.0
        self._width = 0
        self._draw(start_step, "-", "compiling")

    def update(
        self,
        step: int,
        reward: float | None,
        gen_tokens: float,
        gen_s: float,
        accuracy: float | None = None,
    ) -> None:
        """reward: this step's mean reward, None on a step that generated nothing (the bar
        keeps showing the last one); gen_tokens, gen_s: the run's cumulative generated
        tokens and seconds of generation."""
        self._remember(reward, accuracy)
        tokens_per_s, eta = self.pace.update(time.time(), step, gen_tokens, gen_s, self.t0)
        self._draw(step, _rate(tokens_per_s), "   -" if eta is None else f"{eta:4.0f}s")

    def doing(self, step: int, what: str) -> None:
        """Shows what the run is doing after `step` steps (the last step, an evaluation),
        in place of the time left, until the next update."""
        self._draw(step, _rate(self.pace.tokens_per_s), what)

    def _draw(self, step: int, rate: str, eta: str) -> None:
        width = 24
        filled = int(width * step / max(self.total, 1))
        line = (
            f"\r[{'#' * filled}{'.' * (width - filled)}] step {step}/{self.total} "
            f"reward {self.last_reward:.3f} acc {_accuracy(self.last_accuracy)} "
            f"{rate} tok/s ETA {eta}"
        )
        if self.enabled:
            # Pad over a longer line drawn before (a "doing" text).
            self.stream.write(line.ljust(self._width))
            self._width = len(line)
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


class ProgressLog(_Latest):
    """Progress off a terminal: one line (step N/TOTAL, reward, last held-out accuracy,
    tokens/s, time left) at the first step, then at most every print_every_s seconds
    (0: every step), and at the last step, so that a log file grows at a known pace. The
    first step's line gives its time instead (it includes compiling): the rate and the
    time left are measured from its end."""

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
        self.pace = _Pace(total_steps)
        self.printed_at = None
        self.last_accuracy = self.last_reward = None

    def update(
        self,
        step: int,
        reward: float | None,
        gen_tokens: float,
        gen_s: float,
        accuracy: float | None = None,
    ) -> None:
        self._remember(reward, accuracy)
        now = self.clock()
        tokens_per_s, eta = self.pace.update(now, step, gen_tokens, gen_s, self.t0)
        due = self.printed_at is None or now - self.printed_at >= self.print_every_s
        if not (due or step >= self.total):
            return
        self.printed_at = now
        reward_text = "-" if self.last_reward is None else f"{self.last_reward:.3f}"
        if eta is None and tokens_per_s is None and step == self.pace.first[1]:
            pace = f"first step {duration(self.pace.first_step_s)} (compiling)"
        else:
            left = "-" if eta is None else duration(eta)
            pace = f"{_rate(tokens_per_s)} tok/s {left} left"
        self.stream.write(
            f"step {step}/{self.total} reward {reward_text} acc "
            f"{_accuracy(self.last_accuracy).strip()} {pace}\n"
        )
        self.stream.flush()

    def doing(self, step: int, what: str) -> None:
        """A line saying what the run is doing after `step` steps, at the last step or when
        a line is due, so that a long phase is never silent."""
        now = self.clock()
        due = self.printed_at is None or now - self.printed_at >= self.print_every_s
        if due or step >= self.total - 1:
            self.printed_at = now
            self.stream.write(f"step {step}/{self.total}: {what}\n")
            self.stream.flush()

    def close(self) -> None:
        pass


class NotebookBar(_Latest):
    """A live tqdm bar (tqdm.auto draws a widget in a notebook) with the same figures; tqdm's
    own rate and time left count from the end of the first (compiling) step."""

    def __init__(self, total_steps: int, start_step: int = 0, *, tqdm):
        self.bar = tqdm(total=total_steps, initial=start_step, desc="replax", unit="step")
        self.bar.set_postfix({"tok/s": "compiling"}, refresh=True)
        self.pace = _Pace(total_steps)
        self.last_accuracy = self.last_reward = None

    def update(
        self,
        step: int,
        reward: float | None,
        gen_tokens: float,
        gen_s: float,
        accuracy: float | None = None,
    ) -> None:
        self._remember(reward, accuracy)
        first = self.pace.first is None
        tokens_per_s, _ = self.pace.update(time.time(), step, gen_tokens, gen_s, 0.0)
        figures = {"tok/s": _rate(tokens_per_s)}
        if self.last_reward is not None:
            figures["reward"] = f"{self.last_reward:.3f}"
        if self.last_accuracy is not None:
            figures["acc"] = _accuracy(self.last_accuracy).strip()
        self.bar.set_postfix(figures, refresh=False)
        self.bar.update(step - self.bar.n)
        if first:
            # tqdm's rate (and so its time left) counts from here, not from before the
            # compile: reset() restarts its clock and its smoothed rate, `initial` is the
            # count the rate starts from.
            n = self.bar.n
            self.bar.reset(total=self.bar.total)
            self.bar.initial = self.bar.n = self.bar.last_print_n = n
            self.bar.refresh()

    def doing(self, step: int, what: str) -> None:
        del step
        self.bar.set_postfix({"now": what}, refresh=True)

    def close(self) -> None:
        self.bar.close()


class _Silent:
    def update(self, *args, **kwargs) -> None:
        del args, kwargs

    def doing(self, *args, **kwargs) -> None:
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
