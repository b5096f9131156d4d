"""Tests for replax/tools/same_basis.py: the break-even mu against a numpy sweep of the two
cost lines and the ratios of each side's own first reach (the backfill of a study whose
runs were not kept: tests/tools/test_backfill.py)."""

import glob
import json
import os

import numpy as np
import pytest

from replax.tools import same_basis as sb

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_break_even_mu_by_hand():
    # Replay trains 17,792 more rollouts and generates 13,408 fewer (the embedded default's
    # medians at 5 seeds): cheaper above 17,792 / 13,408 = 1.327.
    mu, direction = sb.break_even_mu(41600, 10400, 23808, 23808)
    assert direction == sb.ABOVE and mu == pytest.approx(17792 / 13408)
    # Trains no more and generates less: cheaper at every mu.
    assert sb.break_even_mu(256, 128, 256, 256) == (0.0, sb.ALWAYS)
    # Trains more, generates as much: at no mu. Trains less, generates as much: at every mu.
    assert sb.break_even_mu(384, 192, 192, 192) == (None, sb.NEVER)
    assert sb.break_even_mu(100, 192, 192, 192) == (0.0, sb.ALWAYS)
    # Trains 100 fewer and generates 50 more: cheaper only below mu = 2.
    assert sb.break_even_mu(100, 150, 200, 100) == (2.0, sb.BELOW)
    # Trains more and generates more: never.
    assert sb.break_even_mu(300, 150, 200, 100) == (None, sb.NEVER)
    # A side that never reaches costs +inf at every mu.
    assert sb.break_even_mu(None, None, 10, 10) == (None, sb.NEVER)
    assert sb.break_even_mu(10, 10, None, None) == (0.0, sb.ALWAYS)
    assert sb.break_even_mu(None, None, None, None) == (None, sb.NEITHER)


def test_break_even_mu_against_a_numpy_sweep_of_the_cost_lines():
    rng = np.random.default_rng(0)
    mus = np.linspace(0, 40, 40001)[1:]  # mu > 0
    cases = rng.integers(1, 400, size=(300, 4)).tolist()
    cases += [[50, 20, 50, 30], [50, 30, 50, 20], [60, 20, 50, 20], [40, 20, 50, 20]]
    seen = set()
    for tc, gc, tr, gr in cases:
        cheaper = tc + mus * gc < tr + mus * gr
        mu, direction = sb.break_even_mu(tc, gc, tr, gr)
        seen.add(direction)
        # Grid points within one step of the crossing may fall on either side of it.
        away = np.ones_like(mus, bool) if mu is None else np.abs(mus - mu) > 1e-3
        expected = {
            sb.ALWAYS: np.ones_like(mus, bool),
            sb.NEVER: np.zeros_like(mus, bool),
            sb.ABOVE: mus > (mu or 0),
            sb.BELOW: mus < (mu or 0),
        }[direction]
        np.testing.assert_array_equal(cheaper[away], expected[away], err_msg=str((tc, gc, tr, gr)))
    assert seen == {sb.ALWAYS, sb.ABOVE, sb.BELOW, sb.NEVER}


def variant(seeds, tokens, train, gen, mu=6.0, mu_measured=0.5):
    """A compare.json variant from its seeds' first reaches (None: never), with the medians
    compare.py takes (never as +inf, null when the median lands on it)."""

    def cost(m):
        return [None if t is None else t + m * g for t, g in zip(train, gen)]

    per_seed = {
        "gen_tokens_to_target": tokens,
        "train_rollouts_to_target": train,
        "gen_rollouts_to_target": gen,
        "cost_to_target": cost(mu),
        "cost_to_target_at_mu_measured": cost(mu_measured),
    }

    def median(values):
        got = np.median([np.inf if v is None else v for v in values])
        return None if np.isinf(got) else float(got)

    return {"seeds": seeds, "per_seed": per_seed, **{k: median(v) for k, v in per_seed.items()}}


