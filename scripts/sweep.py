r"""Cost to a target accuracy over the replay design: buffer horizon x = N/R by replay
ratio y = B/R, plus the paper's refinements.

  python scripts/sweep.py --workdir=/tmp/replax/sweep \
      --target_from=/tmp/replax/compare/compare.json [--seeds=1]

Each grid cell is the config variant (`--variant`, default replay) with R fixed, B = y R
and N = x R, on the same generated-rollout budget as compare.py. Each refinement is one
run at the cell `--refine_at` (default: the variant's own x, y): pbD (positive-bias
sampling, delta D), asymre (the AsymRE loss), maxageK (items older than K steps are not
sampled), zeroadv (flip whether zero-advantage groups are stored; keepzero / dropzero set
it), auto (replay.mode=auto). A cell the trainer rejects (e.g. N < B) is marked n/a.

The target is the on-policy median final accuracy of a compare.json (`--target_from`,
which also supplies the replay learning rate, mu_model, the budget and, when present,
its warm starts and data) or `--target` (the budget is then compare.py's default).
Each run's generated tokens and modelled cost (sum over steps of B + mu R) when it first
reaches the target go to DIR/sweep.json, a markdown table to DIR/sweep.md (and stdout),
and a heat map to DIR/sweep.png (x by y, colour = median cost to target at mu_model,
annotated; never-reached cells hatched).
Runs live in DIR/runs/NAME/seedS and are resumable.

Flags (absl, as scripts/train.py takes them): --config=FILE[:VARIANT] (default
configs/arith.py; a VARIANT there is the variant, as --variant gives it),
--config.KEY=VALUE (repeatable: every run; --override=KEY=VALUE is the older spelling),
--variant, --target_from, --target, --x, --y, --refinements, --refine_at, --seeds, --lr,
--mu_model, --budget_rollouts, --num_evals, --shared_dir, --compilation_cache DIR|none.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from replax.config import spec as spec_lib  # noqa: E402
from replax.core import config_utils
from replax.tools import analysis, study_render
from replax.tools import experiments as ex  # noqa: E402
from replax.tools import report as report_lib

KEYS = (
    "final_accuracy",
    "pass_at_k",
    "entropy",
    "gen_tokens",
    "wall_s",
    "gen_tokens_to_target",
    "cost_to_target",
    "cost_to_target_at_mu_measured",
    "mu_measured",
)
NEVER_KEYS = ("gen_tokens_to_target", "cost_to_target", "cost_to_target_at_mu_measured")


def define_flags(values) -> None:
    """sweep.py's own flags (ex.parse_command_line adds --config, --workdir, --override
    and --compilation_cache)."""
    define = ex.flag_definer(values)
    define("string", "variant", "replay", "The config variant of every cell.")
    define("string", "target_from", "", "A compare.json: target, rate, mu, budget, bases.")
    define("float", "target", None, "Target accuracy (instead of --target_from's).")
    define("string", "x", "1,2,4,8,16", "buffer horizons N / R")
    define("string", "y", "1,2,4", "replay ratios B / R")
    define("string", "refinements", "pb0.2,pb0.5,asymre,maxage4,zeroadv", "Refinement runs.")
    define("string", "refine_at", "", "X,Y of the refinement runs")
    define("integer", "seeds", 1, "Seeds per cell.", lower_bound=1)
    define("float", "lr", None, "Learning rate (default: --target_from's replay rate).")
    define("float", "mu_model", None, "The mu of the cost model (default 6).")
    define("integer", "budget_rollouts", 0, "Generated rollouts per run.")
    define("integer", "num_evals", 16, "Evaluations per run.", lower_bound=1)
    define("string", "shared_dir", "", "where data/ and base/ live")


def parse_args(argv):
    args = ex.parse_command_line("sweep.py", argv, define_flags)
    path, arg = ex.config_file(args)
    if arg is not None:  # --config=FILE:VARIANT names the variant, as --variant does
        if args["variant"].present and args.variant != arg:
            raise config_utils.ConfigError(
                f"--config={path}:{arg} and --variant={args.variant}: give the variant once"
            )
        args.variant = arg
    return args


def _numbers(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _label(value: float) -> str:
    return f"{value:g}"


def refinement_overrides(name: str, base) -> dict[str, object]:
    """Config overrides of a named refinement."""
    if m := re.fullmatch(r"pb([0-9.]+)", name):
        return {"replay.strategy": "positive_bias", "replay.delta": float(m.group(1))}
    if m := re.fullmatch(r"maxage(\d+)", name):
        return {"replay.max_age": int(m.group(1))}
    fixed = {
        "asymre": {"loss.name": "asymre"},
        "zeroadv": {"replay.drop_zero_advantage": not base.replay.drop_zero_advantage},
        "keepzero": {"replay.drop_zero_advantage": False},
        "dropzero": {"replay.drop_zero_advantage": True},
        "auto": {"replay.mode": "auto"},
    }
    if name not in fixed:
        raise config_utils.ConfigError(
            f"refinement {name!r}: expected pbDELTA, maxageK, asymre, zeroadv, keepzero, "
            "dropzero or auto"
        )
    return fixed[name]


class Sweep:
    def __init__(self, args):
        self.args = args
        self.workdir = os.path.abspath(args.workdir)
        self.compare = None
        if args.target_from:
            with open(args.target_from) as f:
                self.compare = json.load(f)
        self.path, _ = ex.config_file(args)
        self.overrides = ex.command_line_overrides(args)
        if any(scope is not None for scope, _, _ in self.overrides):
            raise config_utils.ConfigError("sweep --override takes KEY=VALUE (no scope)")
        base = self.base_config()
        self.r = ex.rollouts_per_step(base)
        cmp = self.compare or {}
        self.lr = args.lr or cmp.get("lr_chosen", {}).get(args.variant)
        self.lr = self.lr or base.optimizer.learning_rate
        self.mu_model = args.mu_model or cmp.get("mu_model") or 6.0
        self.budget = args.budget_rollouts or cmp.get("budget_rollouts") or self._default_budget()
        if args.target is not None:
            self.target, self.target_source = args.target, "--target"
        elif self.compare is not None:
            self.target = self.compare["target_accuracy"]
            self.target_source = f"{args.target_from}: {self.compare.get('target_source')}"
        else:
            raise config_utils.ConfigError("pass --target_from=DIR/compare.json or --target")
        compare_dir = os.path.dirname(os.path.abspath(args.target_from or self.workdir))
        self.shared_dir = args.shared_dir or (
            compare_dir if os.path.isdir(os.path.join(compare_dir, "base")) else self.workdir
        )
        self.seeds = list(range(args.seeds))
        self.cells = self._cells(base)

    def _default_budget(self) -> int:
        """compare.py's default: total_steps x R of the on-policy variant, if any."""
        reference = self.args.variant
        if "onpolicy" in ex.config_variants(self.path):
            reference = "onpolicy"
        config = ex.load_config(self.path, reference)
        for _, key, value in self.overrides:
            ex.set_value(config, key, value)
        return config.total_steps * ex.rollouts_per_step(config)

    def base_config(self):
        config = ex.load_config(self.path, self.args.variant)
        for _, key, value in self.overrides:
            ex.set_value(config, key, value)
        return config

    def _cells(self, base):
        cells = []
        for y in _numbers(self.args.y):
            for x in _numbers(self.args.x):
                cells.append(
                    {
                        "name": f"x{_label(x)}_y{_label(y)}",
                        "kind": "grid",
                        "x": x,
                        "y": y,
                        "overrides": {
                            "train.batch_size": round(y * self.r),
                            "replay.capacity": round(x * self.r),
                        },
                    }
                )
        if self.args.refine_at:
            x, y = _numbers(self.args.refine_at)
        else:
            x, y = base.replay.capacity / self.r, base.train.batch_size / self.r
        for name in filter(None, (n.strip() for n in self.args.refinements.split(","))):
            cells.append(
                {
                    "name": f"x{_label(x)}_y{_label(y)}_{name}",
                    "kind": "refinement",
                    "refinement": name,
                    "x": x,
                    "y": y,
                    "overrides": {
                        "train.batch_size": round(y * self.r),
                        "replay.capacity": round(x * self.r),
                        **refinement_overrides(name, base),
                    },
                }
            )
        return cells

    def config(self, cell, seed):
        config = self.base_config()
        for key, value in cell["overrides"].items():
            ex.set_value(config, key, value)
        return ex.finalize_config(
            config,
            budget_rollouts=self.budget,
            num_evals=self.args.num_evals,
            seed=seed,
            learning_rate=self.lr,
            shared_dir=self.shared_dir,
            explicit={key for _, key, _ in self.overrides},
        )

    def run_dir(self, cell, seed):
        return os.path.join(self.workdir, "runs", cell["name"], f"seed{seed}")

    def validate(self):
        """Marks cells the trainer rejects as infeasible (with the reason)."""
        from replax.config import build as configuration

        os.makedirs(os.path.join(self.shared_dir, "data"), exist_ok=True)
        for cell in self.cells:
            try:
                configuration.validate(self.config(cell, self.seeds[0]))
                cell["feasible"], cell["reason"] = True, None
            except config_utils.ConfigError as e:
                cell["feasible"], cell["reason"] = False, str(e)
        if not any(c["feasible"] for c in self.cells):
            raise config_utils.ConfigError(f"no feasible cell: {self.cells[0]['reason']}")


