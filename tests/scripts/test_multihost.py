"""Several processes: scripts/train.py as 2 processes x 4 CPU devices on localhost (JAX's
gloo collectives) against the same run as 1 process x 8 devices.

The user task of tests/counting_task.py logs every reward call and every data build per
process, so the tests see which process scored which completions and who built the data.
"""

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import xla_flags
from micro_run import MICRO, strip_timing

from replax.core import lost_host

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = "tests/counting_task.py"
PROCESSES, DEVICES = 2, 4
# R = 2 prompts x 4 = 8 rollouts a step: each process scores 4. Evaluation at steps 2
# and 4, checkpoints at 2 and 4; the 2-process run stops after step 2 and resumes.
R = 8
STEPS = [
    *MICRO,
    "--config.total_steps=4",
    "--config.eval.every=2",
    "--config.checkpoint_every=2",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _command(workdir, logs, extra):
    return [
        sys.executable,
        "scripts/train.py",
        f"--config={CONFIG}",
        f"--workdir={workdir}",
        *STEPS,
        f"--config.task.log_dir={logs}",
        *extra,
    ]


def _env(devices, **variables):
    # The test run's compilation cache (tests/conftest.py) is kept: a resumed run, and a
    # run that shares programs with an earlier one, load them instead of compiling again.
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.update(
        XLA_FLAGS=xla_flags.with_devices(devices),
        JAX_PLATFORMS="cpu",
        JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
        JAX_COMPILATION_CACHE_DIR=os.environ["JAX_COMPILATION_CACHE_DIR"],
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        **variables,
    )
    return env


def run_one_process(workdir, logs, *extra):
    """The run as 1 process x 8 devices."""
    os.makedirs(logs, exist_ok=True)
    proc = subprocess.run(
        _command(workdir, logs, extra),
        cwd=ROOT,
        env=_env(PROCESSES * DEVICES),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def start_processes(workdir, logs, *extra, command=None, as_flags=False, env=None, env_of=None):
    """Starts the run as 2 processes x 4 devices, coordinated through a free localhost port
    given in JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID (or as_flags: in
    train.py's --coordinator_address, --num_processes, --process_id); env_of: variables of
    one process ({index: {name: value}}). Returns the processes and their (stdout, stderr)
    files."""
    os.makedirs(logs, exist_ok=True)
    address = f"localhost:{_free_port()}"
    files = lambda: (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+"))
    outputs = [files() for _ in range(PROCESSES)]
    command = command or _command(workdir, logs, extra)
    procs = []
    for i, (stdout, stderr) in enumerate(outputs):
        where = dict(coordinator_address=address, num_processes=PROCESSES, process_id=i)
        if as_flags:
            flags, variables = [f"--{k}={v}" for k, v in where.items()], {}
        else:
            flags = []
            variables = {f"JAX_{k.upper()}": str(v) for k, v in where.items()}
        variables.update(env or {}, **(env_of or {}).get(i, {}))
        procs.append(
            subprocess.Popen(
                command + flags,
                cwd=ROOT,
                env=_env(DEVICES, **variables),
                stdout=stdout,
                stderr=stderr,
                text=True,
            )
        )
    return procs, outputs


def run_processes(workdir, logs, *extra, command=None, as_flags=False, env=None, check=True):
    """The run as 2 processes x 4 devices (`start_processes`). check=False: a process may
    fail (its stdout is returned all the same)."""
    procs, outputs = start_processes(
        workdir, logs, *extra, command=command, as_flags=as_flags, env=env
    )
    # A process that fails leaves the others waiting for it: stop them then.
    deadline = time.time() + 900
    try:
        while time.time() < deadline and any(p.poll() is None for p in procs):
            if any(p.poll() for p in procs):
                break
            time.sleep(1)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for stdout, stderr in outputs:
        stdout.seek(0), stderr.seek(0)
    # The process that failed first, not one stopped for it.
    failed = sorted((p.returncode < 0, i) for i, p in enumerate(procs) if p.returncode)
    if failed and check:
        i = failed[0][1]
        pytest.fail(f"process {i}: exit {procs[i].returncode}: {outputs[i][1].read()[-3000:]}")
    # What each printed, less gloo's lines about its connections (written from several
    # threads, so that one can break another).
    gloo = lambda line: "[Gloo]" in line or "peer ranks" in line or not line.strip()
    return ["".join(s for s in stdout if not gloo(s)) for stdout, _ in outputs]


def read(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def logged(logs, kind):
    """{process index: [lines]} of the task's logs of one kind, over every pid."""
    out = {}
    for name in sorted(os.listdir(logs)):
        what, process, _ = name.split(".")
        if what == kind:
            with open(os.path.join(logs, name)) as f:
                out.setdefault(int(process), []).extend(f.read().splitlines())
    return out


def data_builds(logs):
    """{process: the task's `examples` calls that built a split}."""
    calls = logged(logs, "examples").items()
    built = {p: [c for c in lines if not c.endswith(" 1")] for p, lines in calls}
    return {p: lines for p, lines in built.items() if lines}


def train_answers(lines):
    """The answers of training rollouts (train words are of letters abcd, test ones efgh)."""
    return [a for a in lines if set(a) <= set("abcd")]


def assert_same_metrics(records, reference):
    """Equal keys; counts exact, floats to float32 rounding. Returns the largest relative
    difference of a float of magnitude >= 1e-3."""
    assert [r["step"] for r in records] == [r["step"] for r in reference]
    worst = 0.0
    for got, want in zip(strip_timing(records), strip_timing(reference)):
        assert got.keys() == want.keys()
        for key, value in want.items():
            if isinstance(value, float):
                np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
                if abs(value) >= 1e-3:  # (not a loss of 3e-8 against 6e-8)
                    worst = max(worst, abs(got[key] - value) / abs(value))
            else:
                assert got[key] == value, (got["step"], key, got[key], value)
    return worst


def assert_each_process_scored_its_rows(logs, reference_logs, steps, first=0):
    """Process p scored R/2 training completions a generating step: rows [p R/2,
    (p + 1) R/2) of the 1-process run's rows, in its order (those of its generating steps
    first, first + 1, ...)."""
    mine = {p: train_answers(lines) for p, lines in logged(logs, "reward").items()}
    (everything,) = [train_answers(lines) for lines in logged(reference_logs, "reward").values()]
    assert sorted(mine) == list(range(PROCESSES))
    half = R // PROCESSES
    for p, answers in mine.items():
        assert len(answers) == half * steps, (p, len(answers))
    for k in range(steps):
        rows = [a for p in range(PROCESSES) for a in mine[p][k * half : (k + 1) * half]]
        assert rows == everything[(first + k) * R : (first + k + 1) * R], k


def one_process_reference(root, *extra):
    """The 1-process x 8-device run's records and its task logs."""
    workdir, logs = str(root / "run"), str(root / "logs")
    run_one_process(workdir, logs, *extra)
    return read(workdir), logs


def replax_lines(stdout: str) -> list[str]:
    """The lines of stdout that replax prints (progress, evaluation, summary)."""
    words = ("accuracy", "final", "resumed", "warm start", "step")
    return [line for line in stdout.splitlines() if any(w in line for w in words)]


def test_two_processes_match_one_and_resume_in_fresh_processes(tmp_path):
    """replay.sample_mode='global': one pool over both processes' shards."""
    mode = "--config.replay.sample_mode=global"
    reference_records, reference_logs = one_process_reference(tmp_path / "one", mode)
    workdir, logs = str(tmp_path / "run"), str(tmp_path / "logs")
    first = run_processes(workdir, logs, mode, "--config.total_steps=2")
    # Data is built once, on process 0 (every process's config check reads 1 example);
    # only process 0 prints.
    assert data_builds(logs) == {0: ["train 64", "test 16"]}
    # (Only replax's own lines are checked: a runtime library may print on any process.)
    assert "final" in first[0] and not replax_lines(first[1])
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2"]
    second = run_processes(workdir, logs, mode, as_flags=True)
    assert "resumed from step 2" in second[0] and not replax_lines(second[1])
    assert data_builds(logs) == {0: ["train 64", "test 16"]}  # the resumed run built none

    records = read(workdir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # one line a step, once
    worst = assert_same_metrics(records, reference_records)
    print(f"largest relative difference of a float metric >= 1e-3: {worst:.3g}")
    assert_each_process_scored_its_rows(logs, reference_logs, steps=4)
    checkpoints = os.path.join(workdir, "checkpoints")
    assert sorted(os.listdir(checkpoints)) == ["2", "4"]
    for step in ("2", "4"):  # sealed by process 0 once every process had written
        assert os.path.exists(os.path.join(checkpoints, step, "checksums.json"))
    assert os.path.exists(os.path.join(workdir, "config.json"))
    assert os.path.isdir(os.path.join(workdir, "tensorboard"))


# Builds the run on each process and prints where its replay store lives: for every
# sharded leaf, the pools (data shards, S of them) whose rows this process's devices hold.
_LAYOUT = """
import json, sys
sys.path.insert(0, "tests")
import jax
import counting_task
from replax.run import assemble as run_lib
from replax.config import spec as spec_lib
config = counting_task.get_config()
for flag in sys.argv[2:]:
    *path, last = flag[len("--config."):].split("=", 1)[0].split(".")
    node = config
    for part in path:
        node = node[part]
    node[last] = type(node[last])(flag.split("=", 1)[1])
run = run_lib.build(spec_lib.parse(config), sys.argv[1])
_, replay_state = run_lib.init_states(run)
pools = run.buffer.num_shards
held = sorted({
    tuple(i // (leaf.shape[0] // pools) for i in s.index[0].indices(leaf.shape[0])[:2])
    for leaf in jax.tree.leaves(replay_state) if leaf.ndim
    for s in leaf.addressable_shards
})
print(json.dumps({"process": jax.process_index(), "pools": pools, "held": held,
                  "mode": run.buffer.sample_mode}))
"""


def test_replay_store_sharded_per_host_matches_one_process(tmp_path):
    """replay.sample_mode='local' (the default): each data shard keeps and draws from its
    own slice of the store, and each process holds the slices of its own devices. Auto
    replay at a given mu generates on some steps only: the processes make the same plan,
    and the steps without generation feed global placeholders."""
    layout = run_processes(
        None,
        str(tmp_path / "layout_logs"),
        command=[sys.executable, "-c", _LAYOUT, str(tmp_path / "layout"), *MICRO],
    )
    reports = [json.loads(out.strip().splitlines()[-1]) for out in layout]
    for p, report in enumerate(reports):
        assert report["mode"] == "local" and report["pools"] == PROCESSES * DEVICES
        # Process p holds the pools of its own 4 devices, 4p ... 4p + 3, whole.
        assert report["process"] == p
        assert report["held"] == [[DEVICES * p + i, DEVICES * p + i + 1] for i in range(DEVICES)]

    flags = [
        "--config.replay.sample_mode=local",
        "--config.replay.mode=auto",
        "--config.replay.auto_every=2",
        "--config.replay.mu=50",
        "--config.total_steps=6",
    ]
    reference_records, reference_logs = one_process_reference(tmp_path / "one", *flags)
    generating = sum(r["reward_mean"] is not None for r in reference_records)
    assert 2 <= generating < 6  # e.g. steps 1 and 5
    workdir, logs = str(tmp_path / "run"), str(tmp_path / "logs")
    run_processes(workdir, logs, *flags)
    worst = assert_same_metrics(read(workdir), reference_records)
    print(f"largest relative difference of a float metric >= 1e-3: {worst:.3g}")
    assert_each_process_scored_its_rows(logs, reference_logs, steps=generating)


def test_disjoint_on_two_processes_matches_one_and_resumes_with_a_generation_in_flight(tmp_path):
    """rollout.placement='disjoint' on 2 processes x 4 devices: each process gives the
    sampler 2 of its devices and decodes its own block of every batch there while its
    other 2 train (the weights cross processes in the trainer's reshard, an all-gather
    both take part in). Against 1 process x 8 devices split 4 / 4, the same meshes. Lag 1:
    the checkpoint at step 2 holds generation 2, in flight, finished into it; fresh
    processes resume from it."""
    flags = [
        "--config.rollout.placement=disjoint",
        "--config.rollout.num_devices=4",
        "--config.rollout.max_policy_lag=1",
    ]
    reference_records, reference_logs = one_process_reference(tmp_path / "one", *flags)
    assert {r["policy_lag_max"] for r in reference_records[1:]} == {1}
    workdir, logs = str(tmp_path / "run"), str(tmp_path / "logs")
    # Killed while writing checkpoint 4: checkpoint 2 holds generation 2 (started at step
    # 1, added at 2) as `pending`.
    run_processes(workdir, logs, *flags, env={"REPLAX_CRASH_AT": "write:4"}, check=False)
    crashed_logs = str(tmp_path / "crashed_logs")  # what the first launch scored
    os.rename(logs, crashed_logs)
    with open(os.path.join(workdir, "checkpoints", "2", "loop_state", "metadata")) as f:
        assert json.load(f)["pending"]["generation"] == 2
    second = run_processes(workdir, logs, *flags)
    assert "resumed from step 2" in second[0] and not replax_lines(second[1])
    records = read(workdir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    worst = assert_same_metrics(records, reference_records)
    print(f"largest relative difference of a float metric >= 1e-3: {worst:.3g}")
    # Each process scored its own half of every generation: the first launch all four
    # (generation 2 went into checkpoint 2 finished), the resumed one generation 3 again.
    assert_each_process_scored_its_rows(crashed_logs, reference_logs, steps=4)
    assert_each_process_scored_its_rows(logs, reference_logs, steps=1, first=3)


# Copies a tree sharded over 3 trainer devices of each process onto 1 sampler device of
# each (3 copies of the sampler's layout) and onto 2 of each (sharded over them), and
# prints what every device holds against the whole array.
_COPY = """
import json, sys
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from replax.rl import placement
from replax.core import processes, sharding
processes.maybe_initialize_distributed()
whole = np.arange(48 * 4, dtype=np.float32).reshape(48, 4)
report = {}
for k in (1, 2):
    trainer, sampler = placement.split_devices(k * jax.process_count())
    mesh = sharding.make_mesh((-1, 1, 1), devices=trainer)
    rows = NamedSharding(mesh, P("data"))
    x = jax.make_array_from_callback(whole.shape, rows, lambda i: whole[i])
    target_mesh = sharding.make_mesh((1, 1, -1), devices=sampler)
    targets = [NamedSharding(target_mesh, P("tensor")), NamedSharding(target_mesh, P())]
    out = processes.copy_to_process_mesh([x, x], targets, {})
    report[k] = [
        [s.device.process_index == jax.process_index(), np.array_equal(s.data, whole[s.index])]
        for y in out for s in y.addressable_shards
    ] + [[len(y.addressable_shards) == k, y.sharding == t] for y, t in zip(out, targets)]
print(json.dumps({"process": jax.process_index(), "report": report}))
"""


def test_weights_copy_from_a_trainer_on_every_process_to_each_process_sampler(tmp_path):
    outputs = run_processes(None, str(tmp_path / "logs"), command=[sys.executable, "-c", _COPY])
    for p, out in enumerate(outputs):
        report = json.loads(out.strip().splitlines()[-1])
        assert report["process"] == p
        for k, checks in report["report"].items():
            assert checks and all(all(c) for c in checks), (p, k, checks)


# A LoRA model's params on a trainer sharded over both processes (fsdp over 2 devices of
# each), synced twice to each process's sampler (2 devices of its own); every array
# handed to a placement (jax.device_put or the copy across processes) is recorded.
_SYNC = """
import json
import jax, numpy as np, optax
from replax.core import processes, sharding
processes.maybe_initialize_distributed()
from replax.model import lora, transformer as model_lib
from replax.rl import placement, weight_sync, train_step as train_step_lib
from replax.sampling import sampler as sampler_lib
config = model_lib.ModelConfig(vocab_size=32, num_layers=1, d_model=16, num_heads=4,
    num_kv_heads=2, head_dim=4, mlp_dim=32, max_len=12, lora_rank=2)
rules = sharding.validate_rules(sharding.DEFAULT_RULES)
trainer, own = placement.split_devices(2 * jax.process_count())
mesh = sharding.make_mesh((1, -1, 1), devices=trainer)
state, _ = train_step_lib.init_train_state(
    model_lib.Transformer(config), optax.adam(1e-3), jax.random.key(0), mesh, rules)
sampler = sampler_lib.make_sampler(config, max_prompt_len=4, max_new_tokens=4,
    stop_ids=(31,), pad_id=0, mesh=sharding.make_mesh((1, 2, 1), devices=own), rules=rules)
crossed, trainer_set = [], set(trainer)
real_put, real_copy = jax.device_put, processes.copy_to_process_mesh
def put(x, *a, **k):
    crossed.extend(y for y in jax.tree.leaves(x)
                   if isinstance(y, jax.Array) and y.sharding.device_set == trainer_set)
    return real_put(x, *a, **k)
def copy(leaves, *a, **k):
    crossed.extend(leaves)
    return real_copy(leaves, *a, **k)
jax.device_put, processes.copy_to_process_mesh = put, copy
ids = lambda tree: {id(x) for x in jax.tree.leaves(tree)}
sync = weight_sync.WeightSync(sampler, config)
first = sync(state.params)
report = {"first_whole": {id(x) for x in crossed} == ids(state.params)}
crossed.clear()
params = jax.jit(lambda p: jax.tree_util.tree_map_with_path(
    lambda path, x: x + 0.25 if "lora" in jax.tree_util.keystr(path) else x, p))(state.params)
second = sync(params)
adapters, base = lora.partition(params, True)
got = {id(x) for x in crossed}
expected = jax.tree.map(processes.to_host, params)
report.update(
    across=not all(x.is_fully_addressable for x in jax.tree.leaves(params)),
    adapters_only=got == ids(adapters) and not got & ids(base),
    bytes=sync.bytes == sum(x.nbytes for x in crossed) == lora.adapter_bytes(params),
    base_kept=all(a is b for a, b in zip(jax.tree.leaves(lora.partition(first, True)[1]),
                                         jax.tree.leaves(lora.partition(second, True)[1]))),
    equal=all(np.array_equal(np.asarray(x), y) for x, y in
              zip(jax.tree.leaves(second), jax.tree.leaves(expected))),
    on_own=all(x.sharding.device_set == set(own) for x in jax.tree.leaves(second)),
)
print(json.dumps({"process": jax.process_index(), "report": report}))
"""


def test_a_lora_sync_across_processes_moves_only_the_adapters(tmp_path):
    """After the first sync (the whole tree, base included), what a trainer spanning both
    processes hands across to each process's sampler is the adapters, nothing of the
    base; the sampler keeps its base arrays and decodes with the trainer's values."""
    outputs = run_processes(None, str(tmp_path / "logs"), command=[sys.executable, "-c", _SYNC])
    for p, out in enumerate(outputs):
        report = json.loads(out.strip().splitlines()[-1])
        assert report["process"] == p
        assert all(report["report"].values()), (p, report["report"])


# The survivor's one line (its progress lines, `step N/M ...`, aside).
LOST = r"replax: process {} of 2 was lost at step \d; run the same command on every process to resume from step 2"  # noqa: E501


def _lose_a_process(workdir, logs, victim, *, crash_at=None):
    """The run with process `victim` lost: killed with SIGKILL (the command its launcher
    started) as soon as checkpoint 2 is sealed, or, with crash_at, killing itself at that
    point of a save (REPLAX_CRASH_AT). Returns the survivor's exit status, its stderr and
    the seconds from the loss to its exit."""
    env_of = {victim: {"REPLAX_CRASH_AT": crash_at}} if crash_at else None
    procs, outputs = start_processes(workdir, logs, env_of=env_of)
    survivor = procs[1 - victim]
    sealed = os.path.join(workdir, "checkpoints", "2", "checksums.json")
    lost_at, deadline = None, time.time() + 900
    try:
        while survivor.poll() is None and time.time() < deadline:
            if lost_at is None and crash_at is None and os.path.exists(sealed):
                procs[victim].kill()
                procs[victim].wait()  # gone now: the survivor may see it within 0.2 s
            if lost_at is None and procs[victim].poll() is not None:
                lost_at = time.time()
            time.sleep(0.2)
        if lost_at is None and procs[victim].poll() is not None:
            lost_at = time.time()  # both ended within one poll (the survivor within 0.2 s)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    outputs[1 - victim][1].seek(0)
    if lost_at is None:
        said = outputs[1 - victim][1].read()[-3000:]
        raise AssertionError(
            f"the survivor exited ({survivor.returncode}) before its peer was lost: {said}"
        )
    return survivor.returncode, outputs[1 - victim][1].read(), time.time() - lost_at


def test_a_lost_process_stops_the_other_in_one_line_and_the_rerun_resumes_exactly(tmp_path):
    """Process 0 (the coordinator) killed after checkpoint 2; rerun, process 1 killed while
    it writes checkpoint 4. Each time the survivor exits within 120 s with one line and no
    traceback, and checkpoint 4 is not sealed; run once more, both processes end exactly
    where the run without a loss ends."""
    reference = tmp_path / "reference"
    run_processes(str(reference / "run"), str(reference / "logs"))
    workdir, logs = str(tmp_path / "run"), str(tmp_path / "logs")
    for victim, crash_at in ((0, None), (1, "write:4")):
        status, stderr, seconds = _lose_a_process(workdir, logs, victim, crash_at=crash_at)
        print(f"process {victim} lost: the survivor exited {seconds:.1f} s later")
        assert status == lost_host.EXIT_PEER_LOST, stderr[-3000:]
        assert seconds <= 120
        said = [
            line for line in stderr.splitlines() if line.strip() and not line.startswith("step ")
        ]
        assert len(said) == 1 and re.fullmatch(LOST.format(victim), said[0]), stderr[-3000:]
        steps = [n for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit()]
        assert steps == ["2"]  # checkpoint 4, if it was begun, was never committed
    last = run_processes(workdir, logs)
    assert "resumed from step 2" in last[0]
    # Every value but timing, exactly.
    assert strip_timing(read(workdir)) == strip_timing(read(str(reference / "run")))


def test_a_stream_on_two_processes_resumes_exactly_with_rows_in_flight(tmp_path):
    """rollout.stream=True on 2 processes x 4 devices: each process streams its own block of
    every generation through the slots of its 2 sampler devices, and the checkpoint holds
    every process's stream (gathered into one array; process p restores row p). Killed
    while writing checkpoint 4, resumed in fresh processes from checkpoint 2, which was
    taken with rollouts queued: every metric but timing as the uninterrupted run's, and
    each process scored what it scored there. (Against 1 process the runs differ by
    design: one stream's slots are shared by both blocks, so the weights each token is
    sampled under differ.)"""
    flags = [
        "--config.rollout.placement=disjoint",
        "--config.rollout.num_devices=4",
        "--config.rollout.stream=True",
        "--config.rollout.slots=4",
        "--config.rollout.max_policy_lag=2",
    ]
    reference = tmp_path / "reference"
    run_processes(str(reference / "run"), str(reference / "logs"), *flags)
    records = read(str(reference / "run"))
    assert all(r["policy_lag_max"] <= 2 for r in records)
    assert any(r["token_lag_mean"] > 0 for r in records)
    workdir, logs = str(tmp_path / "run"), str(tmp_path / "logs")
    run_processes(workdir, logs, *flags, env={"REPLAX_CRASH_AT": "write:4"}, check=False)
    crashed_logs = str(tmp_path / "crashed_logs")
    os.rename(logs, crashed_logs)
    with open(os.path.join(workdir, "checkpoints", "2", "loop_state", "metadata")) as f:
        pending = json.load(f)["pending"]
    assert pending["stream"] == 1 and pending["queued"] + pending["decoding"] > 0, pending
    second = run_processes(workdir, logs, *flags)
    assert "resumed from step 2" in second[0]
    assert strip_timing(read(workdir)) == strip_timing(records)
    # Process p's scoring, in order: the first launch's is a start of the uninterrupted
    # run's, the resumed launch's its end (what was in flight at checkpoint 2 again).
    scored = lambda where: {p: train_answers(a) for p, a in logged(where, "reward").items()}
    whole, first, resumed = scored(str(reference / "logs")), scored(crashed_logs), scored(logs)
    assert sorted(whole) == sorted(first) == sorted(resumed) == list(range(PROCESSES))
    for p, answers in whole.items():
        assert answers[: len(first[p])] == first[p], p
        assert answers[len(answers) - len(resumed[p]) :] == resumed[p], p
        assert len(first[p]) + len(resumed[p]) >= len(answers), p
