"""Tests for scripts/compare.py and replax/tools/experiments.py: the ratio arithmetic on
hand-made metrics, then the script end to end on a micro config."""

import importlib.util
import json
import math
import os

import pytest

from replax.tools import analysis
from replax.tools import experiments as ex

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compare = load_script("compare")


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


def test_ratios_on_hand_made_metrics(tmp_path):
    # On-policy, R = B = 64, 4 steps of 100 tokens: finals 0.5, 0.6, 0.4 -> target 0.5.
    # Total cost at mu = 6: 256 + 6 * 256 = 1792; tokens 400.
    # Replay, R = 32, B = 64, 8 steps of 50 tokens, evaluated every 2 steps: seed 0 reaches
    # 0.5 at step 4 (200 tokens, cost 256 + 6 * 128 = 1024), seed 1 at step 6 (300 tokens,
    # cost 384 + 6 * 192 = 1536), seed 2 never: medians 300 tokens and cost 1536.
    onpolicy = [[0.3, 0.4, 0.45, 0.5], [0.3, 0.35, 0.5, 0.6], [0.2, 0.3, 0.4, 0.4]]
    replay = [[0.4, 0.5, 0.55, 0.55], [0.45, 0.45, 0.52, 0.6], [0.3, 0.4, 0.4, 0.45]]
    results = {}
    for name, accs, r, steps, every, tokens, mu in (
        ("onpolicy", onpolicy, 64, 4, 1, 100, 0.5),
        ("replay", replay, 32, 8, 2, 50, 0.4),
    ):
        runs = []
        for seed, acc in enumerate(accs):
            d = str(tmp_path / name / f"seed{seed}")
            write_run(
                d,
                r=r,
                b=64,
                steps=steps,
                eval_every=every,
                accuracies=acc,
                tokens_per_step=tokens,
                mu=mu,
            )
            runs.append((seed, d))
        results[name] = {
            "lr_grid": [{"lr": 1e-4, "final_accuracy": accs[0][-1]}],
            "lr": 1e-4,
            "runs": runs,
        }
    plan = compare.Plan(compare.parse_args([f"--workdir={tmp_path}"]))
    payload, curves = compare.report(plan, results, mu_model=6.0, target=None)

    assert payload["target_accuracy"] == 0.5
    on, rp = payload["variants"]["onpolicy"], payload["variants"]["replay"]
    assert on["gen_tokens"] == 400 and on["total_cost"] == 1792
    assert rp["per_seed"]["gen_tokens_to_target"] == [200, 300, None]
    assert rp["per_seed"]["cost_to_target"] == [1024, 1536, None]
    assert rp["gen_tokens_to_target"] == 300 and rp["cost_to_target"] == 1536
    assert rp["iqr"]["gen_tokens_to_target"] == [250, None]
    assert payload["inference_ratio"] == pytest.approx(300 / 400)
    assert payload["compute_ratio"] == pytest.approx(1536 / 1792)
    # THE SAME BASIS: on-policy's own first reaches are 400 tokens (256 rollouts trained and
    # generated) at seed 0, 300 (192) at seed 1, never at seed 2; medians 400 and 256.
    # Replay's median 384 trained, 192 generated: (384 - 256) / (256 - 192) = 2.
    assert on["per_seed"]["gen_tokens_to_target"] == [400, 300, None]
    assert rp["per_seed"]["train_rollouts_to_target"] == [256, 384, None]
    assert rp["per_seed"]["gen_rollouts_to_target"] == [128, 192, None]
    assert payload["inference_ratio_first_reach"] == pytest.approx(300 / 400)
    assert payload["compute_ratio_first_reach"] == pytest.approx(1536 / 1792)
    assert payload["compute_ratio_first_reach_at_mu_measured"] == pytest.approx(
        (384 + 0.45 * 192) / (256 + 0.45 * 256)
    )
    assert (payload["break_even_mu"], payload["break_even_mu_direction"]) == (2.0, "above")
    assert payload["ratios"]["replay"]["break_even_mu"] == 2.0
    # mu measured: the median of 0.5, 0.5, 0.5, 0.4, 0.4, 0.4 is 0.45.
    assert payload["mu_measured"] == pytest.approx(0.45)
    # Without the first step: 1 s per 64 (on-policy) or 32 (replay) generated rollouts,
    # 0.5 s per 64 trained: mu = 2 and 4, median 3.
    assert payload["mu_measured_steady"] == pytest.approx(3.0)
    on_total = 256 + 0.45 * 256
    assert payload["compute_ratio_at_mu_measured"] == pytest.approx((384 + 0.45 * 192) / on_total)
    assert on["final_accuracy"] == 0.5 and on["per_seed"]["final_accuracy"] == [0.5, 0.6, 0.4]
    # SEED BY SEED. Replay's tokens (cost) to the target over on-policy's whole run.
    versus = payload["versus"]["replay"]
    assert versus["inference_ratio"] == pytest.approx([200 / 400, 300 / 400, None])
    assert versus["compute_ratio"] == pytest.approx([1024 / 1792, 1536 / 1792, None])
    # On the same basis: seed 0 trains as much and generates half (cheaper at every mu),
    # seed 1 trains twice as much and generates as much (at none), seed 2 neither reaches.
    assert versus["inference_ratio_first_reach"] == pytest.approx([200 / 400, 300 / 300, None])
    assert versus["compute_ratio_first_reach"] == pytest.approx([1024 / 1792, 1536 / 1344, None])
    assert versus["break_even_mu"] == [0.0, None, None]
    assert versus["break_even_mu_direction"] == ["always", "never", "neither_reaches"]
    assert versus["first_reach_never"] == [None, None, "both"]
    # Both evaluate at 100, 200, 300, 400 generated tokens. Seed 0: replay ahead at all
    # four; seed 1 (0.45 > 0.3, 0.45 > 0.35, 0.52 > 0.5, 0.6 = 0.6) and seed 2 (0.3 > 0.2,
    # 0.4 > 0.3, 0.4 = 0.4, 0.45 > 0.4): three ahead and one level each.
    assert [p["ahead"] for p in versus["ahead_pairs_per_seed"]] == [4, 3, 3]
    assert versus["ahead_pairs"] == {"ahead": 10, "behind": 0, "level": 2, "pairs": 12}
    # Median finals 0.55 and 0.5: +5 points; seed ranges 0.6 - 0.45 and 0.6 - 0.4.
    spread = versus["seed_spread"]
    assert spread["difference"] == pytest.approx(0.05)
    assert spread["spread"] == pytest.approx(0.2) and not spread["exceeds"]
    # The curves plot and the table prints without training.
    compare.plot(payload, curves, str(tmp_path / "compare.png"))
    text = compare.table(payload)
    assert text.startswith(
        "Same basis, each side's own first reach of the target (50.0%): replay over onpolicy, "
        "tokens 0.75, cost 0.857 at mu=6 (1.27 at the measured mu=0.45); replay cheaper for "
        "mu above the break-even mu 2.\n\n| variant |"
    )
    assert "Replay's first reach over onpolicy's whole run (the earlier basis" in text
    assert "seed 0: 0.5 / 0.571 / every mu, seed 1: 1 / 1.14 / no mu, seed 2: both never" in text
    assert "| replay | 0.0001 | 55.0% |" in text
    assert "replay ahead at 10 of 12 (seed, equal-token evaluation) pairs" in text
    assert (
        "Seed spread: replay minus onpolicy median final accuracy +5.0 points; the larger "
        "seed range (max - min) 20.0 points (replay 15.0, onpolicy 20.0): the difference "
        "does NOT exceed the seed spread."
    ) in text
    assert "| replay | 2 | 45.0% | never |" in text


