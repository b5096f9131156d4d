"""The same-basis figures of a committed study whose runs were not kept: recovered from the
per-seed costs its compare.json already holds, at mu_model and at mu_measured (two points
of each seed's cost line T + mu G give its T and G exactly).

    python -m replax.tools.backfill docs/results/compare.json [...]

rewrites each FILE.json with `replax.tools.same_basis`'s keys (and `same_basis_backfilled`)
and its FILE.md beside it with the same-basis lines.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from replax.tools import analysis
from replax.tools import report as report_lib
from replax.tools.same_basis import (
    FIRST_REACH_RULE,
    HEADLINE_START,
    headline,
    notes,
    per_seed,
    ratios,
    versus_lines,
)


def rollouts_from_costs(
    cost_a: float | None, mu_a: float, cost_b: float | None, mu_b: float
) -> tuple[int, int] | None:
    """(T, G), the rollouts trained and generated at a point, from its modelled costs at two
    mus: T + mu_a G = cost_a and T + mu_b G = cost_b. None when the point is never reached
    (a cost None or inf); ValueError when the two mus are equal (one equation, two counts)."""
    if mu_a == mu_b:
        raise ValueError(f"one mu ({mu_a:g}) cannot separate rollouts trained from generated")
    if cost_a is None or cost_b is None or math.isinf(cost_a) or math.isinf(cost_b):
        return None
    gen = (cost_a - cost_b) / (mu_a - mu_b)
    train = cost_a - mu_a * gen
    # Counts of rollouts: whole numbers, up to the rounding of the costs they came from.
    return round(train), round(gen)


def _with_keys_before(payload: dict, anchor: str, new: dict) -> dict:
    """payload with `new`'s keys placed just before `anchor` (at the end without it)."""
    if anchor not in payload:
        return {**{k: v for k, v in payload.items() if k not in new}, **new}
    out = {}
    for k, v in payload.items():
        if k == anchor:
            out.update(new)
        if k not in new:
            out[k] = v
    return out


def backfill(payload: dict[str, Any], reference: str = "onpolicy", candidate: str = "replay"):
    """A compare.json of runs not kept, given the same-basis figures compare.py now writes,
    from the per-seed data it holds: each seed's rollouts trained and generated to the
    target solved from its cost_to_target at mu_model and cost_to_target_at_mu_measured at
    mu_measured (`rollouts_from_costs`), then RATIO_KEYS at the top level, under `ratios`
    and per seed under `versus`, and `first_reach_rule`. Marks the payload with
    `same_basis_backfilled`. Returns a new payload."""
    mu_model = payload["mu_model"]
    mu_measured = payload["mu_measured"] if payload.get("mu_measured") is not None else mu_model
    variants = {}
    for v, s in payload["variants"].items():
        s = {**s, "per_seed": dict(s["per_seed"])}
        ps = s["per_seed"]
        counts = [
            rollouts_from_costs(a, mu_model, b, mu_measured)
            for a, b in zip(ps["cost_to_target"], ps["cost_to_target_at_mu_measured"])
        ]
        for i, key in enumerate(("train_rollouts_to_target", "gen_rollouts_to_target")):
            ps[key] = [None if c is None else c[i] for c in counts]
            s[key] = analysis.median(ps[key])
        variants[v] = s
    out = {**payload, "variants": variants}
    ref = variants[reference]
    by_variant = {}
    versus = dict(payload.get("versus") or {})
    for v, s in variants.items():
        if v == reference:
            continue
        by_variant[v] = ratios(s, ref)
        seeds = [seed for seed in s["seeds"] if seed in ref["seeds"]]
        old = versus.get(v) or {"seeds": seeds}
        versus[v] = _with_keys_before(
            old, "inference_ratio", per_seed(s, ref, seeds, names=(v, reference))
        )
    out["ratios"] = {
        v: _with_keys_before(dict(r), "inference_ratio", by_variant[v])
        for v, r in (payload.get("ratios") or {}).items()
        if v in by_variant
    } or by_variant
    top = {"first_reach_rule": FIRST_REACH_RULE, **by_variant.get(candidate, {})}
    out = _with_keys_before(out, "inference_ratio", top)
    out["versus"] = versus
    out["same_basis_backfilled"] = (
        "runs not kept: each seed's rollouts trained and generated to the target solved from "
        f"its cost_to_target at mu_model ({mu_model:g}) and cost_to_target_at_mu_measured at "
        f"mu_measured ({mu_measured:.4g}) by replax.tools.backfill.backfill"
    )
    return out


def _old_versus(name: str, reference: str) -> str:
    """How compare.md's per-seed ratio line began before the same basis."""
    return f"{name} against {reference}: inference / compute ratio per seed"


def backfill_markdown(text: str, payload: dict[str, Any], reference="onpolicy", candidate="replay"):
    """compare.md of a backfilled payload: the same-basis headline first, the target
    paragraph replaced by `notes`, and each variant's per-seed ratio line by `versus_lines`
    (added after the notes where the file has none). Lines it does not know are kept, and a
    file backfilled before is made again, not doubled."""
    versus, mu = payload.get("versus") or {}, payload["mu_model"]

    def per_seed_variant(line: str) -> str | None:
        starts = {
            v: (_old_versus(v, reference), f"{v} against {reference}, same basis") for v in versus
        }
        return next((v for v, s in starts.items() if line.startswith(s)), None)

    lines = text.split("\n")
    if lines[0].startswith(HEADLINE_START):
        lines = lines[2:]
    in_file = {per_seed_variant(line) for line in lines} - {None}
    made_before = ("Same basis against ", f"{candidate.capitalize()}'s first reach over ",
                   "First reach: ")  # fmt: skip
    out = [headline(payload, candidate, reference).rstrip("\n"), ""]
    for line in lines:
        name = per_seed_variant(line)
        if line.startswith("Target "):
            out.extend(notes(payload, candidate, reference).strip("\n").split("\n"))
            for v in versus:
                if v not in in_file:
                    out.extend(versus_lines(v, reference, versus[v], mu))
        elif name is not None:
            out.extend(versus_lines(name, reference, versus[name], mu))
        elif line.startswith(made_before) or (
            "'s first reach over " in line and "whole run, per seed" in line
        ):
            continue
        else:
            out.append(line)
    return "\n".join(out)


def main(argv: Sequence[str]) -> int:
    """Backfills each FILE.json given (a compare.json) and its FILE.md in place."""
    for path in argv:
        with open(path) as f:
            payload = backfill(json.load(f))
        report_lib.write_json(path, payload)
        md = path[: -len(".json")] + ".md"
        with open(md) as f:
            text = f.read()
        with open(md, "w") as f:
            f.write(backfill_markdown(text, payload))
        print(f"{path}: same basis {payload['inference_ratio_first_reach']} tokens, "
              f"{payload['compute_ratio_first_reach']} cost, break-even mu "
              f"{payload['break_even_mu']} ({payload['break_even_mu_direction']})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
