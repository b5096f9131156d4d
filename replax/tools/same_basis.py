"""Replay against on-policy on the same basis: each side at its own first reach of the target.

compare.json's first ratios (`inference_ratio`, `compute_ratio`) divide replay's generated
tokens (modelled cost) at its first reach of the target by on-policy's for its whole run.
When on-policy reaches the target before its run ends, that flatters replay: the two sides
are measured at different points. The ratios here divide by on-policy's own first reach.

The paper's cost to a point is linear in mu on each side, C(mu) = T + mu G, T the training's
cost (`train_cost_to_target`) and G the rollouts generated up to the first reach. Two such
lines cross at most once, so one `break_even_mu` and a `break_even_mu_direction` (on which
side of it the candidate costs less) describe every mu.

A run that never reaches the target costs +inf at every mu (FIRST_REACH_RULE says how that
enters medians, ratios and the break-even). Studies whose runs were not kept get these
figures from the per-seed costs their compare.json already holds
(`replax.tools.backfill`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replax.tools import analysis
from replax.tools import report as report_lib

FIRST_REACH_RULE = (
    "Each side's generated tokens (modelled cost) at its own first reach of the target. A "
    "seed that never reaches costs +inf: medians over seeds sort it last (null when the "
    "median lands on it), the median ratio is the candidate's median over the reference's "
    "(null when either median is), and a seed's ratio is null when either side never "
    "reaches (first_reach_never names which). break_even_mu: the mu >= 0 where the "
    "candidate's cost T + mu G to its first reach crosses the reference's, from the medians "
    "of T and G over seeds, and per seed; a side that never reaches costs +inf at every mu."
)

# break_even_mu_direction: where the candidate's cost to the target is below the reference's.
ALWAYS = "always"  # at every mu > 0 (break_even_mu 0)
ABOVE = "above"  # for mu above break_even_mu
BELOW = "below"  # only for mu below break_even_mu
NEVER = "never"  # at no mu >= 0 (break_even_mu null)
NEITHER = "neither_reaches"  # neither side reaches the target (break_even_mu null)

# The keys this module adds beside compare.json's existing ratios, in this order.
RATIO_KEYS = (
    "inference_ratio_first_reach",
    "compute_ratio_first_reach",
    "compute_ratio_first_reach_at_mu_measured",
    "break_even_mu",
    "break_even_mu_direction",
)


def break_even_mu(
    candidate_train: float | None,
    candidate_gen: float | None,
    reference_train: float | None,
    reference_gen: float | None,
) -> tuple[float | None, str]:
    """(break_even_mu, direction) of the candidate's cost T_c + mu G_c against the
    reference's T_r + mu G_r over mu >= 0; None for a side's T and G: it never reaches.

    The candidate is cheaper when T_c - T_r < mu (G_r - G_c): with the generation it saves
    positive, above (T_c - T_r) / (G_r - G_c) (at every mu when that is <= 0); with it
    negative (the candidate generates more), only below that mu (at none when it is <= 0);
    with it zero, at every mu or none, by the sign of T_c - T_r."""
    if candidate_train is None or candidate_gen is None:
        reference_reaches = reference_train is not None and reference_gen is not None
        return None, NEVER if reference_reaches else NEITHER
    if reference_train is None or reference_gen is None:
        return 0.0, ALWAYS
    extra_train = float(candidate_train) - float(reference_train)
    saved_gen = float(reference_gen) - float(candidate_gen)
    if saved_gen == 0:
        return (0.0, ALWAYS) if extra_train < 0 else (None, NEVER)
    crossing = extra_train / saved_gen
    if saved_gen > 0:
        return (0.0, ALWAYS) if crossing <= 0 else (crossing, ABOVE)
    return (None, NEVER) if crossing <= 0 else (crossing, BELOW)


def break_even_words(mu: float | None, direction: str | None, short: bool = False) -> str:
    """Where the candidate is the cheaper one, as a phrase (short: for a table cell)."""
    at = report_lib.fmt(mu)
    if short:
        return {
            ALWAYS: "every mu",
            ABOVE: f"mu above {at}",
            BELOW: f"mu below {at}",
            NEVER: "no mu",
            NEITHER: "neither reaches",
        }.get(direction, "unknown")
    return {
        ALWAYS: "cheaper at every mu (break-even mu 0)",
        ABOVE: f"cheaper for mu above the break-even mu {at}",
        BELOW: f"cheaper only for mu below {at}",
        NEVER: "cheaper at no mu (no break-even)",
        NEITHER: "neither side reaches the target",
    }.get(direction, "break-even unknown")


def _value(variant: dict[str, Any], key: str, seed: int | None = None):
    if seed is None:
        return variant.get(key)
    return variant["per_seed"][key][variant["seeds"].index(seed)]


def ratios(candidate: dict[str, Any], reference: dict[str, Any], seed: int | None = None):
    """The same-basis figures (RATIO_KEYS) of two compare.json variants: of their medians,
    or of one seed's figures. Medians are None where "never" (+inf) lands, as seeds are."""

    def get(variant, key):
        return _value(variant, key, seed)

    # T: the training's cost; a compare.json from before it was kept has rollouts trained.
    train = next(k for k in ("train_cost_to_target", "train_rollouts_to_target") if k in reference)
    mu, direction = break_even_mu(
        get(candidate, train),
        get(candidate, "gen_rollouts_to_target"),
        get(reference, train),
        get(reference, "gen_rollouts_to_target"),
    )
    return {
        "inference_ratio_first_reach": analysis.ratio(
            get(candidate, "gen_tokens_to_target"), get(reference, "gen_tokens_to_target")
        ),
        "compute_ratio_first_reach": analysis.ratio(
            get(candidate, "cost_to_target"), get(reference, "cost_to_target")
        ),
        "compute_ratio_first_reach_at_mu_measured": analysis.ratio(
            get(candidate, "cost_to_target_at_mu_measured"),
            get(reference, "cost_to_target_at_mu_measured"),
        ),
        "break_even_mu": mu,
        "break_even_mu_direction": direction,
    }


