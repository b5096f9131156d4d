"""Analysis of finished runs, from their metrics.jsonl and config.json (no training).

Reading a run back as a summary (final metrics, when it first reaches a target accuracy,
its cost under the paper's model), medians and interquartile ranges over seeds with
"never" as +inf, accuracy curves on a common grid, machine information and markdown
tables. The paper's cost of a run up to a point is sum over steps of B + mu R, in units of
training on one rollout: train_cost + mu gen_rollouts (cumulative in metrics.jsonl), where
train_cost counts each step's B rollouts at the step's FLOPs over a plain step's (one
forward, one backward), so that every pass a step runs is counted. The measured cost of
a run is device-seconds, from its placement (`device_groups`, `device_seconds`); the
paper's modelled compute ratio of an asynchronous system of W sampler and T trainer
devices is `paper_compute_ratio`.
Held-out entropy where a run first reaches an accuracy is `entropy_at`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from replax.run import metrics as metrics_lib

# What experiments.ensure_run saves of a finished run: the trainer's summary.
SUMMARY_FILE = "summary.json"
# The config a run was started with (replax.run.runtime.RUN_CONFIG_FILE, named here so that
# reading runs back does not import JAX).
RUN_CONFIG_FILE = "config.json"


def last_record(workdir: str) -> dict[str, Any] | None:
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    records = metrics_lib.read_metrics(workdir)
    return records[-1] if records else None


def is_finished(workdir: str, total_steps: int, total_rollouts: int = 0) -> bool:
    """The run's last record is at total_steps, or past its generated-rollout budget."""
    record = last_record(workdir)
    if record is None:
        return False
    spent = bool(total_rollouts) and record.get("gen_rollouts", 0) >= total_rollouts
    return record["step"] == total_steps or spent


def train_cost(record: dict[str, Any]) -> float:
    """The cost of the training up to a record, in rollouts trained in a plain step:
    train_cost, or train_rollouts in a record without it
    (`replax.run.metrics.backfill_train_cost`)."""
    cost = record.get("train_cost")
    return record["train_rollouts"] if cost is None else cost


def modelled_cost(record: dict[str, Any], mu: float) -> float:
    """The paper's cost up to a record: train_cost + mu gen_rollouts."""
    return train_cost(record) + mu * record["gen_rollouts"]


def eval_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("eval_accuracy") is not None]


def first_reach(records, target: float, base_accuracy: float | None = None):
    """The record (or a zero-cost start when the base already reaches the target) at which
    held-out accuracy first reaches target; None if it never does."""
    if base_accuracy is not None and base_accuracy >= target - 1e-9:
        zero = ("gen_tokens", "train_rollouts", "train_cost", "gen_rollouts", "wall_s")
        return {"step": 0, **dict.fromkeys((*zero, "gen_s", "train_s"), 0)}
    for r in eval_records(records):
        if r["eval_accuracy"] >= target - 1e-9:
            return r
    return None


def entropy_at(records, accuracy: float, base_accuracy: float | None = None) -> float | None:
    """The held-out entropy where the run first reaches `accuracy`, interpolated linearly
    in accuracy between the last evaluation below it and the first at or above it (the
    evaluation `first_reach` finds): with (a0, e0) and (a1, e1) those two evaluations,
    e0 + (accuracy - a0) / (a1 - a0) (e1 - e0). When no evaluation below it comes first
    (the first evaluation, or the base, already reaches it) there is no earlier measured
    entropy (the base is evaluated for accuracy only): the first evaluation's entropy.
    None when the run never reaches it, or measured no entropy (eval.pass_k = 0)."""
    points = [
        (r["eval_accuracy"], r["entropy"])
        for r in eval_records(records)
        if r.get("entropy") is not None
    ]
    if not points:
        return None
    if base_accuracy is not None and base_accuracy >= accuracy - 1e-9:
        return float(points[0][1])
    below = None
    for a1, e1 in points:
        if a1 >= accuracy - 1e-9:
            if below is None:
                return float(e1)
            a0, e0 = below
            return float(e0 + (accuracy - a0) / (a1 - a0) * (e1 - e0))
        below = (a1, e1)
    return None


