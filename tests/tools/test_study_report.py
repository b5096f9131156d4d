"""Tests for replax/tools/study_report.py: the ratio arithmetic, entropy at the target and
measured costs on hand-made metrics, and the statistics they rest on (analysis)."""

import math

import pytest
from study_runs import write_run

from replax.tools import analysis, study_plan, study_render, study_report


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
    plan = study_plan.Plan(study_plan.parse_args([f"--workdir={tmp_path}"]))
    payload, curves = study_report.report(plan, results, mu_model=6.0, target=None)

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
    study_render.plot(payload, curves, str(tmp_path / "compare.png"))
    text = study_render.table(payload)
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
    plan = study_plan.Plan(study_plan.parse_args([f"--workdir={tmp_path}"]))
    payload, curves = study_report.report(plan, results, mu_model=6.0, target=None, device_count=8)
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
    study_render.plot_entropy(payload, curves, str(tmp_path / "compare_entropy.png"))
    assert (tmp_path / "compare_entropy.png").stat().st_size > 10_000
    assert "| replay | 0.0001 |" in study_render.table(payload)

    # A target that one run of three reaches: no entropy there, nor tokens to it.
    payload, _ = study_report.report(plan, results, mu_model=6.0, target=0.58, device_count=8)
    for v in ("onpolicy", "replay"):
        s = payload["variants"][v]
        assert s["entropy_at_target"] is None and s["gen_tokens_to_target"] is None, v
        assert s["iqr"]["entropy_at_target"] is None
        assert s["per_seed"]["entropy_at_target"][1] is not None  # seed 1 reaches 0.6


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
