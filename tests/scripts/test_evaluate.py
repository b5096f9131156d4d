"""scripts/evaluate.py on a run whose policy scores well above 0: the figures it prints
for a step are the run's own evaluation of that step, and another step's differ (a
random policy on arith scores 0.000 at every step, which no comparison can tell apart)."""

import json
import os
import subprocess
import sys

import pytest
from micro_run import MICRO, ROOT, USER_PATH, read, run_train


@pytest.fixture(scope="module")
def counting_run(tmp_path_factory):
    """tests/counting_task.py's reward, (sum of the completion's codes + its length) mod 5
    / 4, scores a random policy's greedy answers about 0.5 to 0.9; a rate of 1e-2 moves
    them between the evaluations at steps 3 and 6."""
    workdir = str(tmp_path_factory.mktemp("counting"))
    proc = run_train(
        workdir,
        "--config.optimizer.learning_rate=0.01",
        config="tests/counting_task.py",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir


def test_evaluate_gives_the_runs_own_accuracy_at_the_step_it_names(counting_run):
    assert "--config.eval.every=3" in MICRO and "--config.checkpoint_every=3" in MICRO
    logged = {r["step"]: r["eval_accuracy"] for r in read(counting_run) if "eval_accuracy" in r}
    assert sorted(logged) == [3, 6]
    assert min(logged.values()) > 0.25 and logged[3] != logged[6]
    results = {}
    for step in (3, 6):
        # tests/ on the path: the run's config.json names counting_task:make_task.
        proc = subprocess.run(
            [sys.executable, "scripts/evaluate.py", f"--workdir={counting_run}", f"--step={step}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, **USER_PATH},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[step] = json.loads(proc.stdout.strip().splitlines()[-1])
        assert results[step]["step"] == step
        assert results[step]["eval_accuracy"] == logged[step]  # to the last digit
    assert results[3]["eval_accuracy"] != results[6]["eval_accuracy"]
