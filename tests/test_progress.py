"""Tests for replax/progress.py: the terminal bar, the log lines off a terminal (a fake
clock: nothing sleeps), the notebook bar, which of them a run gets, and the start-up
banner's figures."""

import io
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replax import progress, sharding


class TerminalStream(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_draws_one_line_on_a_terminal(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "time", lambda: clock[0])
    stream = TerminalStream()
    bar = progress.ProgressBar(12, stream=stream)
    clock[0] += 30.0  # 6 of 12 steps in 30 s: 30 s to go
    bar.update(6, reward=0.25, tokens_per_s=1234.0, accuracy=0.5)
    first = stream.getvalue()
    assert first == (
        "\r[############............] step 6/12 reward 0.250 acc  50.0% 1,234 tok/s ETA   30s"
    )
    bar.update(9, reward=0.5, tokens_per_s=10.0)  # no evaluation: the last accuracy stays
    second = stream.getvalue()[len(first) :]
    assert second.startswith("\r[##################......] step 9/12 reward 0.500 acc  50.0%")
    bar.close()
    assert stream.getvalue().endswith("\n")


def test_progress_bar_counts_eta_from_the_resumed_step(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(progress.time, "time", lambda: clock[0])
    stream = TerminalStream()
    bar = progress.ProgressBar(20, start_step=10, stream=stream)
    clock[0] = 5.0  # 2 steps since the resume in 5 s, 8 to go: 20 s
    bar.update(12, reward=0.0, tokens_per_s=0.0)
    assert stream.getvalue().endswith("acc   -   0 tok/s ETA   20s")


def test_progress_bar_is_silent_when_not_a_terminal():
    stream = io.StringIO()
    bar = progress.ProgressBar(4, stream=stream)
    bar.update(1, reward=1.0, tokens_per_s=1.0, accuracy=1.0)
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
    clock.now += 20  # step 1 after 20 s: printed, 9 steps to go at 20 s each
    log.update(1, reward=0.5, tokens_per_s=1500.0)
    for step in range(2, 5):  # 39 s after the first line: not yet
        clock.now += 13
        log.update(step, reward=0.25, tokens_per_s=1500.0, accuracy=0.3 if step == 3 else None)
    clock.now += 21  # 60 s after the first line
    log.update(5, reward=None, tokens_per_s=2000.0)  # nothing generated: the last reward
    for step in range(6, 10):
        clock.now += 1
        log.update(step, reward=0.75, tokens_per_s=2000.0)
    clock.now += 1
    log.update(10, reward=1.0, tokens_per_s=2000.0)  # the last step, 5 s after the 2nd line
    assert stream.getvalue().splitlines() == [
        "step 1/10 reward 0.500 acc - 1,500 tok/s 3m00s left",
        "step 5/10 reward 0.250 acc 30.0% 2,000 tok/s 1m20s left",
        "step 10/10 reward 1.000 acc 30.0% 2,000 tok/s 0s left",
    ]


def test_log_lines_every_step_at_print_every_s_0_and_time_left_from_the_resumed_step():
    clock, stream = Clock(), io.StringIO()
    log = progress.ProgressLog(20, start_step=10, print_every_s=0, stream=stream, clock=clock)
    for step in (11, 12):
        clock.now += 2.5  # 2.5 s a step since the resume
        log.update(step, reward=None, tokens_per_s=0.0)
    assert stream.getvalue().splitlines() == [
        "step 11/20 reward - acc - 0 tok/s 22s left",
        "step 12/20 reward - acc - 0 tok/s 20s left",
    ]


class FakeTqdm:
    instances = []

    def __init__(self, total, initial, **kwargs):
        self.total, self.n, self.postfix, self.closed = total, initial, None, False
        FakeTqdm.instances.append(self)

    def set_postfix(self, figures, refresh=True):
        self.postfix = dict(figures)

    def update(self, n):
        self.n += n

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
    bar.update(3, reward=0.5, tokens_per_s=1234.0)
    bar.update(4, reward=None, tokens_per_s=99.0, accuracy=0.25)
    (tqdm,) = FakeTqdm.instances[-1:]
    assert (tqdm.total, tqdm.n) == (8, 4)
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
    bar.update(1, reward=1.0, tokens_per_s=1.0)
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