def test_entropy_and_measured_costs_on_hand_made_metrics(tmp_path):
    """The runs of test_ratios_on_hand_made_metrics (target 0.5), replay now disjoint on
    W = 2 of 8 devices (T = 6) and with its own held-out entropies."""
    onpolicy = [[0.3, 0.4, 0.45, 0.5], [0.3, 0.35, 0.5, 0.6], [0.2, 0.3, 0.4, 0.4]]
    replay = [[0.4, 0.5, 0.55, 0.55], [0.45, 0.45, 0.52, 0.6], [0.3, 0.4, 0.4, 0.45]]
    replay_entropies = [[1.0, 0.9, 0.8, 0.7], [1.2, 1.0, 0.65, 0.6], [1.0] * 4]
    disjoint = {"rollout": {"placement": "disjoint", "num_devices": 2}}
    results = {}
    for name, accs, r, steps, every, mu in (
        ("onpolicy", onpolicy, 64, 4, 1, 0.5),
        ("replay", replay, 32, 8, 2, 0.4),
    ):
        runs = []
        for seed, acc in enumerate(accs):
            d = str(tmp_path / name / f"seed{seed}")
            write_run(
                d,
                r=r,
                b=64,
                steps=steps,
                eval_every=every,
                accuracies=acc,
                tokens_per_step=100 * 32 // r,
                mu=mu,
                entropies=replay_entropies[seed] if name == "replay" else None,
                config=disjoint if name == "replay" else None,
            )
            runs.append((seed, d))
        results[name] = {"lr_grid": [], "lr": 1e-4, "runs": runs}
    plan = compare.Plan(compare.parse_args([f"--workdir={tmp_path}"]))
    payload, curves = compare.report(plan, results, mu_model=6.0, target=None, device_count=8)
    on, rp = payload["variants"]["onpolicy"], payload["variants"]["replay"]

    # ENTROPY AT THE TARGET, 0.5. Seed 0 reaches it at its second evaluation (0.9); seed 1
    # at its third, 0.52, after 0.45: 1.0 + (0.05 / 0.07) (0.65 - 1.0) = 0.75; seed 2
    # never. Two of three reach it: the median of theirs.
    assert rp["per_seed"]["entropy_at_target"] == pytest.approx([0.9, 0.75, None])
    assert rp["entropy_at_target"] == pytest.approx(0.825)
    assert rp["iqr"]["entropy_at_target"] == pytest.approx([0.7875, 0.8625])
    assert on["entropy_at_target"] == pytest.approx(0.3)
    # ENTROPY AT SHARED LEVELS. Without bases the runs start at their first evaluations;
    # the largest start (0.45) is above the smallest final (0.4), so the levels span the
    # smallest start to the largest final: 0.2 + 0.08 k, k = 1..5.
    assert payload["entropy_levels"] == pytest.approx([0.28, 0.36, 0.44, 0.52, 0.6])
    # 0.44: seed 0 between 0.4 and 0.5 (1.0 + 0.4 (0.9 - 1.0) = 0.96), seed 1 at its
    # first evaluation (1.2: nothing below to interpolate from), seed 2 at its last.
    assert rp["entropy_at_accuracy_per_seed"]["0.44"] == pytest.approx([0.96, 1.2, 1.0])
    assert rp["entropy_at_accuracy"]["0.44"] == pytest.approx(1.0)
    assert rp["entropy_at_accuracy"]["0.6"] is None  # seed 1 alone reaches 0.6
    # MEASURED COSTS. On-policy, colocated on 8 devices, 4 steps of 2 s wall (1 s
    # generating, 0.5 s training): device_s = 8 x 8 = 64, busy 8 x (4 + 2) = 48.
    assert (on["placement"], on["W"], on["T"]) == ("colocated", 0, 8)
    assert on["device_s"] == 64 and on["busy_device_s"] == 48
    # Replay, disjoint W = 2, T = 6: seed 0 at step 4 (8 s: (2 + 6) x 8 = 64 device-s,
    # busy 2 x 4 + 6 x 2 = 20), seed 1 at step 6 (12 s: 96, busy 30), seed 2 never.
    assert (rp["placement"], rp["W"], rp["T"]) == ("disjoint", 2, 6)
    assert rp["per_seed"]["wall_s_to_target"] == [8, 12, None]
    assert rp["per_seed"]["device_s_to_target"] == [64, 96, None]
    assert rp["per_seed"]["busy_device_s_to_target"] == [20, 30, None]
    assert (rp["wall_s_to_target"], rp["device_s_to_target"]) == (12, 96)
    assert payload["device_s_ratio"] == pytest.approx(96 / 64)
    assert payload["busy_device_s_ratio"] == pytest.approx(30 / 48)
    # THE PAPER'S W / T TABLE at the measured mu (0.45) and mu_model (6).
    table = payload["paper_table"]
    assert [row["W_over_T"] for row in table["rows"]] == [1, 3, 7]
    row = table["rows"][1]
    assert row["compute_ratio_at_mu_measured"] == pytest.approx(4 / 1.45)
    assert row["compute_ratio_at_mu_model"] == pytest.approx(4 / 7)
    assert row["min_replay_ratio_at_mu_model"] == pytest.approx(2.0)
    # Measured: 128 device-s over 512 trained rollouts against 64 over 256.
    measured = table["measured"]["replay"]
    assert measured["W_over_T"] == pytest.approx(1 / 3)
    assert measured["device_s_per_trained_rollout_ratio"] == pytest.approx(1.0)
    assert measured["compute_ratio_at_mu_measured"] == pytest.approx((4 / 3) / 1.45)
    assert "onpolicy" not in table["measured"]
    compare.plot_entropy(payload, curves, str(tmp_path / "compare_entropy.png"))
    assert (tmp_path / "compare_entropy.png").stat().st_size > 10_000
    assert "| replay | 0.0001 |" in compare.table(payload)

    # A target that one run of three reaches: no entropy there, nor tokens to it.
    payload, _ = compare.report(plan, results, mu_model=6.0, target=0.58, device_count=8)
    for v in ("onpolicy", "replay"):
        s = payload["variants"][v]
        assert s["entropy_at_target"] is None and s["gen_tokens_to_target"] is None, v
        assert s["iqr"]["entropy_at_target"] is None
        assert s["per_seed"]["entropy_at_target"][1] is not None  # seed 1 reaches 0.6