def accuracy_levels(starts: Sequence[float], finals: Sequence[float], num: int = 5):
    """`num` evenly spaced accuracies shared by a study's runs: lo + (hi - lo) k / num for
    k = 1..num, with lo the largest start accuracy (the base, or a run's first evaluation
    when the base is unknown) and hi the smallest final one, so that every run reaches
    every level and none is reached before training; when hi <= lo (a run ends no higher
    than another starts), lo the smallest start and hi the largest final instead, and
    some runs never reach some levels. Rounded to 4 decimals; [] without runs."""
    if not starts or not finals:
        return []
    lo, hi = max(starts), min(finals)
    if hi <= lo:
        lo, hi = min(starts), max(finals)
    return [round(lo + (hi - lo) * k / num, 4) for k in range(1, num + 1)]


def median_of_reached(values: Sequence[float | None]) -> float | None:
    """Median over the runs that got there (None: never), or None when fewer than half of
    the runs did: a quantity measured where a run reaches a point (entropy at the
    target), which a run that never gets there cannot have, unlike a cost (+inf)."""
    got = [float(v) for v in values if v is not None]
    if not got or 2 * len(got) < len(values):
        return None
    return float(np.median(got))


def device_groups(config: dict[str, Any] | None, device_count: int) -> dict[str, Any]:
    """The devices a run held, from its config.json (None: a colocated run): placement,
    W sampler devices and T trainer devices. Disjoint: W = rollout.num_devices, or half of
    device_count when 0 (as replax.rl.placement.sampler_device_count), T = the rest.
    Colocated: W = 0 and T = device_count, one group that generates and trains."""
    rollout = (config or {}).get("rollout", {})
    placement = rollout.get("placement", "colocated")
    if placement != "disjoint":
        return {"placement": placement, "W": 0, "T": device_count}
    w = rollout.get("num_devices") or device_count // 2
    return {"placement": placement, "W": w, "T": device_count - w}


def device_seconds(record: dict[str, Any], groups: dict[str, Any]) -> dict[str, float]:
    """The measured cost of a run up to a record, in device-seconds:
    device_s = (W + T) x wall_s, every device the run holds for its wall-clock time, idle
    or not (an asynchronous run's devices are held while the other group works: the 1 +
    W/T of the paper's ratio); busy_device_s = each group's measured busy seconds times
    its devices: W x gen_s + T x train_s (disjoint: gen_s is the sampler's, train_s the
    trainer's), T x (gen_s + train_s) colocated (one group, one phase after the other)."""
    w, t = groups["W"], groups["T"]
    gen, train = record["gen_s"], record["train_s"]
    busy = w * gen + t * train if w else t * (gen + train)
    return {"device_s": (w + t) * record["wall_s"], "busy_device_s": busy}


def paper_compute_ratio(w_over_t: float, mu: float | None) -> float | None:
    """The paper's modelled compute of an asynchronous run whose trainer never waits, per
    rollout trained on, relative to synchronous on-policy: (1 + W/T) / (1 + mu). With one
    device training a rollout in one unit, T trainer devices train B rollouts in B / T
    while all W + T are held: (W + T) B / T = (1 + W/T) B; on-policy spends (1 + mu) B."""
    return None if mu is None else (1 + w_over_t) / (1 + mu)


def steady_mu(records) -> float | None:
    """Generation / training seconds per rollout after the first logged step, whose
    seconds include compilation (the trainer's mu_measured counts them)."""
    first, last = records[0], records[-1]
    try:
        gen = (last["gen_s"] - first["gen_s"]) / (last["gen_rollouts"] - first["gen_rollouts"])
        train = (last["train_s"] - first["train_s"]) / (
            last["train_rollouts"] - first["train_rollouts"]
        )
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    return gen / train if train > 0 else None


