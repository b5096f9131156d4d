"""Tests for replax/tools/backfill.py: the rollouts recovered from two costs, and the
same-basis figures of a compare.json whose runs were not kept."""

import pytest
from test_same_basis import old_payload

from replax.tools import backfill as bf
from replax.tools import same_basis as sb


def test_rollouts_from_two_costs():
    # A seed of the embedded default: 300 steps of B = 64 trained and R = 16 generated cost
    # 19,200 + 6 x 4,800 = 48,000 at mu 6, and this at the study's measured mu.
    mu_measured = 0.25286505701910644
    assert bf.rollouts_from_costs(48000.0, 6.0, 20413.752273691713, mu_measured) == (19200, 4800)
    assert bf.rollouts_from_costs(None, 6.0, 1.0, 0.5) is None
    assert bf.rollouts_from_costs(float("inf"), 6.0, 1.0, 0.5) is None
    with pytest.raises(ValueError, match="one mu"):
        bf.rollouts_from_costs(1.0, 6.0, 1.0, 6.0)


def test_backfill_of_a_compare_json_whose_runs_were_not_kept():
    payload = bf.backfill(old_payload())
    rp = payload["variants"]["replay"]
    # Solved from the two costs: the counts the runs had.
    assert rp["per_seed"]["train_rollouts_to_target"] == [256, 384, None]
    assert rp["per_seed"]["gen_rollouts_to_target"] == [128, 192, None]
    assert (rp["train_rollouts_to_target"], rp["gen_rollouts_to_target"]) == (384, 192)
    assert payload["inference_ratio_first_reach"] == pytest.approx(0.75)
    assert payload["compute_ratio_first_reach"] == pytest.approx(1536 / 1792)
    assert (payload["break_even_mu"], payload["break_even_mu_direction"]) == (2.0, sb.ABOVE)
    assert payload["first_reach_rule"] == sb.FIRST_REACH_RULE
    assert payload["same_basis_backfilled"]
    # Beside (ahead of) the earlier ratios, at the top level and under `ratios`.
    keys = list(payload)
    assert keys.index("inference_ratio_first_reach") < keys.index("inference_ratio")
    assert list(payload["ratios"]["replay"])[:2] == [
        "inference_ratio_first_reach",
        "compute_ratio_first_reach",
    ]
    versus = payload["versus"]["replay"]
    assert versus["seeds"] == [0, 1, 2]
    assert versus["break_even_mu_direction"] == [sb.ALWAYS, sb.NEVER, sb.NEITHER]
    # compare.md: the same basis first; the target line becomes the notes; a file made
    # again is not doubled.
    old = "| variant |\n|---|\n\nTarget 50.0% (x); medians. inference ratio 0.75.\n\nProvenance."
    text = bf.backfill_markdown(old, payload)
    assert text.startswith(
        "Same basis, each side's own first reach of the target (50.0%): replay over onpolicy, "
        "tokens 0.75, cost 0.857 at mu=6 (1.27 at the measured mu=0.45); replay cheaper for "
        "mu above the break-even mu 2.\n\n| variant |"
    )
    assert "Replay's first reach over onpolicy's whole run" in text and "Provenance." in text
    assert (
        "replay against onpolicy, same basis per seed (tokens / cost at mu=6 / where replay is "
        "cheaper): seed 0: 0.5 / 0.571 / every mu, seed 1: 1 / 1.14 / no mu, seed 2: both "
        "never reach."
    ) in text
    assert bf.backfill_markdown(text, payload) == text