def per_seed(
    candidate: dict[str, Any], reference: dict[str, Any], seeds: Sequence[int], names=("", "")
) -> dict[str, list]:
    """RATIO_KEYS as lists over `seeds` (those both variants have), and `first_reach_never`:
    per seed None, or which side never reaches (names: (candidate, reference)), or "both"."""
    rows = [ratios(candidate, reference, seed) for seed in seeds]
    out = {k: [row[k] for row in rows] for k in RATIO_KEYS}
    never = []
    for seed in seeds:
        missing = [_value(v, "gen_tokens_to_target", seed) is None for v in (candidate, reference)]
        never.append(
            "both" if all(missing) else names[missing.index(True)] if any(missing) else None
        )
    out["first_reach_never"] = never
    return out


HEADLINE_START = "Same basis, each side's own first reach of the target"


def headline(payload: dict[str, Any], candidate: str, reference: str) -> str:
    """compare.md's first line: the candidate's same-basis ratios and break-even."""
    fmt, mu = report_lib.fmt, payload["mu_model"]
    at_measured = ""
    if payload.get("mu_measured") is not None:
        measured = payload.get("compute_ratio_first_reach_at_mu_measured")
        at_measured = f" ({fmt(measured)} at the measured mu={fmt(payload['mu_measured'])})"
    where = break_even_words(payload.get("break_even_mu"), payload.get("break_even_mu_direction"))
    figures = _no_ratio(payload, candidate, reference) or (
        f"tokens {fmt(payload.get('inference_ratio_first_reach'))}, cost "
        f"{fmt(payload.get('compute_ratio_first_reach'))} at mu={mu:g}{at_measured}"
    )
    return (
        f"{HEADLINE_START} ({100 * payload['target_accuracy']:.1f}%): {candidate} over "
        f"{reference}, {figures}; {candidate} {where}.\n"
    )


