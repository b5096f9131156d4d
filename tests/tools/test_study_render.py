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
