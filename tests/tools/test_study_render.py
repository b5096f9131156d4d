"""Tests for replax/tools/study_render.py: compare.md's grid lines and transfer cells (the
tables and plots of a whole study: test_study_report.py)."""

from study_runs import ONE_RATE_GRID

from replax.tools import lr_selection, study_render


def test_details_say_the_grid_edge_and_a_transfer_not_measured():
    payload_grid = {"onpolicy": ONE_RATE_GRID}
    text = study_render.details(payload_grid_args(payload_grid))
    assert "- onpolicy: chose 3e-05, AT THE GRID'S LOW EDGE; extended by 3e-05" in text
    # A one-rate grid (a study at chosen rates) has its rate at both edges: said so.
    assert lr_selection.lr_edge([1e-5], 1e-5) == "both"
    assert lr_selection.edge_words("both") == "the grid's only rate"
    # A kept run without its transfer file is "not measured", not "never" (a cost's word).
    transfer = {"prompts": 64, "data": "test.jsonl", "max_new_tokens": 128, "base": 0.016,
                "variants": {"onpolicy": {"eval_accuracy": 0.008,
                                          "per_seed": [None, 0.0, 0.016]}}}  # fmt: skip
    text = study_render.details({**payload_grid_args(payload_grid), "transfer": transfer})
    assert "onpolicy 0.8% (per seed not measured, 0.0%, 1.6%)" in text


def payload_grid_args(grid):
    """A payload for study_render.details with on-policy's grid and no runs."""
    return {"select_seed": 0, "select_by": "mean", "lr_grid": grid,
            "lr_chosen": {"onpolicy": 3e-5}, "lr_edge": {"onpolicy": "low"},
            "lr_added": {"onpolicy": [3e-5]}, "variants": {}}  # fmt: skip


def test_the_cost_heat_map_draws_every_kind_of_cell(tmp_path):
    """sweep.png: x = 1, 2 by y = 1, 2; a cell with a cost and its ratio, one that never
    reaches the target (hatched), one the trainer refused (n/a) and one with cost 0 (a
    linear colour scale); the refinement is not on the grid."""

    def cell(x, y, cost=None, feasible=True, kind="grid"):
        ratio = None if cost is None else cost / 1000
        return {"kind": kind, "x": x, "y": y, "feasible": feasible, "cost_to_target": cost,
                "compute_ratio": ratio, "final_accuracy": 0.4}  # fmt: skip

    payload = {
        "cells": [
            cell(1, 1, 500.0),
            cell(2, 1),
            cell(1, 2, feasible=False),
            cell(2, 2, 0.0),
            cell(2, 2, 10.0, kind="refinement"),
        ],  # fmt: skip
        "target_accuracy": 0.5,
        "mu_model": 6.0,
        "R": 32,
    }
    path = tmp_path / "sweep.png"
    study_render.plot_cost_heatmap(payload, str(path))
    assert path.stat().st_size > 10_000
