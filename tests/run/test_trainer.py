"""End to end: the train script on a micro config, resume, bad configuration."""

import json
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest
import xla_flags
from micro_run import MICRO, ROOT, USER_PATH, read, run_train, strip_timing

from replax.rl import scoring


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("full"))
    proc = run_train(workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir, proc


def test_train_script_writes_metrics_and_checkpoints(full_run):
    workdir, proc = full_run
    records = read(workdir)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    required = {
        "step",
        "wall_s",
        "gen_tokens",
        "gen_flops",
        "train_flops",
        "gen_s",
        "train_s",
        "reward_mean",
        "replay_age_mean",
        "replay_age_max",
        "replay_reuse_mean",
        "is_ratio_mean",
        "is_ess",
        "clip_frac",
    }
    for r in records:
        assert required <= set(r), required - set(r)
    assert records[-1]["gen_tokens"] > records[0]["gen_tokens"] > 0
    for key in ("eval_accuracy", "eval_pass_at_k", "entropy"):
        assert key in records[2] and key in records[5]
        assert key not in records[3]
    # Staleness grows once the buffer holds more than one step of rollouts.
    assert records[-1]["replay_age_max"] >= 1
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["3", "6"]
    assert os.path.isdir(os.path.join(workdir, "tensorboard"))
    assert "final" in proc.stdout


def test_train_script_reports_what_the_run_does(full_run):
    workdir, proc = full_run
    records = read(workdir)
    r = 2 * 4  # prompts_per_step x group_size
    previous_tokens = 0
    for record in records:
        assert record["learning_rate"] == 1e-4  # arith's constant rate
        assert record["step_s"] > 0 and record["gen_tokens_per_s"] > 0
        # The fresh completions' statistics agree with the run's token account.
        assert record["completion_len_mean"] * r == record["gen_tokens"] - previous_tokens
        previous_tokens = record["gen_tokens"]
        assert 1 <= record["completion_len_max"] <= 6  # rollout.max_new_tokens
        assert 0.0 <= record["truncated_frac"] <= 1.0 and record["reward_std"] >= 0.0
        assert record["zero_spread_groups_frac"] in (0.0, 0.5, 1.0)  # 2 groups of 4
    # At each evaluation, the first eval.num_samples (4) held-out prompts.
    with open(os.path.join(workdir, "samples.jsonl")) as f:
        samples = [json.loads(line) for line in f]
    assert [s["step"] for s in samples] == [3] * 4 + [6] * 4
    assert [s["index"] for s in samples] == [0, 1, 2, 3] * 2
    for s in samples:
        assert set(s) == {"step", "index", "prompt", "completion", "reward", "answer"}
        assert s["prompt"].endswith("=") and s["answer"].isdigit() and s["reward"] in (0.0, 1.0)
    # Off a terminal: the banner on stdout, progress lines on stderr (the first and last
    # step at least; log.print_every_s is 60 s).
    assert "backend:" in proc.stdout and "per device: parameters" in proc.stdout
    progress_lines = [line for line in proc.stderr.splitlines() if line.startswith("step ")]
    assert progress_lines[0].startswith("step 1/6 reward")
    assert progress_lines[-1].startswith("step 6/6 reward") and "left" in progress_lines[-1]


def test_fresh_statistics_keys_are_reported_on_every_generating_step(full_run):
    records = read(full_run[0])
    assert all(set(scoring.FRESH_KEYS) <= set(r) for r in records)


def test_resume_continues_exactly(full_run, tmp_path):
    workdir, _ = full_run
    first = run_train(str(tmp_path), "--config.total_steps=3")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_train(str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert strip_timing(read(str(tmp_path))) == strip_timing(read(workdir))
    # samples.jsonl too reads as one uninterrupted run.
    with (
        open(os.path.join(str(tmp_path), "samples.jsonl")) as f,
        open(os.path.join(workdir, "samples.jsonl")) as g,
    ):
        assert f.read() == g.read()


@pytest.mark.parametrize(
    "override, key",
    [
        # Every check is in replax.config.build (tests/config/test_build.py); these go
        # through the script: a value, a key the config lacks, a task that does not import.
        ("--config.replay.capacity=8", "replay.capacity"),
        ("--config.no_such_key=1", "no_such_key"),
        ("--config.rollout.group_sise=4", "rollout.group_sise (did you mean rollout.group_size?)"),
        # A key by its meaning: num_prompts is how many prompts, not how long.
        (
            "--config.rollout.num_prompts=4",
            "rollout.num_prompts (did you mean rollout.prompts_per_step?)",
        ),
        ("--config.task.name=no_such_module:make_task", "task.name"),
        # 20 rows do not split over the 8 data shards: the batch size is named, not the
        # microbatches.
        ("--config.train.batch_size=20", "train.batch_size=20: it must split over the 8 data"),
    ],
)
def test_bad_config_exits_2_with_one_line_and_writes_nothing(tmp_path, override, key):
    workdir = tmp_path / "run"
    proc = run_train(str(workdir), override)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert key in lines[0]
    assert not workdir.exists()


def test_a_users_task_trains_without_changes_to_replax(tmp_path):
    """tests/user_task.py defines a task outside replax; its config names it by import
    path. The run builds the task's data, scores with its reward and resumes."""
    workdir = tmp_path / "run"
    proc = run_train(str(workdir), config="tests/user_task_config.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read(str(workdir))
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    (dataset,) = os.listdir(workdir / "data" / "replax_task")
    assert dataset.startswith("reverse3_")
    assert sorted(os.listdir(workdir / "checkpoints")) == ["3", "6"]
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in records)


def test_a_users_task_trains_on_the_shipped_config_with_one_flag(tmp_path):
    """`--config=configs/arith.py --config.task.name=user_task:make_task`: the task section
    is arith's, left as the file set it, so its keys are not passed to the user's factory."""
    workdir = tmp_path / "run"
    proc = run_train(
        str(workdir),
        "--config.task.name=user_task:make_task",
        "--config.total_steps=2",
        "--config.checkpoint_every=2",
        env=USER_PATH,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in read(str(workdir))] == [1, 2]
    (dataset,) = os.listdir(workdir / "data" / "replax_task")
    assert dataset.startswith("reverse3_")


def test_a_users_task_by_file_path_trains_without_pythonpath(tmp_path):
    """`--config.task.name=tests/user_task.py:make_task`, as the README says, from the
    repository root with nothing on PYTHONPATH but replax."""
    workdir = tmp_path / "run"
    proc = run_train(
        str(workdir),
        "--config.task.name=tests/user_task.py:make_task",
        "--config.total_steps=2",
        "--config.checkpoint_every=2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in read(str(workdir))] == [1, 2]
    (dataset,) = os.listdir(workdir / "data" / "replax_task")
    assert dataset.startswith("reverse3_")


def test_a_changed_key_of_the_shipped_task_is_refused_for_a_users_task(tmp_path):
    workdir = tmp_path / "run"
    proc = run_train(
        str(workdir),
        "--config.task.name=user_task:make_task",
        "--config.task.max_digits=4",
        env=USER_PATH,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "task.max_digits=4 belongs to the arith task" in lines[0], lines
    assert not workdir.exists()


def evaluate(*args):
    cmd = [sys.executable, "scripts/evaluate.py", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_evaluate_script_reproduces_final_accuracy(full_run):
    """A run is evaluated from its own config.json: no --config."""
    workdir, _ = full_run
    proc = evaluate(f"--workdir={workdir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["step"] == 6
    # The run's own evaluation of step 6, to the last digit: greedy accuracy, and the
    # temperature-1 samples' pass@k and entropy, drawn with the key the run drew them with.
    logged = read(workdir)[-1]
    for key in ("eval_accuracy", "eval_pass_at_k", "entropy"):
        assert result[key] == logged[key], (key, result, logged)
    with open(os.path.join(workdir, "eval.json")) as f:
        assert json.load(f) == result


def test_evaluate_script_takes_a_sealed_step_and_names_them_for_another(full_run):
    workdir, _ = full_run
    proc = evaluate(f"--workdir={workdir}", "--step=3", "--config.eval.pass_k=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["step"] == 3
    assert result["eval_accuracy"] == read(workdir)[2]["eval_accuracy"]  # greedy, as at 3
    for args, message in [
        (
            ["--step=4"],
            f"--step=4 is not a checkpoint of {workdir}/checkpoints: the sealed ones are [3, 6]",
        ),
        (
            ["--config.model.d_model=64"],
            "--config.model.d_model: a run's checkpoint fixes it; a run's evaluation takes "
            "--config.KEY=VALUE for eval.*, mesh.*, rollout.mesh_shape, task.data_dir",
        ),
        (
            ["--config.eval.num_promts=8"],
            "unknown config key eval.num_promts (did you mean eval.num_prompts?): the config "
            "file lists the keys it has",
        ),
        (["--config=configs/arith.py"], "--config with a run: the run is evaluated under"),
    ]:
        proc = evaluate(f"--workdir={workdir}", *args)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
        assert lines[0].startswith(f"error: {message}"), lines


def test_evaluate_script_bad_input_says_what_it_looked_for(tmp_path):
    """A workdir that does not exist is named as such (not as a run's config), and a
    --checkpoint without a tokenizer.json under the default config names the file it
    looked for and the flags to give."""
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    missing = tmp_path / "no_run"
    for args, message in [
        (
            [f"--workdir={missing}", "--config=configs/arith.py"],
            f"--workdir={missing} does not exist: give the workdir of a run",
        ),
        ([f"--workdir={missing}"], f"--workdir={missing} does not exist"),
        (
            [f"--checkpoint={hf_dir}"],
            f"--checkpoint={hf_dir} has no tokenizer.json, and --config=configs/gsm8k.py (the "
            f"default) reads the tokenizer from it ({hf_dir}/tokenizer.json): give "
            "--config=configs/NAME.py",
        ),
    ]:
        proc = evaluate(*args)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
        assert lines[0].startswith(f"error: {message}"), lines
    assert not missing.exists() and os.listdir(hf_dir) == []


def test_disjoint_placement_on_one_device_exits_2(tmp_path):
    workdir = tmp_path / "run"
    proc = run_train(
        str(workdir),
        "--config.rollout.placement=disjoint",
        "--config.train.max_steps_per_generation=1",
        env={"XLA_FLAGS": xla_flags.with_devices(1)},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "rollout.placement='disjoint' needs at least 2 devices" in lines[0], lines
    assert "this machine has 1" in lines[0], lines
    assert not workdir.exists()


def test_evaluate_script_on_a_hugging_face_directory(full_run, tmp_path):
    """--checkpoint evaluates a Hugging Face directory under --config's task: step 6 of the
    run, exported, scores what the run's own evaluation of step 6 did."""
    workdir, _ = full_run
    export = tmp_path / "hf"
    proc = subprocess.run(
        [sys.executable, "scripts/export.py", f"--workdir={workdir}", f"--out={export}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "eval"
    micro = [m for m in MICRO if m.startswith(("--config.eval", "--config.task", "--config.mesh"))]
    proc = evaluate(
        f"--checkpoint={export}", "--config=configs/arith.py", f"--workdir={out}", *micro
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["checkpoint"] == str(export)
    assert result["eval_accuracy"] == read(workdir)[-1]["eval_accuracy"]
    with open(out / "eval.json") as f:
        assert json.load(f) == result


def write_jsonl_task(folder):
    """200 addition records and a reward file that raises on odd-length completions."""
    data = folder / "data.jsonl"
    with open(data, "w") as f:
        for i in range(200):
            f.write(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n")
    reward = folder / "my_reward.py"
    reward.write_text(
        "def reward(prompt, completion, answer):\n"
        "    if len(completion) % 2:\n"
        "        raise ValueError('odd')\n"
        "    assert prompt.endswith('=')\n"
        "    return float(completion.strip() == answer)\n"
    )
    return str(data), str(reward)


JSONL = [
    "--config.task.num_train=0",
    "--config.task.num_test=0",
    "--config.task.test_fraction=0.25",
]


def test_a_jsonl_task_with_a_reward_file_trains_and_counts_reward_errors(tmp_path):
    data, reward = write_jsonl_task(tmp_path)
    workdir = tmp_path / "run"
    proc = run_train(
        str(workdir),
        *JSONL,
        f"--config.task.data_path={data}",
        f"--config.task.reward={reward}:reward",
        "--config.total_steps=2",
        "--config.checkpoint_every=2",
        config="configs/jsonl.py",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read(str(workdir))
    assert [r["step"] for r in records] == [1, 2]
    # 8 random completions a step, about half of odd length: errors scored 0, counted.
    errors = [r["reward_errors"] for r in records]
    assert 0 < errors[0] <= errors[1] <= 16, errors
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in records)


# The README's own-prompts command, cut to a policy of 0.1M parameters and 60 steps. R = 8 x 8
# rollouts a step, B = 64, at lr 3e-4: with 2 x 8 at 1e-4 a few dozen steps leave the
# held-out accuracy where the warm start left it.
README_JSONL_SHRUNK = [
    "--config.model.num_layers=2",
    "--config.model.d_model=64",
    "--config.model.num_heads=2",
    "--config.model.num_kv_heads=1",
    "--config.model.head_dim=32",
    "--config.model.mlp_dim=128",
    "--config.warmstart.eval_every=10",
    "--config.rollout.prompts_per_step=8",
    "--config.train.batch_size=64",
    "--config.optimizer.learning_rate=3e-4",
    "--config.replay.capacity=256",
    "--config.total_steps=60",
    "--config.eval.every=20",
    "--config.eval.num_prompts=24",
    "--config.eval.pass_k_prompts=8",
    "--config.checkpoint_every=60",
]


def test_the_readme_own_prompts_command_on_300_lines_learns(tmp_path):
    # 300 records a byte-level policy learns from so few: "417=" -> "417". The warm start
    # draws its demonstrations from the file's 270-odd train records (nothing asked of
    # the 20,000 the embedded task's warm start takes) and stops in its window; RL on
    # the same records then raises the reward. The held-out accuracy, 24 prompts, moves
    # by seed (docs/reference.md#your-own-prompts): it is checked to be logged.
    rng = random.Random(1)
    data = tmp_path / "my_data.jsonl"
    with open(data, "w") as f:
        for _ in range(300):
            digits = str(rng.randint(100, 999))
            f.write(json.dumps({"prompt": f"{digits}=", "answer": digits}) + "\n")
    (tmp_path / "my_reward.py").write_text(
        "def reward(prompt, completion, answer):\n    return float(completion.strip() == answer)\n"
    )
    workdir = tmp_path / "runs" / "mine"
    cmd = [
        sys.executable,
        os.path.join(ROOT, "scripts", "train.py"),
        f"--config={os.path.join(ROOT, 'configs', 'jsonl.py')}",
        f"--workdir={workdir}",
        "--config.task.data_path=my_data.jsonl",
        "--config.task.reward=my_reward.py:reward",
        *README_JSONL_SHRUNK,
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    base, final = map(
        float, re.search(r"accuracy ([\d.]+) -> final ([\d.]+)", proc.stdout).groups()
    )
    assert 0.30 <= base <= 0.40, proc.stdout[-2000:]  # the warm start's window
    evals = [r["eval_accuracy"] for r in read(str(workdir)) if "eval_accuracy" in r]
    assert len(evals) == 3 and round(evals[-1], 3) == final
    rewards = [r["reward_mean"] for r in read(str(workdir))]
    assert len(rewards) == 60 and np.mean(rewards[-10:]) >= np.mean(rewards[:10]) + 0.05, (
        rewards,
        evals,
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--config.eval.num_prompts=64"], "eval.num_prompts=64 is more than the "),
        (
            ["--config.model.init=warmstart", "--config.warmstart.num_examples=20000"],
            "warmstart.num_examples=20000 is more than the ",
        ),
        (["--config.task.data_path=/no/such.jsonl"], "task.data_path='/no/such.jsonl': no such"),
        (["--config.task.reward=no_colon"], "task.reward='no_colon': allowed are"),
        (["--config.task.reward={reward}:nothing"], "task.reward='{reward}:nothing': "),
        (["--config.task.data_path={bad}"], "task.data_path='{bad}': line 1 has no 'answer'"),
    ],
)
def test_a_jsonl_task_with_bad_settings_exits_2(tmp_path, flags, message):
    data, reward = write_jsonl_task(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n')
    workdir = tmp_path / "run"
    fill = {"reward": reward, "bad": bad}
    proc = run_train(
        str(workdir),
        *JSONL,
        f"--config.task.data_path={data}",
        *[f.format(**fill) for f in flags],
        config="configs/jsonl.py",
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message.format(**fill) in lines[0], lines
    assert not workdir.exists()
