"""Transfer to real data: a run's greedy accuracy on the shortest questions of a GSM8K file.

The functions build and run one evaluation; `Transfer` is a study's (scripts/compare.py
--transfer_gsm8k): the base's figure and each run's, cached beside the run and kept.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from replax.config import spec as spec_lib
from replax.core import config_utils
from replax.tools import analysis, experiments, lr_selection
from replax.tools import report as report_lib


def shortest_questions(path: str, num: int, out_path: str) -> str:
    """Writes the `num` shortest questions (by characters; file order breaks ties) of a
    GSM8K file (JSONL, parquet or a saved dataset's test split) to out_path as JSONL."""
    from replax.tasks import math_data

    records = [r for _, r in math_data.read_records(path, "test")]
    if len(records) < num:
        raise config_utils.ConfigError(f"{path}: {len(records)} questions, fewer than {num}")
    chosen = sorted(records, key=lambda r: len(r["question"]))[:num]
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        for r in chosen:
            f.write(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n")
    return out_path


def transfer_spec(
    spec: spec_lib.RunSpec,
    data_file: str,
    *,
    num_prompts: int,
    max_prompt_len: int,
    max_new_tokens: int,
    data_dir: str,
) -> spec_lib.RunSpec:
    """The run's spec with configs/gsm8k.py's task on data_file (train and test alike: only
    its held-out evaluation runs) and a greedy-only evaluation of its num_prompts: the
    model, tokenizer and mesh stay the run's, so its checkpoint restores into it. Prompts
    through the chat template when the run's went through one, else the bare question."""
    config = spec.to_dict()
    task = experiments.load_config(experiments.GSM8K_CONFIG).task.to_dict()
    instruct = config["task"].get("prompt_format") == "instruct"
    task.update(
        data_path=data_file,
        test_path=data_file,
        data_dir=data_dir,
        num_shots=0,
        num_train=0,
        num_test=0,
        prompt_format="instruct" if instruct else "plain",
    )
    config["task"] = task
    config["rollout"].update(max_prompt_len=max_prompt_len, max_new_tokens=max_new_tokens)
    # max_len bounds the KV cache (rotary positions have no table), so it may grow.
    length = max_prompt_len + max_new_tokens
    config["model"]["max_len"] = max(config["model"].get("max_len", 0), length)
    config["eval"].update(num_prompts=num_prompts, pass_k=0, pass_k_prompts=0, num_samples=0)
    # It never warm-starts (the run's checkpoint or base is evaluated): no pool to size.
    config["warmstart"]["num_examples"] = 0
    return spec_lib.parse(config)


def transfer_evaluation(
    spec: spec_lib.RunSpec, transfer: spec_lib.RunSpec, workdir: str, *, base: bool = False
) -> dict[str, Any]:
    """Greedy accuracy on the transfer task (`transfer_spec`) of the run's last sealed
    checkpoint, or with base=True of the policy the run starts from (its warm start or
    model.checkpoint, built under the run's own spec and task)."""
    import jax

    from replax.run import assemble as run_lib  # imported late, as in experiments.ensure_run

    if not base:
        return experiments.evaluate_checkpoint(transfer, workdir, key=0)
    run = run_lib.build(spec, workdir)
    params = run_lib.initial_params(run, run_lib.prepare_data(run), log=lambda line: None)
    data = run_lib.prepare_data(run_lib.build(transfer, workdir))
    return {"step": 0, **experiments._evaluate(data, params, jax.random.key(0))}


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

    def __init__(self, plan, log=print):
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
            shortest_questions(args.transfer_gsm8k, self.n, self.data_file)
        data_dir = os.path.join(self.plan.workdir, "transfer", "data")
        os.makedirs(data_dir, exist_ok=True)
        return transfer_spec(
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
            return transfer_evaluation(spec, self._spec(spec), run_dir)

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
        if lr_selection.choose_lr(list(grid.values()), self.plan.args.select_by)["lr"] == lr:
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
            path, lambda: transfer_evaluation(spec, self._spec(spec), where, base=True)
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
