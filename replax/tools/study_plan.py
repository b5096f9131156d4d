"""A study of variants on an equal generation budget (scripts/compare.py): its flags, its
runs' configs, and running (or finding) the rate grid and the seeds.

`Plan` builds every run's config from the flags (config variants, --define, --override,
the budget, the rate grids) and validates them all before any compute; `locate` finds a
run that is finished (this study's own, or one --reuse holds, matched by settings:
run_store) or makes it. `run_all` runs each variant's grid on the selection seed, keeps
the best rate (lr_selection) and runs the other seeds at it; `commit_runs` keeps the
small files of every run used. The figures are study_report's; the tables and plots
study_render's.
"""

from __future__ import annotations

import math
import os

from replax.config import spec as spec_lib
from replax.core import config_utils
from replax.tools import analysis, lr_selection, run_store
from replax.tools import experiments as ex
from replax.tools import transfer as transfer_lib

# The variant whose median final accuracy is the target, and the one the headline
# ratios compare against it.
REFERENCE = "onpolicy"
CANDIDATE = "replay"


def define_flags(values) -> None:
    """compare.py's own flags (ex.parse_command_line adds --config, --workdir, --override
    and --compilation_cache)."""
    from absl import flags

    define = ex.flag_definer(values)
    define("integer", "seeds", 3, "Seeds per variant (the selection seed first).", lower_bound=1)
    define("integer", "select_seed", 0, "The seed the learning-rate grid runs on.")
    flags.DEFINE_enum(
        "select_by",
        "mean",
        ["final", "mean"],
        "Best rate by: final or mean accuracy.",
        flag_values=values,
    )
    define("string", "variants", "onpolicy,replay", "Variants to compare, comma-separated.")
    define("multi_string", "define", [], "NAME=BASE: a variant from a config variant.")
    define("string", "lr_grid", "", "VARIANT:LR,LR;VARIANT:LR (default: rate x 1/3, 1, 3).")
    define(
        "string",
        "mu_model",
        "6",
        "The mu of the cost model: a number, or tpu:CONFIG[:VARIANT]:TOPOLOGY for the modelled "
        "(roofline) mu of that config on that TPU slice (replax/tools/aot.py).",
    )
    define(
        "integer", "budget_rollouts", 0, "Generated rollouts per run (0: the on-policy config's)."
    )
    define("integer", "num_evals", 16, "Evaluations per run.", lower_bound=1)
    define("float", "target", None, "Target accuracy (default: the on-policy median).")
    define(
        "integer", "final_pass_k_prompts", 0, "Re-evaluate pass@k over N prompts.", lower_bound=0
    )
    define("list", "entropy_levels", [], "Accuracies for entropy_at_accuracy (default: 5 shared).")
    define("list", "paper_w_over_t", ["1", "3", "7"], "W/T ratios of the paper_table.")
    define(
        "bool",
        "extend_lr_grid",
        True,
        "Extend a grid of 2+ rates whose best is at its edge (--noextend_lr_grid: report only).",
    )
    define("float", "lr_extend_factor", 3.0, "The next rate down / up is lr / F, lr x F.")
    define("integer", "max_lr_extensions", 3, "Extensions per variant at most.", lower_bound=0)
    define("list", "reuse", [], "DIR,DIR: finished runs taken by their settings, not rerun.")
    define("bool", "assemble_only", False, "Run nothing: every run must be found (--reuse).")
    define("string", "commit_runs", "", "Copy each run's small files to DIR/RUN_NAME/.")
    define("string", "report", "", "Also write PREFIX.json, .md, .png, _entropy.png.")
    define("string", "transfer_gsm8k", "", "GSM8K test file: greedy accuracy on its shortest.")
    define("integer", "transfer_prompts", 64, "The transfer's shortest questions.", lower_bound=1)
    define("integer", "transfer_max_new_tokens", 128, "The transfer's completion length.")
    define("integer", "transfer_max_prompt_len", 256, "The transfer's prompt length.")


def parse_args(argv):
    return ex.parse_command_line("compare.py", argv, define_flags)


def parse_lr_grid(spec: str) -> dict[str, list[float]]:
    grids = {}
    for part in filter(None, (s.strip() for s in spec.split(";"))):
        name, sep, rates = part.partition(":")
        if not sep:
            raise config_utils.ConfigError(f"--lr_grid part {part!r}: expected VARIANT:LR,LR")
        grids[name.strip()] = [float(r) for r in rates.split(",") if r.strip()]
    return grids


