"""Hand-made finished runs for the study tests (tests/tools/test_study_*.py,
test_lr_selection.py): a run's metrics.jsonl, and its config.json when given."""

import json
import os

from replax.tools import analysis

# On-policy's grid after a one-rate study at 1e-4 whose run ends at 0.4 (test_lr_selection
# makes it so; test_study_render reports it).
ONE_RATE_GRID = [{"lr": 1e-4, "final_accuracy": 0.4, "mean_accuracy": 0.4}]


def write_run(
    workdir,
    *,
    r,
    b,
    steps,
    eval_every,
    accuracies,
    tokens_per_step,
    mu,
    entropies=None,
    config=None,
):
    """metrics.jsonl of a run generating r and training on b rollouts per step; held-out
    entropy 0.3 at every evaluation unless `entropies` says; config.json when given."""
    os.makedirs(workdir)
    entropies = entropies or [0.3] * len(accuracies)
    if config is not None:
        with open(os.path.join(workdir, analysis.RUN_CONFIG_FILE), "w") as f:
            json.dump(config, f)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        for step in range(1, steps + 1):
            record = {
                "step": step,
                "gen_tokens": tokens_per_step * step,
                "gen_rollouts": r * step,
                "train_rollouts": b * step,
                "wall_s": 2.0 * step,
                "gen_s": 1.0 * step,
                "train_s": 0.5 * step,
                "mu_measured": mu,
            }
            if step % eval_every == 0:
                record.update(
                    eval_accuracy=accuracies[step // eval_every - 1],
                    eval_pass_at_k=0.9,
                    entropy=entropies[step // eval_every - 1],
                )
            f.write(json.dumps(record) + "\n")
