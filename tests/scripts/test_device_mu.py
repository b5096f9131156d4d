"""scripts/device_mu.py at the tiny shape on the CPU: the figures it writes hold together
(mu is generation seconds per rollout over train seconds per rollout, the engine draws
the static sampler's rollouts) and bad input exits 2."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = [
    "--shape=tiny",
    "--dtype=float32",
    "--prompts=4",
    "--group_size=2",
    "--prompt_len=6",
    "--new_tokens=8",
    "--batch_size=16",
    "--microbatches=2",
    "--slots=4",
    "--refill_every=2",
    "--repeats=1",
    "--stop_bias=3.0",  # no bisection: it compiles a sampler per try
]


def run(*args):
    cmd = [sys.executable, "scripts/device_mu.py", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_figures_hold_together(tmp_path):
    out = tmp_path / "device_mu.json"
    proc = run(*TINY, f"--out={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    gen, train = result["generation"], result["train"]
    per_train = train["step_s"] / result["settings"]["batch_size"]
    for name in ("static", "engine"):
        per_rollout = gen[name]["seconds"] / result["settings"]["rollouts"]
        assert abs(result[f"mu_{name}"] - per_rollout / per_train) < 1e-9 * result[f"mu_{name}"]
        assert 0 < gen[name]["useful_row_step_frac"] <= 1
    assert gen["engine"]["same_tokens_as_static"] is True
    assert train["mfu"] == train["flops"] / train["step_s"] / result["peak_flops_per_s"]
    assert result["peak_source"].startswith("measured")  # no accelerator here
    assert result["length_spread"]["cap"] == 8


def test_bad_input_exits_2():
    proc = run(*TINY, "--slots=0")
    assert proc.returncode == 2 and "--slots=0" in proc.stdout