def test_learning_rate_selection_rules():
    compare = load_script("compare")
    grid = [
        {"lr": 3e-5, "final_accuracy": 0.70, "mean_accuracy": 0.66},
        {"lr": 1e-4, "final_accuracy": 0.72, "mean_accuracy": 0.60},
        {"lr": 3e-4, "final_accuracy": 0.72, "mean_accuracy": 0.62},
    ]
    assert compare.choose_lr(grid, "mean")["lr"] == 3e-5
    assert compare.choose_lr(grid, "final")["lr"] == 3e-4  # tie on final: mean decides


def test_ahead_pairs_interpolate_at_the_references_tokens():
    # The candidate from its base 0.1 at 0 tokens, 0.3 at 150, 0.5 at 300. The reference
    # at 100 tokens has 0.25 against the candidate's 0.1 + (100 / 150) 0.2 = 0.233
    # (behind); at 200, 0.35 against 0.3 + (50 / 150) 0.2 = 0.367 (ahead); at 300, 0.5 (level);
    # at 400 the candidate has no evaluation: no pair.
    candidate = [
        {"step": 1, "gen_tokens": 150, "eval_accuracy": 0.3},
        {"step": 2, "gen_tokens": 300, "eval_accuracy": 0.5},
    ]
    reference = [
        {"step": s, "gen_tokens": 100 * s, "eval_accuracy": a}
        for s, a in ((1, 0.25), (2, 0.35), (3, 0.5), (4, 0.9))
    ]
    pairs = analysis.ahead_pairs((candidate, 0.1), (reference, None))
    assert pairs == {"ahead": 1, "behind": 1, "level": 1, "pairs": 3}
    # Without a base the candidate starts at 150 tokens: the reference's first is no pair.
    assert analysis.ahead_pairs((candidate, None), (reference, None))["pairs"] == 2
    # Medians 0.45 and 0.3 (+15 points) against ranges 0.1 and 0.1: exceeds.
    spread = analysis.seed_spread([0.4, 0.45, 0.5], [0.25, 0.3, 0.35])
    assert spread["difference"] == pytest.approx(0.15) and spread["exceeds"]
    assert spread["spread"] == pytest.approx(0.1)
    # On-policy's seeds 0.1 to 0.4 apart (0.3) span more than the +15 points.
    spread = analysis.seed_spread([0.4, 0.45, 0.5], [0.1, 0.3, 0.4])
    assert spread["spread"] == pytest.approx(0.3) and not spread["exceeds"]
    # One seed a side: a range of 0 is no spread, so no verdict (not "exceeds").
    spread = analysis.seed_spread([0.4], [0.3])
    assert spread["spread"] == 0.0 and spread["exceeds"] is None


