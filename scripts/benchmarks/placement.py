"""Colocated against disjoint placement: the wall time of a step when generation (decode
plus host scoring) and training cost about the same.

On this CPU two simulated devices do not compute side by side, so the overlap that can be
shown honestly is host-side scoring against device work: the reward waits on the host
(benchmarks/slow_reward.py, as an external verifier does) for about the train step's time.
Both runs are scripts/train.py on configs/arith.py (random init, no evaluation): colocated
on one device, disjoint on two (one samples, one trains), lag 1. A first colocated run
without the wait measures the phases; then the two placements run interleaved.
Keys: placement_{colocated,disjoint}_step_s (median seconds per step over the steps after
the first 4), placement_gen_s and placement_train_s (colocated seconds per step of
generation including scoring, and of training), placement_reward_s (the wait per step),
placement_disjoint_over_max = disjoint step / max(gen, train) (the target: <= 1.15) and
placement_colocated_over_sum = colocated step / (gen + train).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 16
WARM = 4


def _run(workdir, devices, reward_s, *flags):
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "scripts"), ROOT]),
    }
    cmd = [
        sys.executable,
        os.path.join(ROOT, "scripts", "train.py"),
        f"--config={os.path.join(ROOT, 'scripts', 'benchmarks', 'slow_reward_config.py')}",
        f"--workdir={workdir}",
        "--config.model.init=random",
        f"--config.task.reward_s={reward_s}",
        "--config.eval.every=0",
        "--config.eval.num_prompts=16",
        f"--config.total_steps={STEPS}",
        f"--config.checkpoint_every={STEPS}",
        *flags,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    steady = records[WARM:]
    walls = [b["wall_s"] - a["wall_s"] for a, b in zip(steady, steady[1:])]
    per_step = lambda key: (steady[-1][key] - steady[0][key]) / (len(steady) - 1)
    return statistics.median(walls), per_step("gen_s"), per_step("train_s")


def bench_placement(repeats: int) -> dict:
    disjoint = (
        "--config.rollout.placement=disjoint",
        "--config.rollout.num_devices=1",
        "--config.rollout.max_policy_lag=1",
    )
    with tempfile.TemporaryDirectory() as tmp:
        _, gen_s, train_s = _run(os.path.join(tmp, "probe"), 1, 0.0)
        # Generation (decode + scoring) as long as training: the wait makes up the rest.
        reward_s = max(train_s - gen_s, 0.0)
        steps = {"colocated": [], "disjoint": []}
        phases = []
        for i in range(max(1, repeats // 2)):
            wall, gen, train = _run(os.path.join(tmp, f"co{i}"), 1, reward_s)
            steps["colocated"].append(wall)
            phases.append((gen, train))
            steps["disjoint"].append(_run(os.path.join(tmp, f"dj{i}"), 2, reward_s, *disjoint)[0])
    gen = statistics.median(p[0] for p in phases)
    train = statistics.median(p[1] for p in phases)
    colocated, disjoint_s = (statistics.median(steps[k]) for k in ("colocated", "disjoint"))
    return {
        "placement_colocated_step_s": colocated,
        "placement_disjoint_step_s": disjoint_s,
        "placement_colocated_steps_s": sorted(steps["colocated"]),
        "placement_disjoint_steps_s": sorted(steps["disjoint"]),
        "placement_gen_s": gen,
        "placement_train_s": train,
        "placement_reward_s": reward_s,
        "placement_disjoint_over_max": disjoint_s / max(gen, train),
        "placement_colocated_over_sum": colocated / (gen + train),
    }
