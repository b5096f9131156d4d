"""A study's figures (scripts/compare.py's compare.json): per variant the medians over
seeds to the target accuracy, the ratios of each variant against the reference (on the
same basis first: same_basis), the seed-by-seed comparison and the paper's W / T table.
"""

from __future__ import annotations

import os

from replax.core import config_utils
from replax.tools import analysis, same_basis, study_plan
from replax.tools import experiments as ex
from replax.tools.study_plan import CANDIDATE, REFERENCE

RUN_KEYS = (
    "final_accuracy",
    "pass_at_k",
    "entropy",
    "gen_tokens",
    "wall_s",
    "gen_s",
    "train_s",
    "gen_tokens_to_target",
    "train_rollouts_to_target",
    "train_cost_to_target",
    "gen_rollouts_to_target",
    "cost_to_target",
    "cost_to_target_at_mu_measured",
    "train_cost",
    "total_cost",
    "total_cost_at_mu_measured",
    "mu_measured",
    "mu_measured_steady",
    "mean_accuracy",
    "entropy_at_target",
    "wall_s_to_target",
    "device_s_to_target",
    "busy_device_s_to_target",
    "device_s",
    "busy_device_s",
    "device_s_per_trained_rollout",
)
NEVER_KEYS = (
    "gen_tokens_to_target",
    "train_rollouts_to_target",
    "train_cost_to_target",
    "gen_rollouts_to_target",
    "cost_to_target",
    "cost_to_target_at_mu_measured",
    "wall_s_to_target",
    "device_s_to_target",
    "busy_device_s_to_target",
)
# Measured where a run reaches a point: the median over the seeds that do (analysis.
# median_of_reached), not "never" as +inf.
REACHED_KEYS = ("entropy_at_target",)