def test_a_best_rate_at_the_grids_edge_is_reported_and_extended(tmp_path):
    """On-policy's grid 1e-4, 3e-4 on hand-made finished runs whose accuracy peaks at 3e-5:
    the best, 1e-4, is at the low edge; by default the grid grows by 3e-5 (best, again at the
    low edge), then 1e-5, and stops with 3e-5 inside the grid. --noextend_lr_grid only
    reports the edge, and a one-rate grid (a rate given) is never extended."""
    assert compare.lr_edge([1e-4, 3e-4], 1e-4) == "low"
    assert compare.lr_edge([1e-4, 3e-4], 3e-4) == "high"
    assert compare.lr_edge([1e-4], 1e-4) == "both"
    assert compare.lr_edge([3e-5, 1e-4, 3e-4], 1e-4) is None
    assert compare.beyond_edge([1e-4], "both", 3.0) == [3e-5, 3e-4]
    accuracy = {1e-5: 0.3, 3e-5: 0.5, 1e-4: 0.4, 3e-4: 0.2}

    def plan_of(*flags):
        argv = [f"--workdir={tmp_path}", "--variants=onpolicy", "--lr_grid=onpolicy:1e-4,3e-4"]
        plan = compare.Plan(compare.parse_args([*argv, "--budget_rollouts=128", *flags]))
        plan.validate()  # makes the data directory the specs name
        return plan

    plan = plan_of("--noextend_lr_grid")
    for lr, acc in accuracy.items():
        steps = plan.spec("onpolicy", lr, 0).total_steps
        write_run(plan.run_dir("onpolicy", lr, 0), r=64, b=64, steps=steps, eval_every=steps,
                  accuracies=[acc], tokens_per_step=100, mu=0.5)  # fmt: skip
    lines = []
    chosen = compare.select_lr(plan, "onpolicy", log=lines.append)
    assert (chosen["best"]["lr"], chosen["edge"], chosen["added"]) == (1e-4, "low", [])
    assert "at the grid's low edge" in lines[-1] and "--noextend" in lines[-1]
    # The transfer (checkpoints stay on the machine) measures a run as soon as it finishes
    # if it leads the runs finished so far: 1e-4 (0.4), not 3e-4 (0.2), 3e-5 (0.5), not 1e-5.
    measured = []

    class Recording(compare.Transfer):
        def of_run(self, variant, lr, seed, run_dir):
            measured.append(lr)

    plan = plan_of()  # extended by default
    chosen = compare.select_lr(plan, "onpolicy", log=lines.append, transfer=Recording(plan))
    assert (chosen["best"]["lr"], chosen["edge"], chosen["added"]) == (3e-5, None, [3e-5, 1e-5])
    assert measured == [1e-4, 3e-5]
    assert [g["lr"] for g in chosen["grid"]] == [1e-5, 3e-5, 1e-4, 3e-4]
    # At most --max_lr_extensions rates are added; the edge is then still reported.
    plan = plan_of("--max_lr_extensions=1")
    chosen = compare.select_lr(plan, "onpolicy", log=lines.append)
    assert (chosen["best"]["lr"], chosen["edge"], chosen["added"]) == (3e-5, "low", [3e-5])
    # A one-rate grid, 1e-4, is at both edges but a rate given: kept, not searched around
    # (3e-5 and 3e-4, both finished here, would otherwise be added and 3e-5 chosen).
    plan = plan_of("--lr_grid=onpolicy:1e-4")
    chosen = compare.select_lr(plan, "onpolicy", log=lines.append)
    assert (chosen["best"]["lr"], chosen["edge"], chosen["added"]) == (1e-4, "both", [])
    assert "not extended: one rate" in lines[-1]
    payload_grid = {"onpolicy": chosen["grid"]}
    text = compare.details(payload_grid_args(payload_grid))
    assert "- onpolicy: chose 3e-05, AT THE GRID'S LOW EDGE; extended by 3e-05" in text
    # A one-rate grid (a study at chosen rates) has its rate at both edges: said so.
    assert compare.lr_edge([1e-5], 1e-5) == "both"
    assert compare.edge_words("both") == "the grid's only rate"
    # A kept run without its transfer file is "not measured", not "never" (a cost's word).
    transfer = {"prompts": 64, "data": "test.jsonl", "max_new_tokens": 128, "base": 0.016,
                "variants": {"onpolicy": {"eval_accuracy": 0.008,
                                          "per_seed": [None, 0.0, 0.016]}}}  # fmt: skip
    text = compare.details({**payload_grid_args(payload_grid), "transfer": transfer})
    assert "onpolicy 0.8% (per seed not measured, 0.0%, 1.6%)" in text


