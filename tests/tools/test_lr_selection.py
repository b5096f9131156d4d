"""Tests for replax/tools/lr_selection.py: the best rate of a grid, its edge, and the grid
grown past it on hand-made finished runs."""

from study_runs import ONE_RATE_GRID, write_run

from replax.tools import lr_selection, study_plan
from replax.tools import transfer as transfer_lib


def test_learning_rate_selection_rules():
    grid = [
        {"lr": 3e-5, "final_accuracy": 0.70, "mean_accuracy": 0.66},
        {"lr": 1e-4, "final_accuracy": 0.72, "mean_accuracy": 0.60},
        {"lr": 3e-4, "final_accuracy": 0.72, "mean_accuracy": 0.62},
    ]
    assert lr_selection.choose_lr(grid, "mean")["lr"] == 3e-5


def test_a_best_rate_at_the_grids_edge_is_reported_and_extended(tmp_path):
    """On-policy's grid 1e-4, 3e-4 on hand-made finished runs whose accuracy peaks at 3e-5:
    the best, 1e-4, is at the low edge; by default the grid grows by 3e-5 (best, again at the
    low edge), then 1e-5, and stops with 3e-5 inside the grid. --noextend_lr_grid only
    reports the edge, and a one-rate grid (a rate given) is never extended."""
    assert lr_selection.lr_edge([1e-4, 3e-4], 1e-4) == "low"
    assert lr_selection.lr_edge([1e-4, 3e-4], 3e-4) == "high"
    assert lr_selection.lr_edge([1e-4], 1e-4) == "both"
    assert lr_selection.lr_edge([3e-5, 1e-4, 3e-4], 1e-4) is None
    assert lr_selection.beyond_edge([1e-4], "both", 3.0) == [3e-5, 3e-4]
    accuracy = {1e-5: 0.3, 3e-5: 0.5, 1e-4: 0.4, 3e-4: 0.2}

    def plan_of(*flags):
        argv = [f"--workdir={tmp_path}", "--variants=onpolicy", "--lr_grid=onpolicy:1e-4,3e-4"]
        plan = study_plan.Plan(study_plan.parse_args([*argv, "--budget_rollouts=128", *flags]))
        plan.validate()  # makes the data directory the specs name
        return plan

    plan = plan_of("--noextend_lr_grid")
    for lr, acc in accuracy.items():
        steps = plan.spec("onpolicy", lr, 0).total_steps
        write_run(plan.run_dir("onpolicy", lr, 0), r=64, b=64, steps=steps, eval_every=steps,
                  accuracies=[acc], tokens_per_step=100, mu=0.5)  # fmt: skip
    lines = []
    chosen = lr_selection.select_lr(plan, "onpolicy", log=lines.append)
    assert (chosen["best"]["lr"], chosen["edge"], chosen["added"]) == (1e-4, "low", [])
    assert "at the grid's low edge" in lines[-1] and "--noextend" in lines[-1]
    # The transfer (checkpoints stay on the machine) measures a run as soon as it finishes
    # if it leads the runs finished so far: 1e-4 (0.4), not 3e-4 (0.2), 3e-5 (0.5), not 1e-5.
    measured = []

    class Recording(transfer_lib.Transfer):
        def of_run(self, variant, lr, seed, run_dir):
            measured.append(lr)

    plan = plan_of()  # extended by default
    chosen = lr_selection.select_lr(plan, "onpolicy", log=lines.append, transfer=Recording(plan))
    assert (chosen["best"]["lr"], chosen["edge"], chosen["added"]) == (3e-5, None, [3e-5, 1e-5])
    assert measured == [1e-4, 3e-5]
    assert [g["lr"] for g in chosen["grid"]] == [1e-5, 3e-5, 1e-4, 3e-4]
    # At most --max_lr_extensions rates are added; the edge is then still reported.
    plan = plan_of("--max_lr_extensions=1")
    chosen = lr_selection.select_lr(plan, "onpolicy", log=lines.append)
    assert (chosen["best"]["lr"], chosen["edge"], chosen["added"]) == (3e-5, "low", [3e-5])
    # A one-rate grid, 1e-4, is at both edges but a rate given: kept, not searched around
    # (3e-5 and 3e-4, both finished here, would otherwise be added and 3e-5 chosen).
    plan = plan_of("--lr_grid=onpolicy:1e-4")
    chosen = lr_selection.select_lr(plan, "onpolicy", log=lines.append)
    assert (chosen["best"]["lr"], chosen["edge"], chosen["added"]) == (1e-4, "both", [])
    assert "not extended: one rate" in lines[-1]
    assert chosen["grid"] == ONE_RATE_GRID
