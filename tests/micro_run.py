"""The train script on a micro config: what the end-to-end tests of several packages run."""

import json
import os
import subprocess
import sys

from replax.run import metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A micro run: tiny policy, no warm start, a few steps; R = 8, B = 16, N = 32 so that the
# 8 simulated devices divide every batch.
MICRO = [
    "--config.model.num_layers=1",
    "--config.model.d_model=32",
    "--config.model.num_heads=2",
    "--config.model.num_kv_heads=1",
    "--config.model.head_dim=16",
    "--config.model.mlp_dim=64",
    "--config.model.init=random",
    "--config.task.num_train=64",
    "--config.task.num_test=16",
    "--config.rollout.prompts_per_step=2",
    "--config.rollout.group_size=4",
    "--config.train.batch_size=16",
    "--config.replay.capacity=32",
    "--config.eval.num_prompts=16",
    "--config.eval.pass_k=2",
    "--config.eval.pass_k_prompts=8",
    "--config.eval.every=3",
    "--config.checkpoint_every=3",
    "--config.total_steps=6",
]


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
