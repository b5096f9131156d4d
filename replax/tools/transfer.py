"""Transfer to real data: a run's greedy accuracy on the shortest questions of a GSM8K file."""

from __future__ import annotations

import json
import os
from typing import Any

from replax.config import spec as spec_lib
from replax.core import config_utils
from replax.tools import experiments


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