def summarize_run(records, *, base_accuracy: float | None = None) -> dict[str, Any]:
    """Final metrics of one run (target-independent)."""
    evals = eval_records(records)
    if not evals:
        raise ValueError("the run has no evaluation record")
    last, final_eval = records[-1], evals[-1]
    return {
        "final_accuracy": final_eval["eval_accuracy"],
        "mean_accuracy": float(np.mean([r["eval_accuracy"] for r in evals])),
        "pass_at_k": final_eval.get("eval_pass_at_k"),
        "entropy": final_eval.get("entropy"),
        "gen_tokens": last["gen_tokens"],
        "wall_s": last["wall_s"],
        "gen_s": last["gen_s"],
        "train_s": last["train_s"],
        "train_rollouts": last["train_rollouts"],
        "train_cost": train_cost(last),
        "gen_rollouts": last["gen_rollouts"],
        "mu_measured": last.get("mu_measured"),
        "mu_measured_steady": steady_mu(records),
        "steps": last["step"],
        "base_accuracy": base_accuracy,
    }


def to_target(records, target: float, mus: dict[str, float], base_accuracy=None, groups=None):
    """Generated tokens, rollouts trained and generated, the training's cost (`train_cost`)
    and modelled costs (one per named mu) when the run first reaches target; inf for each
    when it never does. train_cost and gen_rollouts give the cost at every mu (train_cost +
    mu gen), which a break-even mu needs. With
    `groups` (`device_groups`), also the measured costs there: wall_s_to_target,
    device_s_to_target and busy_device_s_to_target (`device_seconds`)."""
    measured = () if groups is None else ("wall_s", "device_s", "busy_device_s")
    counts = ("gen_tokens", "train_rollouts", "gen_rollouts")
    hit = first_reach(records, target, base_accuracy)
    if hit is None:
        never = [*counts, "train_cost", *measured]
        return {**{f"{k}_to_target": math.inf for k in never}, **{k: math.inf for k in mus}}
    out = {
        **{f"{k}_to_target": hit[k] for k in counts},
        "train_cost_to_target": train_cost(hit),
        **{k: modelled_cost(hit, mu) for k, mu in mus.items()},
    }
    if groups is not None:
        cost = {"wall_s": hit["wall_s"], **device_seconds(hit, groups)}
        out.update({f"{k}_to_target": v for k, v in cost.items()})
    return out


