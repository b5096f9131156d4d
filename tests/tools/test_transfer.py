"""Tests for replax/tools/transfer.py: the shortest GSM8K questions and the transfer's spec."""

import pytest

from replax.core.config_utils import ConfigError
from replax.tools import experiments
from replax.tools import transfer as transfer_lib


def test_transfer_spec_keeps_the_model_and_swaps_the_task(tmp_path):
    """The transfer's spec: the run's model, tokenizer and optimizer; GSM8K's task on the
    shortest questions; a greedy-only evaluation; max_len grown to the longer sequences."""
    import json
    import os

    from replax.config import spec as spec_lib

    source = tmp_path / "test.jsonl"
    lengths = [30, 10, 20, 10, 40]  # two of 10: file order keeps the first first
    with open(source, "w") as f:
        for i, n in enumerate(lengths):
            f.write(json.dumps({"question": f"{i}" + "?" * (n - 1), "answer": f"#### {i}"}) + "\n")
    short = transfer_lib.shortest_questions(str(source), 3, str(tmp_path / "t" / "short.jsonl"))
    with open(short) as f:
        assert [json.loads(line)["answer"] for line in f] == ["#### 1", "#### 3", "#### 2"]
    with pytest.raises(ConfigError, match="fewer than 9"):
        transfer_lib.shortest_questions(str(source), 9, str(tmp_path / "x.jsonl"))

    config = experiments.load_config(os.path.join(experiments.ROOT, "configs", "arith.py"))
    config.task.data_dir = str(tmp_path)
    spec = spec_lib.parse(config)
    transfer = transfer_lib.transfer_spec(
        spec, short, num_prompts=3, max_prompt_len=64, max_new_tokens=16, data_dir=str(tmp_path)
    )
    assert transfer.task.name == "gsm8k"
    kwargs = transfer.task.to_dict()
    assert kwargs["test_path"] == kwargs["data_path"] == short
    assert kwargs["prompt_format"] == "plain"  # arith's byte tokenizer has no chat template
    assert (transfer.eval.num_prompts, transfer.eval.pass_k) == (3, 0)
    assert transfer.to_dict()["model"]["max_len"] == 80 > spec.to_dict()["model"]["max_len"]
    for section in ("tokenizer", "optimizer", "mesh", "loss"):
        assert transfer.to_dict()[section] == spec.to_dict()[section], section
    # It evaluates, never warm-starts: the build step's size checks hold on the 3 questions.
    from replax.config import build as configuration

    assert transfer.warmstart.num_examples == 0
    configuration.check_split_sizes(transfer, {"train": 3, "test": 3}, 1, str(short))
