"""A study's report as people read it: compare.md's tables (medians, the rate grids, each
seed, the seed spread, entropy at equal accuracy, the transfer) and the plots of
accuracy against generated tokens, modelled cost and wall-clock, and of entropy
against accuracy; and scripts/sweep.py's heat map of cost over the replay design.
"""

from __future__ import annotations

from replax.tools import analysis, lr_selection, same_basis
from replax.tools import report as report_lib
from replax.tools.study_plan import CANDIDATE, REFERENCE


def table(payload) -> str:
    rows = []
    for v, s in payload["variants"].items():
        rows.append(
            [
                v,
                report_lib.fmt(s["lr"], "lr"),
                report_lib.fmt(s["final_accuracy"], "pct"),
                report_lib.fmt(s["pass_at_k"], "pct"),
                report_lib.fmt(s["entropy"]),
                report_lib.fmt(s["gen_tokens_to_target"], "int"),
                report_lib.fmt(s["cost_to_target"], "int"),
                report_lib.fmt(s["wall_s"], "int"),
                report_lib.fmt(s["entropy_at_target"]),
                report_lib.fmt(s["device_s_to_target"], "int"),
            ]
        )
    header = [
        "variant",
        "lr",
        "final acc",
        "pass@k",
        "entropy",
        "tokens to target",
        f"cost to target (mu={payload['mu_model']:g})",
        "wall s",
        "entropy at target",
        "device s to target",
    ]
    # The same basis leads; the candidate's first reach over the reference's whole run
    # follows in the notes, named for what it is.
    lead = ""
    if {REFERENCE, CANDIDATE} <= set(payload["variants"]):
        lead = same_basis.headline(payload, CANDIDATE, REFERENCE) + "\n"
    notes = same_basis.notes(payload, CANDIDATE, REFERENCE)
    return lead + report_lib.markdown_table(header, rows) + notes + details(payload)


def points(value) -> str:
    return f"{100 * value:+.1f} points"


def details(payload) -> str:
    """compare.md below the medians: the rate grids and their edges, each seed's figures,
    the equal-token pairs, the seed-spread line, entropy at shared accuracies and the
    transfer to GSM8K."""
    lines = [
        "",
        "Learning rates on seed {}, by {} accuracy:".format(
            payload["select_seed"], payload["select_by"]
        ),
    ]
    for v, grid in payload["lr_grid"].items():
        tried = ", ".join(
            f"{g['lr']:g} ("
            + ", ".join(
                f"{report_lib.fmt(g[k], 'pct')} {k.split('_')[0]}"
                for k in ("final_accuracy", "mean_accuracy")
                if g.get(k) is not None
            )
            + ")"
            for g in grid
        )
        edge = payload.get("lr_edge", {}).get(v)
        where = lr_selection.edge_words(edge).upper() if edge else "inside the grid"
        added = payload.get("lr_added", {}).get(v)
        more = f"; extended by {', '.join(f'{r:g}' for r in added)}" if added else ""
        lines.append(f"- {v}: chose {payload['lr_chosen'][v]:g}, {where}{more}; tried {tried}")
    header = ["variant", "seed", "final acc", "tokens to target", "cost to target", "gen tokens"]
    rows = []
    for v, s in payload["variants"].items():
        per = s["per_seed"]
        for i, seed in enumerate(s["seeds"]):
            rows.append(
                [
                    v,
                    seed,
                    report_lib.fmt(per["final_accuracy"][i], "pct"),
                    report_lib.fmt(per["gen_tokens_to_target"][i], "int"),
                    report_lib.fmt(per["cost_to_target"][i], "int"),
                    report_lib.fmt(per["gen_tokens"][i], "int"),
                ]
            )
    lines += ["", "Per seed:", "", report_lib.markdown_table(header, rows).rstrip()]
    for v, vs in (payload.get("versus") or {}).items():
        if vs is None:
            continue
        pairs, spread = vs["ahead_pairs"], vs["seed_spread"]
        verdict = {
            True: "the difference EXCEEDS the seed spread",
            False: "the difference does NOT exceed the seed spread",
            None: "one seed on a side, so no seed spread to weigh the difference against",
        }[spread["exceeds"]]
        lines += [
            "",
            *same_basis.versus_lines(v, REFERENCE, vs, payload["mu_model"]),
            f"{v} ahead at {pairs['ahead']} of {pairs['pairs']} (seed, equal-token "
            f"evaluation) pairs (behind at {pairs['behind']}, level at {pairs['level']}).",
            f"Seed spread: {v} minus {REFERENCE} median final accuracy "
            f"{points(spread['difference'])}; the larger seed range (max - min) "
            f"{points(spread['spread'])[1:]} ({v} {100 * spread['candidate_range']:.1f}, "
            f"{REFERENCE} {100 * spread['reference_range']:.1f}): {verdict}.",
        ]
    levels = payload.get("entropy_levels") or []
    if levels:
        lines += ["", "Held-out entropy at equal accuracy (median over the seeds that reach it):"]
        for v, s in payload["variants"].items():
            at = ", ".join(
                f"{100 * a:.1f}%: {report_lib.fmt(s['entropy_at_accuracy'].get(f'{a:.4g}'))}"
                for a in levels
            )
            lines.append(f"- {v}: {at}")
    t = payload.get("transfer")
    if t:
        lines += [
            "",
            f"Transfer (not a target): greedy accuracy on the {t['prompts']} shortest "
            f"questions of {t['data']} ({t['max_new_tokens']} new tokens): base "
            f"{report_lib.fmt(t['base'], 'pct')}; "
            + "; ".join(
                f"{v} {report_lib.fmt(r['eval_accuracy'], 'pct')} (per seed "
                f"{', '.join(transfer_cell(a) for a in r['per_seed'])})"
                for v, r in t["variants"].items()
            )
            + ".",
        ]
    return "\n".join(lines) + "\n"