def load_run_config(workdir: str) -> dict[str, Any] | None:
    """The run's config.json, or None when it has none."""
    path = os.path.join(workdir, RUN_CONFIG_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def load_run(workdir: str) -> tuple[list[dict[str, Any]], float | None]:
    """(metrics records, base accuracy or None) of a finished run; records without
    train_cost get it from the run's config.json (`backfill_train_cost`)."""
    records = metrics_lib.read_metrics(workdir)
    records = metrics_lib.backfill_train_cost(records, load_run_config(workdir))
    base = None
    path = os.path.join(workdir, SUMMARY_FILE)
    if os.path.exists(path):
        with open(path) as f:
            base = json.load(f).get("base_accuracy")
    return records, base


def _finite_or_none(value):
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def median(values: Iterable[float | None], *, none_is_inf: bool = True) -> float | None:
    """Median with None read as +inf ("never"), or skipped when none_is_inf is False;
    None if the median is inf or there are no values."""
    values = [math.inf if v is None else float(v) for v in values if none_is_inf or v is not None]
    if not values:
        return None
    return _finite_or_none(np.median(values))


def iqr(values: Iterable[float | None]) -> list[float | None] | None:
    """[25th, 75th] percentiles with None read as +inf; a quartile that reaches into
    the never-reached runs is None."""
    values = [math.inf if v is None else float(v) for v in values]
    if not values:
        return None
    never = 1e300  # np.percentile cannot interpolate inf; any mix with this is "never"
    array = np.where(np.isinf(np.array(values)), never, values)
    return [None if q >= never * 1e-3 else float(q) for q in np.percentile(array, [25, 75])]


def aggregate(
    per_seed: Sequence[dict[str, Any]],
    keys: Sequence[str],
    never_keys: Sequence[str] = (),
    reached_keys: Sequence[str] = (),
) -> dict[str, Any]:
    """Medians over seeds of keys, plus `per_seed` lists and `iqr` pairs. In never_keys
    (e.g. tokens to target) a missing value is +inf; in reached_keys (e.g. entropy at the
    target) the median is over the seeds that have one, None when fewer than half do
    (`median_of_reached`), and so are the quartiles; elsewhere it is skipped."""
    out: dict[str, Any] = {"per_seed": {}, "iqr": {}}
    for k in keys:
        values = [s.get(k) for s in per_seed]
        if k in reached_keys:
            out[k] = median_of_reached(values)
            got = [v for v in values if v is not None]
            out["iqr"][k] = None if out[k] is None else iqr(got)
        else:
            out[k] = median(values, none_is_inf=k in never_keys)
            out["iqr"][k] = iqr(values)
        out["per_seed"][k] = [_finite_or_none(v) for v in values]
    # The medians first, as before: per_seed and iqr after them.
    return {**{k: out[k] for k in keys}, "per_seed": out["per_seed"], "iqr": out["iqr"]}


def ratio(numerator, denominator) -> float | None:
    if numerator is None or denominator in (None, 0):
        return None
    return float(numerator) / float(denominator)


def accuracy_curve(records, x: Callable[[dict[str, Any]], float], base_accuracy=None):
    """(xs, accuracies) of the evaluation records, starting at (0, base) when known."""
    evals = eval_records(records)
    xs = [float(x(r)) for r in evals]
    ys = [float(r["eval_accuracy"]) for r in evals]
    if base_accuracy is not None:
        xs, ys = [0.0, *xs], [float(base_accuracy), *ys]
    return np.asarray(xs), np.asarray(ys)


def median_band(curves, num_points: int = 100):
    """Median and quartiles over curves interpolated on a common grid that stops at the
    shortest curve's end (no extrapolation). curves: list of (xs, ys)."""
    curves = [(xs, ys) for xs, ys in curves if len(xs)]
    if not curves:
        return None
    start = max(xs[0] for xs, _ in curves)
    stop = min(xs[-1] for xs, _ in curves)
    if stop < start:
        start, stop = min(xs[0] for xs, _ in curves), max(xs[-1] for xs, _ in curves)
    grid = np.linspace(start, stop, num_points)
    values = np.stack([np.interp(grid, xs, ys) for xs, ys in curves])
    q1, med, q3 = np.percentile(values, [25, 50, 75], axis=0)
    return grid, med, q1, q3


def ahead_pairs(candidate, reference, tolerance: float = 1e-9) -> dict[str, int]:
    """At each of the reference run's evaluations, the candidate's held-out accuracy at the
    same generated tokens, interpolated linearly between its own evaluations (from (0, base)
    when its base is known), against the reference's: counts of evaluations where the
    candidate is ahead, behind or level. An evaluation past the candidate's last one (or
    before its first) is no pair. candidate, reference: (records, base accuracy or None)."""
    xs, ys = accuracy_curve(candidate[0], lambda r: r["gen_tokens"], candidate[1])
    out = {"ahead": 0, "behind": 0, "level": 0, "pairs": 0}
    if not len(xs):
        return out
    for r in eval_records(reference[0]):
        x = float(r["gen_tokens"])
        if x < xs[0] - tolerance or x > xs[-1] + tolerance:
            continue
        gap = float(np.interp(x, xs, ys)) - float(r["eval_accuracy"])
        out["pairs"] += 1
        out["ahead" if gap > tolerance else "behind" if gap < -tolerance else "level"] += 1
    return out


def seed_spread(candidate_finals, reference_finals) -> dict[str, Any]:
    """Whether the candidate-minus-reference difference of median final accuracies exceeds
    the seed spread, defined as the larger of the two variants' seed ranges (max - min
    over seeds): with few seeds a difference smaller than how far one variant's own seeds
    lie apart is not told from the draw of the seeds. With one seed on either side there is
    no range to compare with: `exceeds` is None, not a verdict from a zero range."""
    ranges = [max(v) - min(v) for v in (candidate_finals, reference_finals)]
    difference = float(np.median(candidate_finals) - np.median(reference_finals))
    spread = float(max(ranges))
    return {
        "difference": difference,
        "candidate_range": float(ranges[0]),
        "reference_range": float(ranges[1]),
        "spread": spread,
        "exceeds": (
            abs(difference) > spread
            if min(len(candidate_finals), len(reference_finals)) > 1
            else None
        ),
    }