class Plan:
    """Builds every run's config from the flags; validates them all before any compute."""

    def __init__(self, args):
        self.args = args
        self.workdir = os.path.abspath(args.workdir)
        self.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        self.path, self.arg = ex.config_file(args)
        known = ex.config_variants(self.path)
        self.base = {}
        for definition in args.define:
            name, sep, base = definition.partition("=")
            if not sep:
                raise config_utils.ConfigError(f"--define {definition!r}: expected NAME=BASE")
            self.base[name.strip()] = base.strip()
        for v in self.variants:
            self.base.setdefault(v, v)
            if known and self.base[v] not in known:
                raise config_utils.ConfigError(
                    f"variant {v!r}: not a variant of {self.path} {known}; "
                    f"define it with --define {v}=BASE"
                )
        self.overrides = ex.command_line_overrides(args)
        for scope, _, _ in self.overrides:
            if scope is not None and scope not in self.variants:
                raise config_utils.ConfigError(f"--override scope {scope!r} is not a variant")
        self.seeds = [args.select_seed] + [
            s for s in range(args.seeds + 1) if s != args.select_seed
        ][: args.seeds - 1]
        self.budget = args.budget_rollouts or self._default_budget()
        for root in args.reuse:  # the --commit_runs directory may not exist yet
            kept_here = args.commit_runs and os.path.abspath(root) == os.path.abspath(
                args.commit_runs
            )
            if not os.path.isdir(root) and not kept_here:
                raise config_utils.ConfigError(f"--reuse={root}: no such directory")
        # {fingerprint of a run's settings: its directory} of the runs --reuse offers.
        self.reusable = run_store.index(args.reuse)
        # Every design evaluates at the same rollout counts, multiples of each one's R:
        # the study's and the config's own, so that a study of some of them (or split
        # over processes) evaluates where one of all of them would.
        for v in known:
            self.base.setdefault(v, v)
        designs = dict.fromkeys([*self.variants, *known])
        rollouts = (ex.rollouts_per_step(self._overridden(v)) for v in designs)
        self.eval_quantum = math.lcm(*rollouts)
        grids = parse_lr_grid(args.lr_grid)
        self.lr_grid = {}
        for v in self.variants:
            lr = self._overridden(v).optimizer.learning_rate
            self.lr_grid[v] = grids.get(v) or [float(f"{lr * f:.1g}") for f in (1 / 3, 1, 3)]

    def _overridden(self, variant):
        config = ex.load_config(self.path, ex.variant_arg(self.arg, self.base[variant]))
        for scope, key, value in self.overrides:
            if scope in (None, variant):
                ex.set_value(config, key, value)
        return config

    def _default_budget(self) -> int:
        reference = REFERENCE if REFERENCE in self.variants else self.variants[0]
        config = self._overridden(reference)
        return config.total_steps * ex.rollouts_per_step(config)

    def config(self, variant: str, lr: float, seed: int):
        return ex.finalize_config(
            self._overridden(variant),
            budget_rollouts=self.budget,
            num_evals=self.args.num_evals,
            seed=seed,
            learning_rate=lr,
            shared_dir=self.workdir,
            explicit={key for scope, key, _ in self.overrides if scope in (None, variant)},
            eval_quantum=self.eval_quantum,
        )

    def spec(self, variant: str, lr: float, seed: int) -> spec_lib.RunSpec:
        """The run spec of one run (its config was checked by `validate`)."""
        return spec_lib.parse(self.config(variant, lr, seed))

    def run_dir(self, variant: str, lr: float, seed: int) -> str:
        return os.path.join(self.workdir, "runs", variant, f"lr{lr:g}", f"seed{seed}")

    def locate(self, variant: str, lr: float, seed: int, log=print) -> str:
        """The directory of a finished run of these settings: this study's own, or one
        --reuse holds (run_store: matched by settings, whatever its name or machine);
        otherwise the run is made in this study's directory (ConfigError with
        --assemble_only)."""
        spec = self.spec(variant, lr, seed)
        own = self.run_dir(variant, lr, seed)
        if analysis.is_finished(own, spec.total_steps, spec.total_rollouts):
            log(f"done already: {own}")
            return self.keep(variant, lr, seed, own)
        found = self.reusable.get(run_store.fingerprint(spec.to_dict()))
        if found and analysis.is_finished(found, spec.total_steps, spec.total_rollouts):
            log(f"reused: {found}")
            return self.keep(variant, lr, seed, found)
        if self.args.assemble_only:
            name = run_store.run_name(variant, lr, seed, spec.to_dict())
            raise config_utils.ConfigError(
                f"--assemble_only: no finished run {name} (variant {variant}, lr {lr:g}, "
                f"seed {seed}, these settings) in --reuse={','.join(self.args.reuse)}"
            )
        ex.ensure_run(spec, own, log=log)
        return self.keep(variant, lr, seed, own)

    def keep(self, variant: str, lr: float, seed: int, run_dir: str) -> str:
        """With --commit_runs, copies the run's small files there as soon as it is finished
        (a study cut short keeps what it made); returns run_dir."""
        if self.args.commit_runs:
            name = run_store.run_name(variant, lr, seed, self.spec(variant, lr, seed).to_dict())
            run_store.keep(run_dir, os.path.join(self.args.commit_runs, name))
        return run_dir

    def validate(self):
        from replax.config import build as configuration

        os.makedirs(os.path.join(self.workdir, "data"), exist_ok=True)
        if self.args.assemble_only:  # nothing is built: the model need not be on this machine
            return
        final_prompts = self.args.final_pass_k_prompts
        for v in self.variants:
            for lr in self.lr_grid[v]:
                config = self.config(v, lr, self.args.select_seed)
                try:
                    configuration.validate(config)
                    if final_prompts:  # the final re-evaluation's config, too
                        config.eval.pass_k_prompts = final_prompts
                        configuration.validate(config)
                except config_utils.ConfigError as e:
                    where = f" with --final_pass_k_prompts={final_prompts}" if final_prompts else ""
                    raise config_utils.ConfigError(f"variant {v}{where}: {e}") from None
        transfer_lib.Transfer(self).validate()


