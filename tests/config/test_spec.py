"""Tests for replax/config/spec.py: the ConfigDict read once into frozen sections that check
themselves, and back to the same plain dict (the run's config.json)."""

import dataclasses
import importlib
import inspect
import json
import os
import pkgutil

import pytest

import replax.config as config_package
from replax.config import learning, sections
from replax.config import spec as spec_lib
from replax.core.config_utils import ConfigError
from replax.model import transformer as model_lib
from replax.replay import store as replay_lib
from replax.rl import objectives
from replax.rl import train_step as train_step_lib
from replax.sampling import distributions
from replax.tools import experiments

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def arith(variant="replay"):
    return experiments.load_config(os.path.join(ROOT, "configs", "arith.py"), variant)


@pytest.mark.parametrize("variant", ["replay", "onpolicy"])
def test_the_spec_is_the_config_and_writes_the_same_dict(variant):
    c = arith(variant)
    spec = spec_lib.parse(c)
    assert spec.rollout.group_size == c.rollout.group_size == 8
    assert spec.rollouts_per_step == c.rollout.prompts_per_step * 8
    assert spec.seq_len == 16 and spec.model.max_len == 32
    # The config.json a run writes, byte for byte as the ConfigDict's.
    dump = lambda d: json.dumps(d, sort_keys=True, default=list)  # noqa: E731
    assert dump(spec.to_dict()) == dump(c.to_dict())
    assert spec_lib.parse(json.loads(dump(spec.to_dict()))) == spec  # a config.json parses


def test_sections_are_frozen_and_check_themselves():
    spec = spec_lib.parse(arith())
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.rollout.group_size = 2
    with pytest.raises(ConfigError, match=r"^rollout.group_size=1: group advantages"):
        dataclasses.replace(spec.rollout, group_size=1)
    with pytest.raises(ConfigError, match=r"^loss.name='dpo': allowed are"):
        dataclasses.replace(spec.loss, name="dpo")
    assert dataclasses.replace(spec.log, print_every_s=0).print_every_s == 0  # every step
    with pytest.raises(ConfigError, match=r"^log.print_every_s=-1: must be a finite number >= 0"):
        dataclasses.replace(spec.log, print_every_s=-1)
    with pytest.raises(ConfigError, match=r"^eval.num_samples=-1: must be an integer >= 0"):
        dataclasses.replace(spec.eval, num_samples=-1)
    # A cross-section rule runs when the spec is made from its sections.
    small = dataclasses.replace(spec.replay, capacity=8)
    with pytest.raises(ConfigError, match="smaller than train.batch_size=32"):
        dataclasses.replace(spec, replay=small)


def test_library_arguments_come_from_the_sections():
    spec = spec_lib.parse(arith())
    assert isinstance(spec.loss, objectives.LossConfig) and spec.loss.dual_clip == 3.0
    assert spec.optimizer.total_steps == spec.total_steps == 1600  # the schedule's length
    assert dataclasses.replace(spec, total_steps=7).optimizer.total_steps == 7
    assert spec.replay.max_age == 0  # no limit
    assert spec.rollout.numerics() == {"dtype": None, "cache_dtype": None}
    assert spec.sampler_mesh_shape == (-1, 1, 1)  # empty rollout.mesh_shape: training's
    assert spec.model.config().d_model == 128
    assert spec.task.kwargs["max_digits"] == 3 and "num_train" not in spec.task.kwargs


def test_a_key_unknown_or_missing_is_one_line():
    c = arith().to_dict()
    c["train"]["batch_sise"] = 64
    with pytest.raises(
        ConfigError,
        match=r"^unknown config key train.batch_sise \(did you mean train.batch_size\?\): "
        r"train has",
    ):
        spec_lib.parse(c)
    c = arith().to_dict()
    del c["replay"]["mu"]
    with pytest.raises(ConfigError, match=r"^config key replay.mu is missing$"):
        spec_lib.parse(c)


def test_a_config_from_before_a_setting_existed_parses_under_its_old_value():
    c = arith().to_dict()
    del c["train"]["num_microbatches"], c["rollout"]["mesh_shape"], c["log"]
    del c["eval"]["num_samples"]
    spec = spec_lib.parse(c)
    assert spec.train.num_microbatches == 1 and spec.rollout.mesh_shape == ()
    assert spec.log.print_every_s == 60.0 and spec.eval.num_samples == 0


def test_auto_max_period():
    # y <= 8 with R = 16, B = 64 (y = 4 a generation): every 2nd step at most.
    assert spec_lib.auto_max_period(8.0, 16, 64) == 2
    assert spec_lib.auto_max_period(1.0, 16, 64) == 1  # at least every step


# The library's config types: a run's sections are these types, or inherit them and add
# only the run's own keys; none restates their fields.
LIBRARY_TYPES = (
    objectives.LossConfig,
    train_step_lib.OptimizerConfig,
    replay_lib.ReplayConfig,
    distributions.SamplingConfig,
    model_lib.ModelConfig,
    sections.WarmStartConfig,
)


def config_classes():
    """Every class defined in a module of replax/config."""
    for info in pkgutil.iter_modules(config_package.__path__, "replax.config."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                yield cls


def restated(cls, library) -> set[str]:
    """The fields of `library` that `cls` declares itself (not those it inherits)."""
    own = set(cls.__dict__.get("__annotations__", {}))
    return own & {f.name for f in dataclasses.fields(library)}


def test_no_config_class_restates_five_fields_of_a_library_config_type():
    classes = list(config_classes())
    assert learning.ReplaySection in classes and sections.WarmstartSection in classes
    for cls in classes:
        for library in LIBRARY_TYPES:
            if cls is not library:
                names = restated(cls, library)
                assert len(names) < 5, f"{cls.__name__} restates {library.__name__}'s {names}"
    # The check sees a section that writes the loss's fields again, and one that inherits
    # them adding its own keys passes.
    copy = dataclasses.make_dataclass(
        "Copy", [(f.name, f.type) for f in dataclasses.fields(objectives.LossConfig)[:5]]
    )
    assert len(restated(copy, objectives.LossConfig)) == 5
    assert restated(learning.ReplaySection, replay_lib.ReplayConfig) == set()