def _no_ratio(payload: dict[str, Any], name: str, reference: str) -> str | None:
    """Why a median ratio is null, when it is: a side's median seed never reaches the target
    (a null ratio is no figure for either side, unlike a cost's "never"), or a side has no
    runs in this study (a study of some variants, with --target)."""
    variants = payload["variants"]
    absent = [v for v in (name, reference) if v not in variants]
    if absent:
        return f"no ratio (no {absent[0]} runs)"
    never = [v for v in (name, reference) if variants[v].get("gen_tokens_to_target") is None]
    if not never:
        return None
    if len(never) == 2:
        return "no ratio (neither median seed reaches it)"
    return f"no ratio ({never[0]}'s median seed never reaches it)"


def _cheaper(figures: dict[str, Any]) -> str:
    return break_even_words(
        figures.get("break_even_mu"), figures.get("break_even_mu_direction"), short=True
    )


def notes(payload: dict[str, Any], candidate: str, reference: str) -> str:
    """compare.md's lines below the table: the target, the other variants on the same
    basis, the earlier ratios named for what they are, and how "never" counts."""
    mu = payload["mu_model"]
    lines = [
        f"Target {100 * payload['target_accuracy']:.1f}% ({payload['target_source']}); "
        f"medians over seeds {payload['seeds']}."
    ]
    others = {v: r for v, r in (payload.get("ratios") or {}).items() if v != candidate}
    if others:
        lines.append(
            f"Same basis against {reference} (tokens / cost at mu={mu:g} / where cheaper): "
            + "; ".join(
                f"{v} "
                + (
                    _no_ratio(payload, v, reference)
                    or f"{report_lib.fmt(r.get('inference_ratio_first_reach'))} / "
                    f"{report_lib.fmt(r.get('compute_ratio_first_reach'))}"
                )
                + f" / {_cheaper(r)}"
                for v, r in others.items()
            )
            + "."
        )
    lines.append(
        f"{candidate.capitalize()}'s first reach over {reference}'s whole run (the earlier "
        f"basis, which flatters {candidate} when {reference} reaches the target before its "
        f"run ends): inference ratio {report_lib.fmt(payload['inference_ratio'])}, compute "
        f"ratio {report_lib.fmt(payload['compute_ratio'])} at mu={mu:g}, "
        f"{report_lib.fmt(payload['compute_ratio_at_mu_measured'])} at the measured "
        f"mu={report_lib.fmt(payload['mu_measured'])}."
    )
    lines.append(f"First reach: {payload.get('first_reach_rule', FIRST_REACH_RULE)}")
    return "\n" + "\n".join(lines) + "\n"


def _seed_cell(versus: dict[str, Any], i: int) -> str:
    never = versus["first_reach_never"][i]
    if never is not None:
        return "both never reach" if never == "both" else f"{never} never reaches"
    seed = {k: versus[k][i] for k in RATIO_KEYS}
    return (
        f"{report_lib.fmt(seed['inference_ratio_first_reach'])} / "
        f"{report_lib.fmt(seed['compute_ratio_first_reach'])} / {_cheaper(seed)}"
    )


def versus_lines(name: str, reference: str, versus: dict[str, Any], mu: float) -> list[str]:
    """compare.md's per-seed ratios of a variant: the same basis first, then (when the
    payload has them) its first reach over the reference's whole run."""
    same = ", ".join(
        f"seed {seed}: {_seed_cell(versus, i)}" for i, seed in enumerate(versus["seeds"])
    )
    lines = [
        f"{name} against {reference}, same basis per seed (tokens / cost at mu={mu:g} / "
        f"where {name} is cheaper): {same}."
    ]
    if "inference_ratio" in versus:
        earlier = ", ".join(
            f"seed {seed}: {report_lib.fmt(a)} / {report_lib.fmt(b)}"
            for seed, a, b in zip(
                versus["seeds"], versus["inference_ratio"], versus["compute_ratio"]
            )
        )
        lines.append(
            f"{name}'s first reach over {reference}'s whole run, per seed (inference / compute "
            f"ratio): {earlier}."
        )
    return lines
