"""Tests for replax/core/config_utils.py: variants, loading config files by path, the checks
that name the key, the one-line reading of flag errors, and the scripts' own flags
refused in one line."""

import os
import subprocess
import sys

import pytest

from replax.core.config_utils import (
    ConfigError,
    config_from_argv,
    default_workdir,
    did_you_mean,
    flag_error_line,
    flat_keys,
    load_module,
    load_sibling,
    number,
    one_of,
    parse_variant,
    positive,
)


def test_parse_variant():
    assert parse_variant(None, ("replay", "onpolicy"), "replay") == "replay"
    assert parse_variant("onpolicy", ("replay", "onpolicy"), "replay") == "onpolicy"
    with pytest.raises(ConfigError, match="config variant 'x': allowed are"):
        parse_variant("x", ("replay",), "replay")


def test_load_module_and_sibling(tmp_path):
    (tmp_path / "_common.py").write_text("VALUE = 7\n")
    (tmp_path / "run.py").write_text("X = 1\n")
    assert load_module(str(tmp_path / "_common.py")).VALUE == 7
    assert load_sibling(str(tmp_path / "run.py"), "_common.py").VALUE == 7


def test_checks_name_the_key_and_what_is_allowed():
    one_of("loss.name", "ppo", ("ppo", "grpo"))
    with pytest.raises(ConfigError, match=r"loss.name='x': allowed are \('ppo',\)"):
        one_of("loss.name", "x", ("ppo",))
    positive("a", 1)
    positive("a", 0, allow_zero=True)
    with pytest.raises(ConfigError, match="a=0: must be > 0"):
        positive("a", 0)
    with pytest.raises(ConfigError, match="a=-1: must be >= 0"):
        positive("a", -1, allow_zero=True)


@pytest.mark.parametrize(
    "value, kwargs, ok",
    [
        (0.5, dict(low=0, high=1), True),
        (0, dict(low=0, low_open=True), False),
        (1, dict(high=1, high_open=True), False),
        (2.0, dict(integer=True), True),
        (2.5, dict(integer=True), False),
        (True, {}, False),  # a bool is not a number here
        (float("nan"), {}, False),
        ("1", {}, False),
    ],
)
def test_number(value, kwargs, ok):
    if ok:
        number("k", value, **kwargs)
    else:
        with pytest.raises(ConfigError, match=r"^k="):
            number("k", value, **kwargs)


def test_number_message_states_the_bounds():
    with pytest.raises(ConfigError, match=r"k=3: must be an integer >= 0 and < 3"):
        number("k", 3, low=0, high=3, high_open=True, integer=True)


def test_flag_error_line():
    assert flag_error_line(KeyError("model.x")) == (
        "unknown config key 'model.x': the config file lists the keys it has"
    )
    assert flag_error_line(ValueError("ValueError: bad value\nmore")) == "bad value"
    assert flag_error_line(ValueError("plain line")) == "plain line"
    assert flag_error_line(ValueError("")) == "ValueError"


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARITH = os.path.join(ROOT, "configs", "arith.py")


def test_an_unknown_command_line_key_is_named_with_the_key_it_may_mean():
    config = {"rollout": {"group_size": 8, "prompts_per_step": 2}, "seed": 0}
    error = KeyError("'group_sise'")  # what ml_collections raises: the leaf alone
    argv = ["train.py", "--config.seed=1", "--config.rollout.group_sise=4"]
    assert flag_error_line(error, argv, config) == (
        "unknown config key rollout.group_sise (did you mean rollout.group_size?): the "
        "config file lists the keys it has"
    )
    # A misspelt section is matched against every key.
    assert "(did you mean rollout.group_size?)" in flag_error_line(
        AttributeError("'rolout'"), ["x", "--config.rolout.group_size=4"], config
    )
    assert flag_error_line(KeyError("'zzz'"), ["x", "--config.zzz=1"], config) == (
        "unknown config key zzz: the config file lists the keys it has"
    )
    assert did_you_mean("train.batch_sise", ["train.batch_size", "seed"]) == (
        " (did you mean train.batch_size?)"
    )
    # The config of --config=FILE[:ARG] (either spelling), as the file gives it.
    assert config_from_argv(["x", f"--config={ARITH}:onpolicy"], "nope").replay.capacity == 64
    assert config_from_argv(["x", "--config", ARITH], "nope").replay.capacity == 4096
    assert config_from_argv(["x"], "/no/such/config.py") is None


@pytest.mark.parametrize(
    "key, meant",
    [
        # The words first: `prompts` is a word of prompts_per_step (and `num` says how many,
        # as `per` does), max_prompt_len only shares its stem and is the closer spelling.
        ("rollout.num_prompts", "rollout.prompts_per_step"),
        ("rollout.prompt_per_step", "rollout.prompts_per_step"),
        # At equal words, the user's own section.
        ("train.prompts_per_step", "rollout.prompts_per_step"),
        # Then spelling: a misspelt word, a misspelt section.
        ("eval.num_promts", "eval.num_prompts"),
        ("rollout.group_sise", "rollout.group_size"),
        ("rolout.group_size", "rollout.group_size"),
        ("train.batch_sise", "train.batch_size"),
        ("model.d_modle", "model.d_model"),
        ("rollout.temprature", "rollout.temperature"),
        ("zzz", None),
    ],
)
def test_did_you_mean_ranks_by_the_keys_words_then_spelling(key, meant):
    known = flat_keys(load_module(ARITH).get_config(None))
    assert did_you_mean(key, known) == (f" (did you mean {meant}?)" if meant else "")


def test_default_workdir_is_runs_and_the_config_name():
    runs = os.path.join(ROOT, "runs")
    assert default_workdir(ARITH, ROOT) == os.path.join(runs, "arith")  # the main job's
    assert default_workdir(ARITH + ":replay", ROOT) == os.path.join(runs, "arith")  # the same
    assert default_workdir(ARITH + ":onpolicy", ROOT) == os.path.join(runs, "arith-onpolicy")
    gsm8k = os.path.join(ROOT, "configs", "gsm8k.py")
    assert default_workdir(gsm8k + ":qwen2.5-0.5b-instruct", ROOT) == os.path.join(
        runs, "gsm8k-qwen2.5-0.5b-instruct"
    )
    assert default_workdir(gsm8k + ":qwen3-0.6b,pod", ROOT) == os.path.join(
        runs, "gsm8k-qwen3-0.6b-pod"
    )


def test_flatten_gives_each_leaf_its_dotted_key():
    from replax.core import config_utils

    tree = {"seed": 0, "rollout": {"group_size": 8, "sampling": {"top_p": 0.9}}, "tags": [1]}
    assert config_utils.flatten(tree) == {
        "seed": 0,
        "rollout.group_size": 8,
        "rollout.sampling.top_p": 0.9,
        "tags": [1],
    }


@pytest.mark.parametrize(
    "script, flag, named",
    [
        ("bench_engine.py", "--cpu_matmul=mkl", "<eigen|ynnpack>"),
        ("device_mu.py", "--shape=huge", "--shape=huge"),
        ("export.py", "--nosuch=1", "'nosuch'"),
        ("bench.py", "--repeats=many", "--repeats=many"),
    ],
)
def test_a_bad_script_flag_is_one_line_and_exit_2(script, flag, named):
    """absl alone would print a usage hint as well and exit 1 (parse_flags_or_exit)."""
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", script), flag],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and named in lines[0]
