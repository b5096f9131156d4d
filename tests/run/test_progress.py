"""Tests for replax/run/progress.py: the terminal bar, the log lines off a terminal (a fake
clock: nothing sleeps), the notebook bar, which of them a run gets, and the start-up
banner's figures."""

import io
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replax.core import sharding
from replax.run import progress


class TerminalStream(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_draws_one_line_on_a_terminal(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "time", lambda: clock[0])
    stream = TerminalStream()
    bar = progress.ProgressBar(12, stream=stream)
    # Before the first step: the compile.
    assert stream.getvalue() == (
        "\r[........................] step 0/12 reward 0.000 acc   -   - tok/s ETA compiling"
    )
    stream.truncate(0), stream.seek(0)
    clock[0] += 300.0  # step 1, compiling, 300 s: no pace yet
    bar.update(1, reward=0.25, gen_tokens=100, gen_s=250.0, accuracy=0.5)
    first = stream.getvalue()
    # Padded with spaces over the longer line before it ("ETA compiling").
    assert first == (
        "\r[##......................] step 1/12 reward 0.250 acc  50.0% - tok/s ETA    -    "
    )
    clock[0] += 25.0  # 5 more steps in 25 s, 2,468 tokens in 2 s of generation: 30 s to go
    bar.update(6, reward=0.5, gen_tokens=2568, gen_s=252.0)  # no evaluation: 50% stays
    second = stream.getvalue()[len(first) :]
    assert second == (
        "\r[############............] step 6/12 reward 0.500 acc  50.0% 1,234 tok/s ETA   30s"
    )
    bar.close()
    assert stream.getvalue().endswith("\n")


def test_progress_bar_counts_eta_from_the_resumed_step(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(progress.time, "time", lambda: clock[0])
    stream = TerminalStream()
    bar = progress.ProgressBar(20, start_step=10, stream=stream)
    clock[0] = 60.0  # the resumed run's first step compiles
    bar.update(11, reward=0.0, gen_tokens=0, gen_s=0.0)
    clock[0] = 65.0  # 2 steps after it in 5 s, 7 to go: 17.5 s
    bar.update(13, reward=0.0, gen_tokens=0, gen_s=0.0)
    assert stream.getvalue().endswith("acc   -   - tok/s ETA   18s")


def test_progress_bar_is_silent_when_not_a_terminal():
    stream = io.StringIO()
    bar = progress.ProgressBar(4, stream=stream)
    bar.update(1, reward=1.0, gen_tokens=1, gen_s=1.0, accuracy=1.0)
    bar.close()
    assert stream.getvalue() == ""


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def test_log_lines_come_at_the_first_step_then_at_most_every_print_every_s_and_at_the_end():
    clock, stream = Clock(), io.StringIO()
    log = progress.ProgressLog(10, print_every_s=60, stream=stream, clock=clock)
    clock.now += 20  # step 1 after 20 s, compiling: printed, with its time
    log.update(1, reward=0.5, gen_tokens=100, gen_s=15.0)
    for step in range(2, 5):  # 39 s after the first line: not yet
        clock.now += 13
        log.update(step, 0.25, step * 100, 15.0 + step - 1, accuracy=0.3 if step == 3 else None)
    clock.now += 21  # 60 s after the first line: 4 steps at 15 s each, 5 to go
    log.update(5, reward=None, gen_tokens=400, gen_s=18.0)  # nothing generated
    for step in range(6, 10):
        clock.now += 1
        log.update(step, reward=0.75, gen_tokens=400 + 100 * (step - 5), gen_s=18.0 + step - 5)
    clock.now += 1
    log.update(10, reward=1.0, gen_tokens=900, gen_s=23.0)  # the last step
    assert stream.getvalue().splitlines() == [
        "step 1/10 reward 0.500 acc - first step 20s (compiling)",
        # 300 tokens in 3 s of generation since the end of step 1.
        "step 5/10 reward 0.250 acc 30.0% 100 tok/s 1m15s left",
        "step 10/10 reward 1.000 acc 30.0% 100 tok/s 0s left",
    ]


def test_the_last_step_and_an_evaluation_say_what_runs_instead_of_a_stale_time_left(
    monkeypatch,
):
    # Off a terminal: the last step and its evaluation each get a line, even when no line
    # is due; an evaluation mid-run gets one only when a line is due.
    clock, stream = Clock(), io.StringIO()
    log = progress.ProgressLog(4, print_every_s=60, stream=stream, clock=clock)
    clock.now += 20
    log.update(1, reward=0.5, gen_tokens=100, gen_s=15.0)
    clock.now += 5
    log.doing(1, "evaluating on 16 held-out prompts")  # 5 s after a line: not due
    log.update(2, reward=0.5, gen_tokens=200, gen_s=16.0)
    log.doing(3, "last step")
    log.update(3, reward=0.5, gen_tokens=300, gen_s=17.0)
    log.doing(4, "evaluating on 16 held-out prompts")
    assert stream.getvalue().splitlines()[1:] == [
        "step 3/4: last step",
        "step 4/4: evaluating on 16 held-out prompts",
    ]
    # On a terminal the bar shows it in place of the time left, padded over the last line.
    clock = [100.0]
    monkeypatch.setattr(progress.time, "time", lambda: clock[0])
    terminal = TerminalStream()
    bar = progress.ProgressBar(2, stream=terminal)
    clock[0] += 10
    bar.update(1, 0.5, 100, 5.0)
    bar.doing(1, "last step")
    drawn = terminal.getvalue().split("\r")[-1]
    assert drawn.startswith("[############............] step 1/2 ") and "ETA last step" in drawn
    bar.update(2, 0.5, 200, 6.0)
    assert len(terminal.getvalue().split("\r")[-1]) >= len(drawn)


def test_log_lines_leave_the_compiling_first_step_out_of_the_rate_and_the_time_left():
    """1,600 steps of 1/8 s after a first step of 10 minutes, most of it compiling: the
    second line gives the steps' own pace, not one dragged down by the compile."""
    clock, stream = Clock(), io.StringIO()
    log = progress.ProgressLog(1600, print_every_s=60, stream=stream, clock=clock)
    clock.now += 600  # step 1: compile and 16 rollouts of 10 tokens
    log.update(1, reward=0.0, gen_tokens=160, gen_s=590.0)
    for step in range(2, 1601):
        clock.now += 0.125  # 160 tokens in 1/16 s of generation a step
        log.update(step, reward=0.5, gen_tokens=160 * step, gen_s=590.0 + (step - 1) / 16)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "step 1/1600 reward 0.000 acc - first step 10m00s (compiling)"
    # 60 s after the first line: 480 steps done after it, 1,119 to go at 1/8 s. (With the
    # compile in the pace it would read 29 tokens/s and over 10 hours left.)
    assert lines[1] == "step 481/1600 reward 0.500 acc - 2,560 tok/s 2m20s left"
    assert lines[-1] == "step 1600/1600 reward 0.500 acc - 2,560 tok/s 0s left"


def test_log_lines_every_step_at_print_every_s_0_and_time_left_from_the_resumed_step():
    clock, stream = Clock(), io.StringIO()
    log = progress.ProgressLog(20, start_step=10, print_every_s=0, stream=stream, clock=clock)
    for step in (11, 12, 13):
        clock.now += 2.5  # 2.5 s a step since the resume
        log.update(step, reward=None, gen_tokens=0, gen_s=0.0)
    assert stream.getvalue().splitlines() == [
        "step 11/20 reward - acc - first step 2s (compiling)",
        "step 12/20 reward - acc - - tok/s 20s left",
        "step 13/20 reward - acc - - tok/s 18s left",
    ]


class FakeTqdm:
    instances = []

    def __init__(self, total, initial, **kwargs):
        self.total, self.n, self.initial, self.postfix, self.closed = (
            total,
            initial,
            initial,
            None,
            False,
        )
        self.resets = 0
        FakeTqdm.instances.append(self)

    def set_postfix(self, figures, refresh=True):
        self.postfix = dict(figures)

    def update(self, n):
        self.n += n

    def reset(self, total=None):
        self.n, self.resets = 0, self.resets + 1

    def refresh(self):
        pass

    def close(self):
        self.closed = True


class Notebook:
    kernel = object()  # what an IPython kernel's shell has and a terminal's does not


def test_a_notebook_gets_a_tqdm_bar_and_a_terminal_the_bar(monkeypatch):
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=Notebook))
    monkeypatch.setitem(sys.modules, "tqdm.auto", types.SimpleNamespace(tqdm=FakeTqdm))
    assert progress.in_notebook()
    bar = progress.make_progress(8, 2, stream=io.StringIO())
    assert isinstance(bar, progress.NotebookBar)
    (tqdm,) = FakeTqdm.instances[-1:]
    assert tqdm.postfix == {"tok/s": "compiling"}
    bar.update(3, reward=0.5, gen_tokens=50, gen_s=40.0)
    # After the compiling step tqdm's clock restarts, its rate counting from step 3.
    assert (tqdm.resets, tqdm.initial, tqdm.n) == (1, 3, 3)
    assert tqdm.postfix == {"tok/s": "-", "reward": "0.500"}
    bar.update(4, reward=None, gen_tokens=149, gen_s=41.0, accuracy=0.25)
    assert (tqdm.total, tqdm.n, tqdm.resets) == (8, 4, 1)
    assert tqdm.postfix == {"tok/s": "99", "reward": "0.500", "acc": "25.0%"}
    bar.close()
    assert tqdm.closed
    # A terminal keeps its bar, even under a kernel.
    assert isinstance(progress.make_progress(8, stream=TerminalStream()), progress.ProgressBar)


