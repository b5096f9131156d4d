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


def test_flag_definer_defines_into_the_scripts_own_flags():
    from absl import flags

    values = flags.FlagValues()
    define = experiments.flag_definer(values)
    define("integer", "seeds", 3, "Seeds.", lower_bound=1)
    define("list", "levels", [], "Levels.")
    values(["prog", "--seeds=2", "--levels=0.5,0.6"])
    assert (values.seeds, values.levels) == (2, ["0.5", "0.6"])
    assert "seeds" not in flags.FLAGS