def run_all(plan: Plan, log=print, transfer: transfer_lib.Transfer | None = None):
    """Runs (or finds, with --reuse) the grid and the seeds, each run's transfer measured
    while its checkpoints are here (`Transfer`). Returns {variant: {lr_grid, lr, lr_edge,
    lr_added, runs: [(seed, dir)], kept: [(lr, seed, dir)], final_evals}}."""
    out = {}
    for v in plan.variants:
        chosen = lr_selection.select_lr(plan, v, log=log, transfer=transfer)
        lr = chosen["best"]["lr"]
        kept = [(rate, plan.args.select_seed, d) for rate, d in chosen["dirs"].items()]
        runs, finals = [], []
        for seed in plan.seeds:
            workdir = plan.locate(v, lr, seed, log=log)
            if seed != plan.args.select_seed:
                kept.append((lr, seed, workdir))
            runs.append((seed, workdir))
            if transfer:
                transfer.of_run(v, lr, seed, workdir)
            if plan.args.final_pass_k_prompts:
                n = plan.args.final_pass_k_prompts
                finals.append(ex.final_evaluation(plan.spec(v, lr, seed), workdir, n, log=log))
        out[v] = {
            "lr_grid": chosen["grid"],
            "lr": lr,
            "lr_edge": chosen["edge"],
            "lr_added": chosen["added"],
            "runs": runs,
            "kept": kept,
            "final_evals": finals,
        }
    return out


def commit_runs(plan: Plan, results, out_dir: str, log=print) -> list[str]:
    """--commit_runs: every run the study used (grid and seeds) copied into
    out_dir/RUN_NAME/ by run_store.keep (metrics, config, summary, cached evaluations):
    each was when it finished (Plan.keep), and is again for the evaluations cached since
    (the base's transfer figure is kept by Transfer). Returns the run names."""
    names = []
    for v, res in results.items():
        for lr, seed, d in res["kept"]:  # again: the evaluations cached since
            name = run_store.run_name(v, lr, seed, plan.spec(v, lr, seed).to_dict())
            run_store.keep(d, os.path.join(out_dir, name))
            names.append(name)
    log(f"kept {len(names)} runs in {out_dir}")
    return names