def test_ratios_of_each_sides_own_first_reach():
    # The runs of tests/scripts/test_compare.py: on-policy reaches at 400 tokens (256
    # trained and generated) and 300 (192), never at seed 2; replay at 200 (256 trained,
    # 128 generated) and 300 (384, 192), never at seed 2.
    ref = variant([0, 1, 2], [400, 300, None], [256, 192, None], [256, 192, None])
    cand = variant([0, 1, 2], [200, 300, None], [256, 384, None], [128, 192, None])
    got = sb.ratios(cand, ref)
    # Medians with never last: on-policy 400 tokens, cost 256 + 6 x 256; replay 300,
    # 384 + 6 x 192; break-even (384 - 256) / (256 - 192) = 2.
    assert got["inference_ratio_first_reach"] == pytest.approx(300 / 400)
    assert got["compute_ratio_first_reach"] == pytest.approx(1536 / 1792)
    assert got["compute_ratio_first_reach_at_mu_measured"] == pytest.approx(480 / 384)
    assert (got["break_even_mu"], got["break_even_mu_direction"]) == (2.0, sb.ABOVE)
    seeds = sb.per_seed(cand, ref, [0, 1, 2], names=("replay", "onpolicy"))
    assert seeds["inference_ratio_first_reach"] == pytest.approx([0.5, 1.0, None])
    assert seeds["compute_ratio_first_reach"] == pytest.approx([1024 / 1792, 1536 / 1344, None])
    assert seeds["break_even_mu"] == [0.0, None, None]
    assert seeds["break_even_mu_direction"] == [sb.ALWAYS, sb.NEVER, sb.NEITHER]
    assert seeds["first_reach_never"] == [None, None, "both"]
    # One side alone never reaching is named; its ratio is null either way.
    ref1 = variant([0], [None], [None], [None])
    cand1 = variant([0], [100], [64], [16])
    one = sb.per_seed(cand1, ref1, [0], names=("replay", "onpolicy"))
    assert one["first_reach_never"] == ["onpolicy"]
    assert one["inference_ratio_first_reach"] == [None]
    assert one["break_even_mu_direction"] == [sb.ALWAYS]
    assert sb.per_seed(ref1, cand1, [0], names=("replay", "onpolicy"))["first_reach_never"] == [
        "replay"
    ]


def test_the_break_even_takes_the_trainings_cost_when_kept():
    """Replay's steps ran a forward more (4/3 a plain step's FLOPs): its 384 rollouts
    trained cost 512, and the break-even with on-policy's 256 + mu 256 moves from
    (384 - 256) / (256 - 192) = 2 to (512 - 256) / 64 = 4."""
    ref = variant([0], [400], [256], [256])
    cand = variant([0], [300], [384], [192])
    assert sb.ratios(cand, ref)["break_even_mu"] == 2.0
    for v, cost in ((ref, 256.0), (cand, 512.0)):
        v["train_cost_to_target"], v["per_seed"]["train_cost_to_target"] = cost, [cost]
    assert sb.ratios(cand, ref)["break_even_mu"] == 4.0
    assert sb.per_seed(cand, ref, [0])["break_even_mu"] == [4.0]


def old_payload():
    """A compare.json as compare.py wrote it before the same basis (per-seed costs at mu 6
    and at the measured mu, no rollout counts), from the runs of the test above."""
    ref = variant([0, 1, 2], [400, 300, None], [256, 192, None], [256, 192, None], 6.0, 0.45)
    cand = variant([0, 1, 2], [200, 300, None], [256, 384, None], [128, 192, None], 6.0, 0.45)
    for v in (ref, cand):
        for key in ("train_rollouts_to_target", "gen_rollouts_to_target"):
            del v[key], v["per_seed"][key]
    return {
        "variants": {"onpolicy": ref, "replay": cand},
        "target_accuracy": 0.5,
        "target_source": "onpolicy median final accuracy",
        "mu_model": 6.0,
        "mu_measured": 0.45,
        "inference_ratio": 0.75,
        "compute_ratio": 1536 / 1792,
        "compute_ratio_at_mu_measured": 0.9,
        "ratios": {"replay": {"inference_ratio": 0.75, "compute_ratio": 1536 / 1792}},
        "seeds": [0, 1, 2],
    }


def test_a_median_that_never_reaches_gives_no_ratio_not_never():
    # Two on-policy seeds, one reaching: its median lands on "never"; replay's both reach.
    ref = variant([0, 1], [None, 300], [None, 192], [None, 192])
    cand = variant([0, 1], [200, 100], [256, 128], [128, 64])
    payload = {
        "variants": {"onpolicy": ref, "replay": cand},
        "target_accuracy": 0.5,
        "mu_model": 6.0,
        "mu_measured": None,
        **sb.ratios(cand, ref),
    }
    assert payload["inference_ratio_first_reach"] is None
    assert (payload["break_even_mu"], payload["break_even_mu_direction"]) == (0.0, sb.ALWAYS)
    assert sb.headline(payload, "replay", "onpolicy") == (
        "Same basis, each side's own first reach of the target (50.0%): replay over onpolicy, "
        "no ratio (onpolicy's median seed never reaches it); replay cheaper at every mu "
        "(break-even mu 0).\n"
    )


