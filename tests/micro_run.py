"""The train script on a micro config: what the end-to-end tests of several packages run."""

import json
import os
import subprocess
import sys

from replax.run import metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A micro run: tiny policy, no warm start, a few steps; R = 8, B = 16, N = 32 so that the
# 8 simulated devices divide every batch. As config keys (for tests that build the config
# in process) and as train.py's flags.
MICRO_OVERRIDES = {
    "model.num_layers": 1,
    "model.d_model": 32,
    "model.num_heads": 2,
    "model.num_kv_heads": 1,
    "model.head_dim": 16,
    "model.mlp_dim": 64,
    "model.init": "random",
    "task.num_train": 64,
    "task.num_test": 16,
    "rollout.prompts_per_step": 2,
    "rollout.group_size": 4,
    "train.batch_size": 16,
    "replay.capacity": 32,
    "eval.num_prompts": 16,
    "eval.pass_k": 2,
    "eval.pass_k_prompts": 8,
    "eval.every": 3,
    "checkpoint_every": 3,
    "total_steps": 6,
}
MICRO = [f"--config.{key}={value}" for key, value in MICRO_OVERRIDES.items()]


def run_train(workdir, *extra, config="configs/arith.py", env=None):
    cmd = [
        sys.executable,
        "scripts/train.py",
        f"--config={config}",
        f"--workdir={workdir}",
        *MICRO,
        *extra,
    ]
    env = None if env is None else {**os.environ, **env}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)


# tests/ on the path, so that `user_task:make_task` imports (as a user's package would).
USER_PATH = {
    "PYTHONPATH": os.pathsep.join(
        p for p in (os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH")) if p
    )
}


def read(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


# Keys that measure time, which differs between any two runs.
TIMING = metrics.TIMING_KEYS


def strip_timing(records):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]