def run_and_summarize(sweep: Sweep, log=print):
    mus = {"cost_to_target": sweep.mu_model}
    measured = []
    for cell in sweep.cells:
        if not cell["feasible"]:
            log(f"{cell['name']}: n/a ({cell['reason']})")
            continue
        cell["runs"] = []
        for seed in sweep.seeds:
            workdir = sweep.run_dir(cell, seed)
            ex.ensure_run(spec_lib.parse(sweep.config(cell, seed)), workdir, log=log)
            records, base = analysis.load_run(workdir)
            summary = analysis.summarize_run(records, base_accuracy=base)
            summary.update(analysis.to_target(records, sweep.target, mus, base_accuracy=base))
            cell["runs"].append((seed, workdir, records, base, summary))
            if summary["mu_measured"]:
                measured.append(summary["mu_measured"])
    mu_measured = analysis.median(measured, none_is_inf=False)
    reference = (sweep.compare or {}).get("variants", {}).get("onpolicy", {})
    on_cost, on_tokens = reference.get("total_cost"), reference.get("gen_tokens")
    on_cost_measured = None
    if mu_measured is not None and "total_steps" in reference:
        # On-policy's total cost is steps x (B + mu R) at any mu.
        steps, b, r = reference["total_steps"], reference["B"], reference["R"]
        on_cost_measured = steps * (b + mu_measured * r)
    for cell in sweep.cells:
        if not cell["feasible"]:
            continue
        for _, _, records, base, summary in cell["runs"]:
            summary.update(
                analysis.to_target(
                    records,
                    sweep.target,
                    {"cost_to_target_at_mu_measured": mu_measured or sweep.mu_model},
                    base_accuracy=base,
                )
            )
        cell.update(
            analysis.aggregate([run[-1] for run in cell["runs"]], KEYS, never_keys=NEVER_KEYS)
        )
        cell["compute_ratio"] = analysis.ratio(cell["cost_to_target"], on_cost)
        cell["compute_ratio_at_mu_measured"] = analysis.ratio(
            cell["cost_to_target_at_mu_measured"], on_cost_measured
        )
        cell["inference_ratio"] = analysis.ratio(cell["gen_tokens_to_target"], on_tokens)
        cell["run_dirs"] = [os.path.relpath(run[1], sweep.workdir) for run in cell["runs"]]
        del cell["runs"]
    done = [c for c in sweep.cells if c["feasible"]]
    best = min(done, key=lambda c: (c["cost_to_target"] or math.inf, -(c["final_accuracy"] or 0.0)))
    return {
        "cells": sweep.cells,
        "best": best["name"],
        "target_accuracy": sweep.target,
        "target_source": sweep.target_source,
        "mu_model": sweep.mu_model,
        "mu_measured": mu_measured,
        "onpolicy_total_cost": on_cost,
        "onpolicy_total_cost_at_mu_measured": on_cost_measured,
        "onpolicy_gen_tokens": on_tokens,
        "variant": sweep.args.variant,
        "R": sweep.r,
        "lr": sweep.lr,
        "budget_rollouts": sweep.budget,
        "seeds": sweep.seeds,
    }