def report(
    plan: study_plan.Plan,
    results,
    *,
    mu_model: float,
    target: float | None,
    device_count: int | None = None,
    transfer_result: dict | None = None,
):
    """compare.json's payload (without command and machine) and the curves to plot.
    device_count: the devices every run had (default: this process's, jax.device_count()),
    which with each run's config.json gives its device groups (analysis.device_groups)."""
    if device_count is None:
        import jax  # imported late: the flags are parsed before JAX starts

        device_count = jax.device_count()
    loaded = {
        v: [(seed, *analysis.load_run(d), d) for seed, d in res["runs"]]
        for v, res in results.items()
    }
    summaries = {
        v: [analysis.summarize_run(records, base_accuracy=base) for _, records, base, _ in runs]
        for v, runs in loaded.items()
    }
    mus = [s["mu_measured"] for ss in summaries.values() for s in ss if s["mu_measured"]]
    mu_measured = analysis.median(mus, none_is_inf=False)
    steady = [s["mu_measured_steady"] for ss in summaries.values() for s in ss]
    if target is None:
        if REFERENCE not in summaries:
            raise config_utils.ConfigError(f"no {REFERENCE!r} variant: pass --target")
        target = analysis.median([s["final_accuracy"] for s in summaries[REFERENCE]])
        target_source = f"{REFERENCE} median final accuracy"
    else:
        target_source = "--target"
    mu_for_measured = mu_measured if mu_measured is not None else mu_model
    levels = [float(a) for a in plan.args.entropy_levels] or analysis.accuracy_levels(
        [
            _start_accuracy(records, base)
            for runs in loaded.values()
            for _, records, base, _ in runs
        ],
        [s["final_accuracy"] for ss in summaries.values() for s in ss],
    )
    variants = {}
    curves = {}
    for v, runs in loaded.items():
        per_seed, at_levels, groups_of = [], [], []
        # Re-evaluations of the runs' last checkpoints (--final_pass_k_prompts), if any.
        finals = results[v].get("final_evals") or [{}] * len(runs)
        for (seed, records, base, d), s, final in zip(runs, summaries[v], finals):
            groups = analysis.device_groups(analysis.load_run_config(d), device_count)
            groups_of.append(groups)
            hit = analysis.to_target(
                records,
                target,
                {"cost_to_target": mu_model, "cost_to_target_at_mu_measured": mu_for_measured},
                base_accuracy=base,
                groups=groups,
            )
            total = {"train_cost": s["train_cost"], "gen_rollouts": s["gen_rollouts"]}
            if final:  # pass@k and entropy over --final_pass_k_prompts prompts
                s = {**s, "pass_at_k": final["eval_pass_at_k"], "entropy": final["entropy"]}
            # The runs' own evaluations (the re-evaluation is of the last checkpoint only).
            at_levels.append([analysis.entropy_at(records, a, base) for a in levels])
            per_seed.append(
                {
                    **s,
                    **hit,
                    "seed": seed,
                    "total_cost": analysis.modelled_cost(total, mu_model),
                    "total_cost_at_mu_measured": analysis.modelled_cost(total, mu_for_measured),
                    "entropy_at_target": analysis.entropy_at(records, target, base),
                    **analysis.device_seconds(records[-1], groups),
                }
            )
            per_seed[-1]["device_s_per_trained_rollout"] = analysis.ratio(
                per_seed[-1]["device_s"], s["train_rollouts"]
            )
        config = plan.config(v, results[v]["lr"], plan.seeds[0])
        by_level = {_level_key(a): [e[i] for e in at_levels] for i, a in enumerate(levels)}
        variants[v] = {
            **analysis.aggregate(
                per_seed, RUN_KEYS, never_keys=NEVER_KEYS, reached_keys=REACHED_KEYS
            ),
            "entropy_at_accuracy": {
                k: analysis.median_of_reached(values) for k, values in by_level.items()
            },
            "entropy_at_accuracy_per_seed": by_level,
            **groups_of[0],
            "lr": results[v]["lr"],
            "seeds": [s["seed"] for s in per_seed],
            "run_dirs": [os.path.relpath(d, plan.workdir) for *_, d in runs],
            "R": ex.rollouts_per_step(config),
            "B": config.train.batch_size,
            "N": config.replay.capacity,
            "total_steps": config.total_steps,
        }
        curves[v] = [(records, base) for _, records, base, _ in runs]

    def ratios(name):
        ref, cand = variants.get(REFERENCE), variants.get(name)
        if ref is None or cand is None:
            return dict.fromkeys(
                (
                    *same_basis.RATIO_KEYS,
                    "inference_ratio",
                    "compute_ratio",
                    "compute_ratio_at_mu_measured",
                    "device_s_ratio",
                    "busy_device_s_ratio",
                )
            )
        return {
            # Each side's own first reach (same_basis), ahead of the candidate's first reach
            # over the reference's whole run.
            **same_basis.ratios(cand, ref),
            "inference_ratio": analysis.ratio(cand["gen_tokens_to_target"], ref["gen_tokens"]),
            "compute_ratio": analysis.ratio(cand["cost_to_target"], ref["total_cost"]),
            "compute_ratio_at_mu_measured": analysis.ratio(
                cand["cost_to_target_at_mu_measured"], ref["total_cost_at_mu_measured"]
            ),
            # Measured: device-seconds to the target over the reference's whole run.
            "device_s_ratio": analysis.ratio(cand["device_s_to_target"], ref["device_s"]),
            "busy_device_s_ratio": analysis.ratio(
                cand["busy_device_s_to_target"], ref["busy_device_s"]
            ),
        }

    def versus(name):
        """The candidate against the reference seed by seed (the seeds both have)."""
        ref, cand = variants.get(REFERENCE), variants.get(name)
        if ref is None or cand is None:
            return None
        seeds = [s for s in cand["seeds"] if s in ref["seeds"]]
        at = lambda s, seed, k: s["per_seed"][k][s["seeds"].index(seed)]  # noqa: E731
        runs = {v: dict(zip(variants[v]["seeds"], curves[v])) for v in (REFERENCE, name)}
        pairs = [analysis.ahead_pairs(runs[name][seed], runs[REFERENCE][seed]) for seed in seeds]
        return {
            "seeds": seeds,
            **same_basis.per_seed(cand, ref, seeds, names=(name, REFERENCE)),
            "inference_ratio": [
                analysis.ratio(at(cand, s, "gen_tokens_to_target"), at(ref, s, "gen_tokens"))
                for s in seeds
            ],
            "compute_ratio": [
                analysis.ratio(at(cand, s, "cost_to_target"), at(ref, s, "total_cost"))
                for s in seeds
            ],
            # At each of the reference's evaluations, the candidate's accuracy at the same
            # generated tokens (analysis.ahead_pairs), per seed and summed.
            "ahead_pairs_per_seed": pairs,
            "ahead_pairs": {
                k: sum(p[k] for p in pairs) for k in ("ahead", "behind", "level", "pairs")
            },
            "seed_spread": analysis.seed_spread(
                cand["per_seed"]["final_accuracy"], ref["per_seed"]["final_accuracy"]
            ),
        }

    payload = {
        "variants": variants,
        "target_accuracy": target,
        "target_source": target_source,
        "mu_model": mu_model,
        "mu_measured": mu_measured,
        # The same without the first step's seconds (compilation).
        "mu_measured_steady": analysis.median(steady, none_is_inf=False),
        "first_reach_rule": same_basis.FIRST_REACH_RULE,
        **ratios(CANDIDATE),
        "ratios": {v: ratios(v) for v in variants if v != REFERENCE},
        "lr_grid": {v: res["lr_grid"] for v, res in results.items()},
        "lr_chosen": {v: res["lr"] for v, res in results.items()},
        # 'low' / 'high' / 'both' (a one-rate grid): the chosen rate at that edge of its
        # grid, where a rate past it may be better; None: the grid brackets it.
        "lr_edge": {v: res.get("lr_edge") for v, res in results.items()},
        "lr_added": {v: res.get("lr_added", []) for v, res in results.items()},
        # Per seed: ratios, the (seed, equal-token evaluation) pairs where the candidate
        # is ahead, and its difference of median finals against the seed spread.
        "versus": {v: versus(v) for v in variants if v != REFERENCE},
        "transfer": transfer_result,
        "budget_rollouts": plan.budget,
        "seeds": plan.seeds,
        "select_seed": plan.args.select_seed,
        "select_by": plan.args.select_by,
        # 0: pass@k and entropy are the runs' own final evaluations (config.eval sizes).
        "final_pass_k_prompts": plan.args.final_pass_k_prompts,
        # The accuracies of each variant's entropy_at_accuracy (--entropy_levels, or
        # analysis.accuracy_levels of all runs).
        "entropy_levels": levels,
        "paper_table": paper_table(
            [float(r) for r in plan.args.paper_w_over_t], mu_measured, mu_model, variants
        ),
    }
    return payload, curves