def transfer_cell(accuracy) -> str:
    """A seed's transfer figure; None is a run whose checkpoints were gone when it was
    measured (a kept run without its transfer file), not a run that scored nothing."""
    return "not measured" if accuracy is None else report_lib.fmt(accuracy, "pct")


def plot(payload, curves, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mu = payload["mu_model"]
    axes_spec = [
        ("generated tokens", lambda r: r["gen_tokens"]),
        (f"modelled cost, mu = {mu:g} (rollouts trained)", lambda r: analysis.modelled_cost(r, mu)),
        ("wall-clock s", lambda r: r["wall_s"]),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (v, runs) in enumerate(curves.items()):
        colour = colours[i % len(colours)]
        for ax, (_, x) in zip(axes, axes_spec):
            band = analysis.median_band(
                [analysis.accuracy_curve(records, x, base) for records, base in runs]
            )
            if band is None:
                continue
            grid, med, q1, q3 = band
            ax.plot(grid, med, color=colour, label=f"{v} (lr {payload['lr_chosen'][v]:g})")
            ax.fill_between(grid, q1, q3, color=colour, alpha=0.2, linewidth=0)
    for ax, (label, _) in zip(axes, axes_spec):
        ax.axhline(payload["target_accuracy"], color="k", linestyle="--", linewidth=1)
        ax.set_xlabel(label)
        ax.set_ylabel("held-out accuracy")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    fig.suptitle(
        f"median and IQR over seeds {payload['seeds']}; dashed: target "
        f"{100 * payload['target_accuracy']:.1f}%"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_entropy(payload, curves, path: str) -> None:
    """Held-out entropy against held-out accuracy, one line per seed, a colour per
    variant; a star at each variant's entropy_at_target, the target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (v, runs) in enumerate(curves.items()):
        colour = colours[i % len(colours)]
        for j, (records, _) in enumerate(runs):
            points = [r for r in analysis.eval_records(records) if r.get("entropy") is not None]
            xs = [r["eval_accuracy"] for r in points]
            label = f"{v} (lr {payload['lr_chosen'][v]:g})" if j == 0 else None
            ax.plot(xs, [r["entropy"] for r in points], "o-", color=colour, alpha=0.6,
                    markersize=3, label=label)  # fmt: skip
        at_target = payload["variants"][v]["entropy_at_target"]
        if at_target is not None:
            ax.plot([payload["target_accuracy"]], [at_target], "*", color=colour, markersize=12)
    ax.axvline(payload["target_accuracy"], color="k", linestyle="--", linewidth=1)
    ax.set_xlabel("held-out accuracy (greedy pass@1)")
    ax.set_ylabel("held-out entropy (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    ax.set_title(
        f"seeds {payload['seeds']}; dashed: target {100 * payload['target_accuracy']:.1f}%, "
        "star: median entropy there",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_cost_heatmap(payload, path: str) -> None:
    """scripts/sweep.py's sweep.png: the grid cells' median cost to the target, x = N / R
    by y = B / R (log colour unless a cost is 0), each annotated with its ratio to
    on-policy's total; a cell never reaching the target hatched, an infeasible one n/a."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LogNorm, Normalize

    grid = [c for c in payload["cells"] if c["kind"] == "grid"]
    xs = sorted({c["x"] for c in grid})
    ys = sorted({c["y"] for c in grid})
    values = np.full((len(ys), len(xs)), np.nan)
    for c in grid:
        if c["feasible"] and c.get("cost_to_target") is not None:
            values[ys.index(c["y"]), xs.index(c["x"])] = c["cost_to_target"]
    fig, ax = plt.subplots(figsize=(1.6 * len(xs) + 2.5, 1.3 * len(ys) + 1.8))
    finite = values[np.isfinite(values)]
    norm = None
    if finite.size:
        lo, hi = finite.min(), finite.max()
        # Costs span orders of magnitude: a log scale unless one is 0.
        norm = LogNorm(lo, max(hi, lo * 1.01)) if lo > 0 else Normalize(lo, max(hi, lo + 1))
    image = ax.imshow(values, origin="lower", cmap="viridis_r", norm=norm, aspect="auto")
    for c in grid:
        i, j = ys.index(c["y"]), xs.index(c["x"])
        if not c["feasible"]:
            text, colour = "n/a", "grey"
        elif c.get("cost_to_target") is None:
            ax.add_patch(
                plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", color="grey")
            )
            text, colour = f"never\n{report_lib.fmt(c.get('final_accuracy'), 'pct')}", "black"
        else:
            text = f"{c['cost_to_target']:,.0f}"
            if c.get("compute_ratio") is not None:
                text += f"\n{c['compute_ratio']:.2f}x"
            colour = "white" if norm and norm(c["cost_to_target"]) > 0.5 else "black"
        ax.text(j, i, text, ha="center", va="center", color=colour, fontsize=9)
    ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
    ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys])
    ax.set_xlabel("staleness horizon x = N / R")
    ax.set_ylabel("replay ratio y = B / R")
    ax.set_title(
        f"cost to {100 * payload['target_accuracy']:.1f}% (mu = {payload['mu_model']:g}; "
        f"ratio to on-policy total), R = {payload['R']}"
    )
    if finite.size:
        fig.colorbar(image, ax=ax, label="rollouts trained + mu x generated")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
