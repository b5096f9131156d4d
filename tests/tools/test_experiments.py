"""Tests for replax/tools/experiments.py: typing command-line values like the fields they
replace, dotted keys, overrides, variants and the compilation cache's directory."""

import ml_collections
import pytest

from replax.core.config_utils import ConfigError
from replax.tools import experiments


def config():
    return ml_collections.ConfigDict(
        {
            "seed": 0,
            "lr": 1e-4,
            "name": "ppo",
            "flag": False,
            "rollout": {"prompts_per_step": 4, "group_size": 8},
            "shape": (1, 2),
        }
    )


def test_parse_value_types_like_the_current_field():
    assert experiments.parse_value("true", False) is True
    assert experiments.parse_value("0", True) is False
    assert experiments.parse_value("3e2", 1) == 300  # an integral float is an int
    assert experiments.parse_value("2", 0.5) == 2.0
    assert experiments.parse_value("7", "x") == "7"
    assert experiments.parse_value("(1, 8)", (1, 2)) == (1, 8)
    assert experiments.parse_value("not python", None) == "not python"
    with pytest.raises(ConfigError, match="expected a bool"):
        experiments.parse_value("yes", False)
    with pytest.raises(ConfigError, match="expected an int"):
        experiments.parse_value("2.5", 1)


def test_set_value_on_dotted_keys():
    c = config()
    experiments.set_value(c, "rollout.group_size", "16")
    experiments.set_value(c, "lr", 1)  # an int where a float is: stored as a float
    experiments.set_value(c, "shape", "(2, 4)")
    assert c.rollout.group_size == 16 and isinstance(c.lr, float) and c.shape == (2, 4)
    assert experiments.rollouts_per_step(c) == 4 * 16
    with pytest.raises(ConfigError, match="unknown config key 'rollout.nope'$"):
        experiments.set_value(c, "rollout.nope", "1")
    with pytest.raises(
        ConfigError, match=r"'rollout.group_sise' \(did you mean rollout.group_size"
    ):
        experiments.set_value(c, "rollout.group_sise", "1")
    with pytest.raises(ConfigError, match=r"seed='2.5': expected an int"):
        experiments.set_value(c, "seed", "2.5")


def test_split_override_and_variant_arg():
    assert experiments.split_override("replay:loss.name=ppo") == ("replay", "loss.name", "ppo")
    assert experiments.split_override("seed=3") == (None, "seed", "3")
    assert experiments.split_override("a=b=c") == (None, "a", "b=c")
    with pytest.raises(ConfigError, match="expected"):
        experiments.split_override("seed")
    assert experiments.variant_arg("qwen3-0.6b,pod", "onpolicy") == "qwen3-0.6b,pod,onpolicy"
    assert experiments.variant_arg(None, None) is None


def test_cache_dir():
    assert experiments.cache_dir(None, "/w") == "/w/jax_cache"
    assert experiments.cache_dir("none", "/w") is None
    assert experiments.cache_dir("/c", "/w") == "/c"


def test_the_default_config_declares_its_variants():
    variants = experiments.config_variants(experiments.DEFAULT_CONFIG)
    assert {"replay", "onpolicy"} <= set(variants)
    assert experiments.file_config(experiments.DEFAULT_CONFIG + ":onpolicy").seed is not None


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
    short = experiments.shortest_questions(str(source), 3, str(tmp_path / "t" / "short.jsonl"))
    with open(short) as f:
        assert [json.loads(line)["answer"] for line in f] == ["#### 1", "#### 3", "#### 2"]
    with pytest.raises(ConfigError, match="fewer than 9"):
        experiments.shortest_questions(str(source), 9, str(tmp_path / "x.jsonl"))

    config = experiments.load_config(os.path.join(experiments.ROOT, "configs", "arith.py"))
    config.task.data_dir = str(tmp_path)
    spec = spec_lib.parse(config)
    transfer = experiments.transfer_spec(
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