def test_off_a_terminal_and_a_notebook_the_run_gets_log_lines(monkeypatch):
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: None))
    assert not progress.in_notebook()
    log = progress.make_progress(8, print_every_s=5.0, stream=io.StringIO())
    assert isinstance(log, progress.ProgressLog) and log.print_every_s == 5.0
    # A notebook without tqdm: log lines too.
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=Notebook))
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # import fails
    assert isinstance(progress.make_progress(8, stream=io.StringIO()), progress.ProgressLog)


def test_processes_other_than_0_print_nothing():
    stream = TerminalStream()
    bar = progress.make_progress(4, stream=stream, enabled=False)
    bar.update(1, reward=1.0, gen_tokens=1, gen_s=1.0)
    bar.close()
    assert stream.getvalue() == ""


@pytest.mark.parametrize(
    "seconds, text", [(0.4, "0s"), (45, "45s"), (725, "12m05s"), (11040, "3h04m")]
)
def test_duration(seconds, text):
    assert progress.duration(seconds) == text


def test_bytes_per_device_counts_the_shards_a_device_holds():
    mesh = sharding.make_mesh((2, 2, 2))  # 8 simulated devices
    split = jax.device_put(
        jnp.zeros((8, 6), jnp.float32),
        jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp"), None)),
    )
    whole = jax.device_put(jnp.zeros((5,), jnp.int8), sharding.replicated(mesh))
    # [8, 6] float32 over 4 shards: 2 x 6 x 4 bytes a device; 5 int8 bytes on every device.
    assert progress.bytes_per_device({"w": split, "b": whole}) == 2 * 6 * 4 + 5
    abstract = jax.ShapeDtypeStruct(split.shape, split.dtype, sharding=split.sharding)
    assert progress.bytes_per_device([abstract]) == 48
    assert progress.bytes_per_device([]) == 0
    one = jax.device_put(np.zeros(3, np.float32), jax.devices()[0])
    assert progress.bytes_per_device(one) == 12