def _start_accuracy(records, base):
    """A run's accuracy before training: its base, or its first evaluation's when the base
    is unknown."""
    return base if base is not None else analysis.eval_records(records)[0]["eval_accuracy"]


def _level_key(accuracy: float) -> str:
    return f"{accuracy:.4g}"


def paper_table(w_over_t, mu_measured, mu_model, variants) -> dict:
    """The paper's W / T table: for each ratio of W sampler to T trainer devices, the
    modelled compute of an asynchronous run whose trainer never waits, per rollout trained
    on, relative to synchronous on-policy, (1 + W/T) / (1 + mu) (analysis.
    paper_compute_ratio), at the measured mu and at mu_model; and the replay ratio B / R
    that keeps the trainer from waiting, mu / (W/T) (the sampler's R rollouts take mu R /
    W, the trainer's B take B / T). `measured`: each disjoint variant's device-seconds per
    rollout trained on over the reference's (device_s / train_rollouts of whole runs), next
    to the formula at its own W / T and the measured mu."""
    mus = {"at_mu_measured": mu_measured, "at_mu_model": mu_model}
    rows = []
    for r in w_over_t:
        row = {"W_over_T": r}
        for name, mu in mus.items():
            row[f"compute_ratio_{name}"] = analysis.paper_compute_ratio(r, mu)
            row[f"min_replay_ratio_{name}"] = None if mu is None else mu / r
        rows.append(row)
    measured = {}
    ref = variants.get(REFERENCE)
    for v, s in variants.items():
        if s["placement"] != "disjoint" or not s["T"]:
            continue
        measured[v] = {
            "W": s["W"],
            "T": s["T"],
            "W_over_T": s["W"] / s["T"],
            "device_s_per_trained_rollout_ratio": None
            if ref is None
            else analysis.ratio(
                s["device_s_per_trained_rollout"], ref["device_s_per_trained_rollout"]
            ),
            "compute_ratio_at_mu_measured": analysis.paper_compute_ratio(
                s["W"] / s["T"], mu_measured
            ),
        }
    return {
        "formula": "(1 + W/T) / (1 + mu)",
        "mu_measured": mu_measured,
        "mu_model": mu_model,
        "rows": rows,
        "measured": measured,
    }


def cost_model_mu(text: str) -> tuple[float, str]:
    """(mu, where it comes from) of --mu_model: a number as given (the paper's accelerator
    measurement by default), or tpu:CONFIG:TOPOLOGY's modelled roofline mu, never a
    measurement."""
    from replax.tools import aot

    parsed = aot.parse_mu_model(text)
    if parsed is None:
        return float(text), "given"
    config, topology = parsed
    mu = aot.modelled_mu_of_config(config, topology)["mu"]
    return mu, f"modelled (roofline) for {config} on {topology}"