def payload_grid_args(grid):
    """A payload for compare.details with on-policy's grid and no runs."""
    return {"select_seed": 0, "select_by": "mean", "lr_grid": grid,
            "lr_chosen": {"onpolicy": 3e-5}, "lr_edge": {"onpolicy": "low"},
            "lr_added": {"onpolicy": [3e-5]}, "variants": {}}  # fmt: skip


def test_statistics_helpers():
    assert analysis.median([1.0, None, 3.0]) == 3.0
    assert analysis.median([1.0, None]) is None  # the median is "never"
    assert analysis.median([1.0, None], none_is_inf=False) == 1.0
    assert analysis.iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == [2.0, 4.0]
    assert analysis.ratio(None, 2.0) is None and analysis.ratio(1.0, 4.0) == 0.25
    records = [{"step": 1, "eval_accuracy": 0.2, "gen_tokens": 5}]
    assert analysis.first_reach(records, 0.3) is None
    assert analysis.first_reach(records, 0.3, base_accuracy=0.4)["gen_tokens"] == 0
    hit = analysis.to_target(records, 0.5, {"cost": 6.0})
    assert hit["cost"] == math.inf and hit["gen_tokens_to_target"] == math.inf


def test_override_parsing_and_bad_flags(tmp_path, capsys):
    config = ex.load_config(os.path.join(ROOT, "configs/arith.py"), "replay")
    ex.set_value(config, "replay.capacity", "128")
    ex.set_value(config, "replay.drop_zero_advantage", "false")
    ex.set_value(config, "optimizer.learning_rate", "1e-4")
    assert config.replay.capacity == 128 and config.replay.drop_zero_advantage is False
    assert config.optimizer.learning_rate == 1e-4
    assert ex.split_override("replay:train.batch_size=32") == ("replay", "train.batch_size", "32")
    assert ex.split_override("eval.every=3") == (None, "eval.every", "3")
    assert compare.main([f"--workdir={tmp_path / 'a'}", "--override=no.such=1"]) == 2
    assert compare.main([f"--workdir={tmp_path / 'b'}", "--variants=onpolicy,nope"]) == 2
    assert compare.main([f"--workdir={tmp_path / 'b'}", f"--reuse={tmp_path / 'none'}"]) == 2
    assert "--reuse=" in capsys.readouterr().err
    # The final re-evaluation's pass@k batch (3 prompts x pass_k 2) does not split over the
    # 8 data shards: refused before any run, with the flag named.
    micro = [f"--override={o}" for o in MICRO]
    workdir = tmp_path / "c"
    assert compare.main([f"--workdir={workdir}", "--final_pass_k_prompts=3", *micro]) == 2
    assert "--final_pass_k_prompts=3" in capsys.readouterr().err
    assert not (workdir / "runs").exists()
    # So do the transfer's 4 prompts, and a transfer file that is not there.
    questions = tmp_path / "gsm8k_test.jsonl"
    write_questions(questions, 12)
    for flags, named in (
        ([f"--transfer_gsm8k={questions}", "--transfer_prompts=4"], "eval.num_prompts=4"),
        ([f"--transfer_gsm8k={tmp_path / 'none.jsonl'}"], "none.jsonl"),
        ([f"--transfer_gsm8k={questions}", "--transfer_prompts=16"], "fewer than 16"),
    ):
        assert compare.main([f"--workdir={workdir}", *flags, *micro]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --transfer_gsm8k, variant onpolicy: ") and named in err, err
        assert not (workdir / "runs").exists()


def test_config_flags_as_train_py_takes_them(tmp_path, capsys):
    """--config=FILE[:ARG] and --config.KEY=VALUE, as scripts/train.py reads them; the
    older --override=[VARIANT:]KEY=VALUE still applies, after them."""
    argv = [
        f"--workdir={tmp_path}",
        f"--config={os.path.join(ROOT, 'configs/arith.py')}",
        "--config.replay.capacity=128",
        "--config.optimizer.learning_rate=3e-4",
        "--override=replay:train.batch_size=32",
    ]
    plan = compare.Plan(compare.parse_args(argv))
    on, rp = (plan.config(v, 1e-4, 0) for v in ("onpolicy", "replay"))
    assert on.replay.capacity == rp.replay.capacity == 128
    assert (on.train.batch_size, rp.train.batch_size) == (64, 32)
    assert plan.lr_grid["replay"] == [1e-4, 3e-4, 9e-4]  # around the overridden rate
    for bad, words in (
        ("--config.no_such_key=1", "no_such_key"),
        ("--config.replay.capacity=abc", "invalid literal"),
        ("--seeds=0", "--seeds"),
        ("--config=configs/missing.py", "no such file"),
    ):
        assert compare.main([f"--workdir={tmp_path / 'x'}", bad]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert words in line, line
    # An ARG of the file goes before each variant's parts: arith.py's variants are whole.
    assert compare.main([f"--workdir={tmp_path / 'x'}", "--config=configs/arith.py:replay"]) == 2
    assert "config variant 'replay,onpolicy'" in capsys.readouterr().err
    assert ex.variant_arg("qwen3-0.6b,pod", "onpolicy") == "qwen3-0.6b,pod,onpolicy"
    assert ex.variant_arg(None, "replay") == "replay"


# A micro run (tests/run/test_trainer.py's MICRO): 8 simulated devices divide every batch.
MICRO = [
    "model.num_layers=1",
    "model.d_model=32",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.head_dim=16",
    "model.mlp_dim=64",
    "warmstart.max_steps=4",
    "warmstart.eval_every=4",
    "task.num_train=64",
    "task.num_test=16",
    "rollout.group_size=4",
    "eval.num_prompts=16",
    "eval.pass_k=2",
    "eval.pass_k_prompts=8",
    "log_every=1",
    # On-policy: R = B = N = 16. Replay: R = 8, B = 16, N = 32.
    "onpolicy:rollout.prompts_per_step=4",
    "onpolicy:train.batch_size=16",
    "onpolicy:replay.capacity=16",
    "replay:rollout.prompts_per_step=2",
    "replay:train.batch_size=16",
    "replay:replay.capacity=32",
]


def write_questions(path, num):
    """A GSM8K-format file of `num` questions, the i-th of length growing with i."""
    with open(path, "w") as f:
        for i in range(num):
            question = f"What is {i} + {i}?" + " Think." * (i % 5)
            f.write(json.dumps({"question": question, "answer": f"{i}+{i}\n#### {2 * i}"}) + "\n")


def test_compare_end_to_end_on_a_micro_config(tmp_path, capsys):
    workdir = tmp_path / "cmp"
    questions = tmp_path / "gsm8k_test.jsonl"
    write_questions(questions, 40)
    study = [
        "--lr_grid=onpolicy:1e-4;replay:3e-5",
        "--budget_rollouts=64",
        "--num_evals=2",
        "--final_pass_k_prompts=12",
        f"--transfer_gsm8k={questions}",
        "--transfer_prompts=16",
        "--transfer_max_new_tokens=8",
        "--transfer_max_prompt_len=64",
        *[f"--override={o}" for o in MICRO],
    ]
    kept = tmp_path / "kept"
    # --reuse names the directory runs are kept in before it exists, as a first study does.
    argv = [f"--workdir={workdir}", "--seeds=2", f"--commit_runs={kept}", f"--reuse={kept}"]
    argv += study
    assert compare.main(argv) == 0
    payload = json.loads((workdir / "compare.json").read_text())
    for key in (
        "variants",
        "mu_measured",
        "mu_model",
        "inference_ratio",
        "compute_ratio",
        "compute_ratio_at_mu_measured",
        "lr_grid",
        "lr_chosen",
        "target_accuracy",
        "command",
        "machine",
    ):
        assert key in payload, key
    assert payload["mu_model"] == 6.0
    assert payload["machine"]["cpu_count"] and payload["machine"]["load_average_end"]
    for name, steps in (("onpolicy", 4), ("replay", 8)):
        v = payload["variants"][name]
        for key in (
            "final_accuracy",
            "pass_at_k",
            "entropy",
            "gen_tokens",
            "wall_s",
            "gen_s",
            "train_s",
            "gen_tokens_to_target",
            "cost_to_target",
            "per_seed",
            "iqr",
        ):
            assert key in v, (name, key)
        assert v["seeds"] == [0, 1] and v["total_steps"] == steps
        assert len(v["per_seed"]["final_accuracy"]) == 2
        # pass@k and entropy come from the re-evaluation of each run's last checkpoint,
        # whose greedy accuracy is the run's own final one.
        for seed, run_dir in zip(v["seeds"], v["run_dirs"]):
            final = json.loads((workdir / run_dir / "final_eval_pass12.json").read_text())
            assert final["step"] == steps
            assert v["per_seed"]["pass_at_k"][seed] == final["eval_pass_at_k"]
            assert v["per_seed"]["entropy"][seed] == final["entropy"]
            assert v["per_seed"]["final_accuracy"][seed] == final["eval_accuracy"]
    assert payload["final_pass_k_prompts"] == 12
    assert payload["variants"]["onpolicy"]["B"] == payload["variants"]["onpolicy"]["R"] == 16
    assert payload["lr_chosen"] == {"onpolicy": 1e-4, "replay": 3e-5}
    assert (workdir / "compare.png").stat().st_size > 10_000
    assert (workdir / "compare_entropy.png").stat().st_size > 10_000
    assert len(payload["paper_table"]["rows"]) == 3 and len(payload["entropy_levels"]) == 5
    for v in payload["variants"].values():
        assert (v["placement"], v["W"], v["T"]) == ("colocated", 0, 8)
        assert v["device_s"] == pytest.approx(8 * v["wall_s"])
        assert set(v["entropy_at_accuracy"]) == {f"{a:.4g}" for a in payload["entropy_levels"]}
        for key in ("entropy_at_target", "device_s_to_target", "wall_s_to_target"):
            assert key in v, key
    assert "| onpolicy |" in (workdir / "compare.md").read_text()
    # One warm start per seed, shared by both variants; one dataset.
    assert len(os.listdir(workdir / "base")) == 2
    # Each run's transfer is measured as soon as it finishes, while its checkpoints are on
    # this machine, and kept at once; the base's at the end.
    said = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith(("running", "transfer:"))
    ]
    runs = [
        f"{v}/lr{lr}/seed{seed}"
        for v, lr in (("onpolicy", "0.0001"), ("replay", "3e-05"))
        for seed in (0, 1)
    ]
    assert len(said) == 9, said
    for i, run in enumerate(runs):
        assert said[2 * i].startswith("running") and f"/runs/{run} (" in said[2 * i], said
        assert said[2 * i + 1].endswith(f"/runs/{run}/transfer_gsm8k16.json"), said
    assert said[-1].endswith("/transfer_base_gsm8k16.json"), said
    # A rerun skips the finished runs.
    assert compare.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("done already") == 6  # the selection seed is asked twice
    assert "final evaluation" not in out and "transfer:" not in out  # cached

    # THE TRANSFER: the 16 shortest questions, greedy, of the base and of each chosen run.
    transfer = payload["transfer"]
    assert (transfer["prompts"], transfer["data"]) == (16, "gsm8k_test.jsonl")
    assert 0 <= transfer["base"] <= 1
    for name in payload["variants"]:
        accs = transfer["variants"][name]["per_seed"]
        assert len(accs) == 2 and all(0 <= a <= 1 for a in accs)
    shortest = (workdir / "transfer" / "gsm8k_shortest16.jsonl").read_text().splitlines()
    assert [len(json.loads(line)["question"]) for line in shortest] == sorted(
        len(f"What is {i} + {i}?" + " Think." * (i % 5)) for i in range(40)
    )[:16]
    assert (
        "Transfer (not a target): greedy accuracy on the 16 shortest"
        in (workdir / "compare.md").read_text()
    )

    # KEPT RUNS: each run's small files under kept/RUN_NAME, and a study assembled from
    # them alone, elsewhere, runs nothing and has the same figures.
    names = sorted(os.listdir(kept))
    assert "transfer_base_gsm8k16.json" in names
    runs = [n for n in names if not n.endswith(".json")]
    assert [n.rsplit("_", 1)[0] for n in runs] == [
        "onpolicy_lr0.0001_seed0",
        "onpolicy_lr0.0001_seed1",
        "replay_lr3e-05_seed0",
        "replay_lr3e-05_seed1",
    ]
    for name in runs:
        assert "checkpoints" not in os.listdir(kept / name)
        assert {"metrics.jsonl", "config.json", "summary.json", "final_eval_pass12.json",
                "transfer_gsm8k16.json"} <= set(os.listdir(kept / name))  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    report = tmp_path / "docs" / "study_compare"
    again = [f"--workdir={elsewhere}", "--seeds=2", f"--reuse={kept}", "--assemble_only"]
    capsys.readouterr()
    assert compare.main([*again, f"--report={report}", *study]) == 0
    out = capsys.readouterr().out
    assert out.count("reused:") == 6 and "running" not in out
    assembled = json.loads((tmp_path / "docs" / "study_compare.json").read_text())
    assert (tmp_path / "docs" / "study_compare.md").read_text() == (
        elsewhere / "compare.md"
    ).read_text()

    def figures(p):
        p = {k: v for k, v in p.items() if k not in ("command", "machine", "wall_s")}
        p["variants"] = {
            name: {k: x for k, x in v.items() if k != "run_dirs"}
            for name, v in p["variants"].items()
        }
        return p

    assert figures(assembled) == figures(payload)
    # A third seed is not kept: --assemble_only names it and runs nothing.
    assert compare.main([*again[:-1], "--seeds=3", "--assemble_only", *study]) == 2
    err = capsys.readouterr().err
    assert "--assemble_only: no finished run onpolicy_lr0.0001_seed2_" in err
    assert not (elsewhere / "runs").exists()
