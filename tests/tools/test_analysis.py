"""Tests for replax/tools/analysis.py: reaching a target, the modelled cost, the steady mu and
medians over seeds where "never" counts as +inf, on records small enough to check by hand."""

import json
import math

import numpy as np
import pytest

from replax.tools import analysis

# Three logged steps, evaluations at steps 2 and 3 (accuracy 0.4, then 0.6).
RECORDS = [
    {"step": 1, "gen_tokens": 100, "train_rollouts": 8, "gen_rollouts": 8,
     "gen_s": 10.0, "train_s": 5.0, "wall_s": 16.0},
    {"step": 2, "gen_tokens": 200, "train_rollouts": 16, "gen_rollouts": 16,
     "gen_s": 12.0, "train_s": 6.0, "wall_s": 19.0, "eval_accuracy": 0.4},
    {"step": 3, "gen_tokens": 300, "train_rollouts": 24, "gen_rollouts": 16,
     "gen_s": 14.0, "train_s": 7.0, "wall_s": 22.0, "eval_accuracy": 0.6,
     "eval_pass_at_k": 0.8, "entropy": 1.5, "mu_measured": 3.0},
]  # fmt: skip


def test_first_reach_and_the_cost_to_target():
    assert analysis.first_reach(RECORDS, 0.5)["step"] == 3
    assert analysis.first_reach(RECORDS, 0.7) is None
    assert analysis.first_reach(RECORDS, 0.5, base_accuracy=0.5)["gen_tokens"] == 0
    # cost = train_rollouts + mu gen_rollouts = 24 + 6 x 16 at step 3.
    assert analysis.modelled_cost(RECORDS[2], 6.0) == 120.0
    got = analysis.to_target(RECORDS, 0.5, {"cost": 6.0})
    assert got == {
        "gen_tokens_to_target": 300,
        "train_rollouts_to_target": 24,
        "train_cost_to_target": 24,  # records without train_cost: each rollout costs 1
        "gen_rollouts_to_target": 16,
        "cost": 120.0,
    }
    assert analysis.to_target(RECORDS, 0.9, {"cost": 6.0})["cost"] == math.inf


def test_the_cost_counts_every_pass_of_the_steps():
    """train_cost, when the records have it, is the training's part of the cost: 24
    rollouts trained in steps of 4/3 a plain step's FLOPs cost 32, and 32 + 6 x 16 = 128."""
    with_cost = [{**r, "train_cost": r["train_rollouts"] * 4 / 3} for r in RECORDS]
    assert analysis.modelled_cost(with_cost[2], 6.0) == pytest.approx(128.0)
    got = analysis.to_target(with_cost, 0.5, {"cost": 6.0})
    assert got["train_cost_to_target"] == pytest.approx(32.0) and got["cost"] == pytest.approx(128)
    assert got["train_rollouts_to_target"] == 24


def test_steady_mu_leaves_out_the_first_step():
    # (14 - 10) / (16 - 8) generation over (7 - 5) / (24 - 8) training seconds per rollout.
    assert analysis.steady_mu(RECORDS) == pytest.approx((4 / 8) / (2 / 16))
    assert analysis.steady_mu(RECORDS[:1]) is None  # no rollouts between: no estimate


def test_summarize_run():
    summary = analysis.summarize_run(RECORDS, base_accuracy=0.1)
    assert summary["final_accuracy"] == 0.6 and summary["mean_accuracy"] == pytest.approx(0.5)
    assert (summary["pass_at_k"], summary["entropy"], summary["steps"]) == (0.8, 1.5, 3)
    assert summary["gen_tokens"] == 300 and summary["base_accuracy"] == 0.1
    with pytest.raises(ValueError, match="no evaluation record"):
        analysis.summarize_run(RECORDS[:1])


