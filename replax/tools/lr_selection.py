"""The learning rate of each variant of a study: the best of its grid on the selection
seed, and the grid grown past an edge its best lies at.

`select_lr` takes a study_plan.Plan (`plan`: its args, lr_grid and `locate`) and, when
given, a transfer.Transfer that measures a run which may be chosen while its checkpoints
are on this machine.
"""

from __future__ import annotations

from replax.tools import analysis


def choose_lr(grid: list[dict], select_by: str) -> dict:
    """The grid entry with the best final accuracy (select_by 'final') or mean accuracy
    over the run ('mean'); the other figure breaks ties."""
    order = ("final_accuracy", "mean_accuracy")
    if select_by == "mean":
        order = order[::-1]
    return max(grid, key=lambda g: tuple(g[k] for k in order))


def lr_edge(rates: list[float], best: float) -> str | None:
    """Where the best rate lies in its grid: 'low' or 'high' at that end, 'both' when the
    grid has one rate, None inside it (the grid then brackets the best)."""
    low, high = best <= min(rates), best >= max(rates)
    return "both" if low and high else "low" if low else "high" if high else None


def edge_words(edge: str) -> str:
    """The edge as a phrase: a one-rate grid's rate is at both of its edges."""
    return "the grid's only rate" if edge == "both" else f"at the grid's {edge} edge"


def beyond_edge(rates: list[float], edge: str, factor: float) -> list[float]:
    """The next rates past the edge, a factor down from the lowest and / or up from the
    highest, rounded to one significant digit as the default grid is."""
    out = []
    if edge in ("low", "both"):
        out.append(float(f"{min(rates) / factor:.1g}"))
    if edge in ("high", "both"):
        out.append(float(f"{max(rates) * factor:.1g}"))
    return [r for r in out if r not in rates]


def extends(plan, variant: str) -> bool:
    """Whether the variant's grid grows past an edge its best rate lies at: by default, when
    it searches (two rates or more); a one-rate grid is a rate given (a study at rates
    another chose), which a search would overrule."""
    return plan.args.extend_lr_grid and len(plan.lr_grid[variant]) > 1


def select_lr(plan, variant: str, log=print, transfer=None) -> dict:
    """Runs the variant's rate grid on the selection seed and picks the best rate by
    --select_by. A best rate at the grid's edge is reported, and the grid grows by the next
    rate past that edge (--lr_extend_factor) until the best is inside it, at most
    --max_lr_extensions times (`extends`: not a one-rate grid, nor with --noextend_lr_grid)."""
    args = plan.args
    rates, added, dirs, by_rate = list(plan.lr_grid[variant]), [], {}, {}
    while True:
        for lr in rates:
            if lr in by_rate:
                continue
            dirs[lr] = plan.locate(variant, lr, args.select_seed, log=log)
            records, base = analysis.load_run(dirs[lr])
            s = analysis.summarize_run(records, base_accuracy=base)
            by_rate[lr] = {"lr": lr, **{k: s[k] for k in ("final_accuracy", "mean_accuracy")}}
            if transfer:
                transfer.may_be_chosen(variant, lr, by_rate, dirs[lr])
        grid = [by_rate[lr] for lr in sorted(rates)]
        best = choose_lr(grid, args.select_by)
        edge = lr_edge(rates, best["lr"])
        more = beyond_edge(rates, edge, args.lr_extend_factor) if edge else []
        if not (more and extends(plan, variant) and len(added) < args.max_lr_extensions):
            break
        log(f"{variant}: best rate {best['lr']:g} {edge_words(edge)}; adding {more}")
        rates += more
        added += more
    log(
        f"{variant}: learning rate {best['lr']:g} (final accuracy {best['final_accuracy']:.3f}, "
        f"mean {best['mean_accuracy']:.3f}; by {args.select_by})"
    )
    if edge:
        log(
            f"{variant}: the chosen rate {best['lr']:g} is {edge_words(edge)} "
            f"({sorted(rates)}): a rate past it may be better"
            + ("" if extends(plan, variant) else " (not extended: one rate, or --noextend)")
        )
    return {"grid": grid, "best": best, "edge": edge, "added": added, "dirs": dirs}