def table(payload) -> str:
    rows = []
    for c in payload["cells"]:
        feasible = c["feasible"]
        rows.append(
            [
                c["name"],
                _label(c["x"]),
                _label(c["y"]),
                c["overrides"]["train.batch_size"],
                c["overrides"]["replay.capacity"],
                report_lib.fmt(c.get("final_accuracy"), "pct") if feasible else "n/a",
                report_lib.fmt(c.get("gen_tokens_to_target"), "int") if feasible else "n/a",
                report_lib.fmt(c.get("cost_to_target"), "int") if feasible else "n/a",
                report_lib.fmt(c.get("compute_ratio"))
                if feasible and c.get("compute_ratio")
                else "-",
                report_lib.fmt(c.get("wall_s"), "int") if feasible else "n/a",
            ]
        )
    header = [
        "run",
        "x = N/R",
        "y = B/R",
        "B",
        "N",
        "final acc",
        "tokens to target",
        f"cost to target (mu={payload['mu_model']:g})",
        "vs on-policy cost",
        "wall s",
    ]
    notes = (
        f"\nR = {payload['R']}, lr {payload['lr']:g}, target "
        f"{100 * payload['target_accuracy']:.1f}% ({payload['target_source']}), seeds "
        f"{payload['seeds']}; best: {payload['best']}.\n"
    )
    return report_lib.markdown_table(header, rows) + notes


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    t0, load_start = time.time(), report_lib.load_average()
    try:
        args = parse_args(argv)
        sweep = Sweep(args)
        sweep.validate()
    except (config_utils.ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(sweep.workdir, exist_ok=True)
    with ex.compilation_cache(ex.cache_dir(args.compilation_cache, sweep.workdir)):
        payload = run_and_summarize(sweep)
    plot_to = lambda path: study_render.plot_cost_heatmap(payload, path)  # noqa: E731
    report_lib.write_report(
        sweep.workdir, "sweep", payload, table(payload), plot_to, argv, t0, load_start
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