def test_median_and_iqr_read_none_as_never():
    assert analysis.median([1.0, 3.0, None]) == 3.0
    assert analysis.median([1.0, None, None]) is None  # the median run never got there
    assert analysis.median([1.0, 3.0, None], none_is_inf=False) == 2.0
    assert analysis.iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == [2.0, 4.0]
    assert analysis.iqr([1.0, 2.0, None, None]) == [1.75, None]
    assert analysis.ratio(3, 4) == 0.75 and analysis.ratio(3, 0) is None


def test_aggregate_over_seeds():
    seeds = [{"a": 1.0, "t": 10.0}, {"a": 3.0, "t": None}, {"a": 2.0, "t": 30.0}]
    out = analysis.aggregate(seeds, ["a", "t"], never_keys=["t"])
    assert out["a"] == 2.0 and out["t"] == 30.0
    assert out["per_seed"] == {"a": [1.0, 3.0, 2.0], "t": [10.0, None, 30.0]}


def test_accuracy_curve_and_median_band():
    xs, ys = analysis.accuracy_curve(RECORDS, lambda r: r["gen_tokens"], base_accuracy=0.1)
    np.testing.assert_array_equal(xs, [0, 200, 300])
    np.testing.assert_array_equal(ys, [0.1, 0.4, 0.6])
    curves = [(np.array([0.0, 10.0]), np.array([0.0, 1.0])), (np.array([0.0, 5.0]), np.zeros(2))]
    grid, med, q1, q3 = analysis.median_band(curves, num_points=3)
    np.testing.assert_allclose(grid, [0.0, 2.5, 5.0])  # stops at the shorter curve
    np.testing.assert_allclose(med, [0.0, 0.125, 0.25])  # median of (0.25 x, 0) = 0.125 x
    assert analysis.median_band([]) is None


def test_finished_runs_from_their_files(tmp_path):
    assert analysis.last_record(str(tmp_path)) is None
    assert not analysis.is_finished(str(tmp_path), 3)
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for r in RECORDS:
            f.write(json.dumps(r) + "\n")
    (tmp_path / analysis.SUMMARY_FILE).write_text(json.dumps({"base_accuracy": 0.1}))
    assert analysis.is_finished(str(tmp_path), 3)
    assert not analysis.is_finished(str(tmp_path), 4)
    assert analysis.is_finished(str(tmp_path), 4, total_rollouts=16)  # budget spent
    records, base = analysis.load_run(str(tmp_path))
    assert [r["step"] for r in records] == [1, 2, 3] and base == 0.1
    assert [r["train_cost"] for r in records] == [8, 16, 24]  # no config: plain steps
    config = {"loss": {"clip_cov_ratio": 2e-4}, "train": {"num_microbatches": 4}}
    (tmp_path / analysis.RUN_CONFIG_FILE).write_text(json.dumps(config))
    records, _ = analysis.load_run(str(tmp_path))
    assert records[-1]["train_cost"] == pytest.approx(32.0)  # the extra forward counted


# Held-out accuracy and entropy of three evaluations.
EVALS = [
    {"step": 1, "eval_accuracy": 0.2, "entropy": 2.0},
    {"step": 2, "eval_accuracy": 0.4, "entropy": 1.6},
    {"step": 3, "eval_accuracy": 0.6, "entropy": 1.0},
]


def test_entropy_where_a_run_first_reaches_an_accuracy():
    # Between 0.4 (1.6) and 0.6 (1.0): 1.6 + (0.1 / 0.2) (1.0 - 1.6) = 1.3.
    assert analysis.entropy_at(EVALS, 0.5) == pytest.approx(1.3)
    assert analysis.entropy_at(EVALS, 0.4) == pytest.approx(1.6)  # reached exactly
    # The first evaluation (or the base) already there: nothing below to interpolate from.
    assert analysis.entropy_at(EVALS, 0.1) == 2.0
    assert analysis.entropy_at(EVALS, 0.5, base_accuracy=0.5) == 2.0
    assert analysis.entropy_at(EVALS, 0.7) is None  # never reached
    assert analysis.entropy_at(RECORDS[:2], 0.3) is None  # no entropy measured
    # From the last evaluation below, after a dip: 1.8 + (0.2 / 0.3) (1.0 - 1.8).
    dip = [
        {"eval_accuracy": 0.2, "entropy": 2.0},
        {"eval_accuracy": 0.45, "entropy": 1.5},
        {"eval_accuracy": 0.3, "entropy": 1.8},
        {"eval_accuracy": 0.6, "entropy": 1.0},
    ]
    assert analysis.entropy_at(dip, 0.5) == pytest.approx(1.8 - 0.8 * 2 / 3)