def test_banner_names_the_devices_meshes_bytes_and_tokens_of_a_step():
    mesh, sampler_mesh = sharding.make_mesh((2, 2, 2)), sharding.make_mesh((-1, 1, 1))
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", "tensor"))
    params = {"w": jax.device_put(jnp.zeros((1024, 512), jnp.float32), split)}  # 2 MiB
    opt_state = (
        params,
        params,
        jax.device_put(jnp.zeros((), jnp.int32), sharding.replicated(mesh)),
    )
    spec = types.SimpleNamespace(
        train=types.SimpleNamespace(batch_size=64),
        rollout=types.SimpleNamespace(max_prompt_len=10, max_new_tokens=6),
    )
    run = types.SimpleNamespace(
        spec=spec,
        rollouts_per_step=16,
        seq_len=16,
        mesh=mesh,
        sampler=types.SimpleNamespace(mesh=sampler_mesh),
    )
    state = types.SimpleNamespace(params=params, opt_state=opt_state)
    assert progress.banner(run, state) == [
        "cpu backend: 8 x cpu, 1 process(es)",
        "mesh data=2 fsdp=2 tensor=2; sampler mesh data=8 fsdp=1 tensor=1",
        # 2 MiB over 4 shards (data x tensor); Adam's two moments and its count.
        "per device: parameters 0.5 MiB, optimizer state 1.0 MiB",
        "per step: 16 rollouts x 16 tokens (10 prompt + 6 new) = 256 rollout tokens; "
        "train batch 64 x 16 = 1,024 tokens",
    ]


def test_a_hugging_face_model_on_the_cpu_backend_gets_one_warning_line():
    spec = lambda checkpoint: types.SimpleNamespace(
        model=types.SimpleNamespace(checkpoint=checkpoint)
    )
    line = progress.slow_backend_warning(spec("/models/qwen"))
    assert jax.default_backend() == "cpu" and "\n" not in line
    assert "/models/qwen" in line and "very slow" in line
    assert "pip install -e '.[tpu]'" in line and "'.[cuda]'" in line
    assert progress.slow_backend_warning(spec("")) is None  # the embedded policy