# Every compare.py report committed: the *compare*.json files and the entropy study's.
STUDIES = sorted(glob.glob(os.path.join(ROOT, "docs", "results", "*compare*.json")))
STUDIES.append(os.path.join(ROOT, "docs", "results", "entropy_study.json"))


@pytest.mark.parametrize("path", STUDIES)
def test_every_committed_study_has_the_same_basis(path):
    """Each committed compare.json holds the same-basis keys, and its median ratios are
    replay's median first reach over on-policy's (never as +inf) recomputed here; a study
    without a `replay` variant has none at the top and each candidate's under `ratios`."""
    with open(path) as f:
        payload = json.load(f)
    for key in ("inference_ratio_first_reach", "compute_ratio_first_reach", "break_even_mu"):
        assert key in payload, key
    on = payload["variants"]["onpolicy"]
    checks = [(payload, payload["variants"].get("replay"))]
    if "replay" not in payload["variants"]:
        assert payload["inference_ratio_first_reach"] is None
        checks = [
            (payload["ratios"][name], payload["variants"][name]) for name in payload["ratios"]
        ]
        assert checks

    def median(values):
        return np.median([np.inf if v is None else v for v in values])

    for ratios, candidate in checks:
        for ratio, key in (
            ("inference_ratio_first_reach", "gen_tokens_to_target"),
            ("compute_ratio_first_reach", "cost_to_target"),
        ):
            expected = median(candidate["per_seed"][key]) / median(on["per_seed"][key])
            if np.isfinite(expected) and expected > 0:
                assert ratios[ratio] == pytest.approx(expected), ratio
            else:
                assert ratios[ratio] is None, ratio


def test_notes_of_a_study_without_the_reference():
    """A study of replay variants alone (compare.py --variants=replay,replay_cov --target=T):
    no ratio to name, and the notes still read."""
    cand = variant([0], [100], [64], [16])
    payload = {
        "variants": {"replay": cand, "replay_cov": cand},
        "target_accuracy": 0.5,
        "target_source": "--target",
        "seeds": [0],
        "mu_model": 6.0,
        "mu_measured": None,
        "inference_ratio": None,
        "compute_ratio": None,
        "compute_ratio_at_mu_measured": None,
        "ratios": {v: dict.fromkeys(sb.RATIO_KEYS) for v in ("replay", "replay_cov")},
    }
    text = sb.notes(payload, "replay", "onpolicy")
    assert "replay_cov no ratio (no onpolicy runs) / unknown." in text


def test_auto_mu_table_by_hand():
    def variant(train, gen):
        return {"per_seed": {"train_rollouts_to_target": train, "gen_rollouts_to_target": gen}}

    payload = {
        "variants": {
            # On-policy trains each rollout once: T = G.
            "onpolicy": variant([100, 200, 300], [100, 200, 300]),
            # The fixed design trains four per generated: cheaper only at large mu.
            "replay": variant([400, 400, None], [100, 100, None]),
            "auto_lo": variant([200, 210, 220], [200, 210, 220]),
            "auto_hi": variant([300, None, 280], [150, None, 140]),
        }
    }
    table = sb.auto_mu_table(payload, {0.5: "auto_lo", 6.0: "auto_hi"})
    assert list(table) == ["0.5", "6"]
    low = table["0.5"]
    # Medians of T + 0.5 G: on-policy 1.5 x 200, fixed 450 (the third seed never: +inf).
    assert (low["onpolicy"], low["fixed"], low["auto"]) == (300.0, 450.0, 315.0)
    assert low["cheaper"] == "onpolicy" and low["auto_over_cheaper"] == pytest.approx(1.05)
    assert low["within_tolerance"] is True
    assert low["per_seed"]["fixed"] == [450.0, 450.0, None]
    high = table["6"]
    # At mu = 6: on-policy 7 x 200 = 1400, fixed 1000, auto median of (1200, inf, 1120).
    assert (high["onpolicy"], high["fixed"], high["auto"]) == (1400.0, 1000.0, 1200.0)
    assert high["cheaper"] == "fixed" and high["auto_over_cheaper"] == pytest.approx(1.2)
    assert high["within_tolerance"] is False