def test_shared_accuracy_levels_and_medians_of_the_runs_that_reach_them():
    # From the largest start (0.2) to the smallest final (0.6) in 5 steps.
    assert analysis.accuracy_levels([0.1, 0.2], [0.7, 0.6]) == [0.28, 0.36, 0.44, 0.52, 0.6]
    # A run ends (0.4) below another's start (0.5): the smallest start to the largest final.
    assert analysis.accuracy_levels([0.1, 0.5], [0.4, 0.9]) == [0.26, 0.42, 0.58, 0.74, 0.9]
    assert analysis.accuracy_levels([], []) == []
    assert analysis.median_of_reached([1.0, None, 3.0]) == 2.0
    assert analysis.median_of_reached([1.0, None]) == 1.0  # half of them: enough
    assert analysis.median_of_reached([1.0, None, None]) is None
    assert analysis.median_of_reached([]) is None
    seeds = [{"e": 1.0}, {"e": None}, {"e": 3.0}]
    out = analysis.aggregate(seeds, ["e"], reached_keys=["e"])
    assert out["e"] == 2.0 and out["per_seed"]["e"] == [1.0, None, 3.0]
    assert out["iqr"]["e"] == [1.5, 2.5]


def test_device_groups_and_device_seconds():
    from replax.run import runtime

    assert analysis.RUN_CONFIG_FILE == runtime.RUN_CONFIG_FILE
    colocated = analysis.device_groups(None, 8)
    assert colocated == {"placement": "colocated", "W": 0, "T": 8}
    disjoint = {"rollout": {"placement": "disjoint", "num_devices": 2}}
    assert analysis.device_groups(disjoint, 8) == {"placement": "disjoint", "W": 2, "T": 6}
    half = {"rollout": {"placement": "disjoint", "num_devices": 0}}
    assert analysis.device_groups(half, 8)["W"] == 4  # 0: half of them
    # RECORDS[0]: 16 s wall, 10 s generating, 5 s training.
    got = analysis.device_seconds(RECORDS[0], colocated)
    assert got == {"device_s": 8 * 16.0, "busy_device_s": 8 * 15.0}
    got = analysis.device_seconds(RECORDS[0], analysis.device_groups(disjoint, 8))
    assert got == {"device_s": 8 * 16.0, "busy_device_s": 2 * 10.0 + 6 * 5.0}
    # At the target 0.5 (step 3: 22 s wall, 14 + 7 busy), never, and reached by the base.
    hit = analysis.to_target(RECORDS, 0.5, {}, groups=colocated)
    assert hit["wall_s_to_target"] == 22.0
    assert (hit["device_s_to_target"], hit["busy_device_s_to_target"]) == (176.0, 168.0)
    never = analysis.to_target(RECORDS, 0.9, {}, groups=colocated)
    assert never["device_s_to_target"] == math.inf and never["wall_s_to_target"] == math.inf
    start = analysis.to_target(RECORDS, 0.5, {}, base_accuracy=0.5, groups=colocated)
    assert start["device_s_to_target"] == 0 and start["busy_device_s_to_target"] == 0
    assert "device_s_to_target" not in analysis.to_target(RECORDS, 0.5, {})  # as before
    # The paper's (1 + W/T) / (1 + mu): W/T = 3 at mu = 6.
    assert analysis.paper_compute_ratio(3, 6.0) == pytest.approx(4 / 7)
    assert analysis.paper_compute_ratio(3, None) is None
