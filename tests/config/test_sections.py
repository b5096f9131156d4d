"""Tests for replax/config/sections.py: each section built from the keys of a config
file's section holds them typed, gives the library's arguments, and refuses a bad value
with one line that names the key and what is allowed (the allowed values read from the
module's constants, so the tests follow the code)."""

import dataclasses
import os

import pytest
from conftest import TINY

from replax.config import learning, sections
from replax.config import spec as spec_lib
from replax.core import sharding
from replax.core.config_utils import ConfigError
from replax.model import transformer as model_lib
from replax.replay import designs
from replax.replay import store as replay_lib
from replax.rl import objectives
from replax.rl import train_step as train_step_lib
from replax.sampling import distributions
from replax.sampling import sampler as sampler_lib
from replax.tools import experiments

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = experiments.load_config(os.path.join(ROOT, "configs", "arith.py"), "replay")

CLASSES = {
    "model": sections.ModelSection,
    "tokenizer": sections.TokenizerSection,
    "mesh": sections.MeshSection,
    "task": sections.TaskSection,
    "warmstart": sections.WarmstartSection,
    "rollout": learning.RolloutSection,
    "train": learning.TrainSection,
    "optimizer": train_step_lib.OptimizerConfig,
    "replay": learning.ReplaySection,
    "loss": objectives.LossConfig,
    "eval": learning.EvalSection,
    "log": sections.LogSection,
}


def keys(name, /, **changes):
    """The config file's keys of section `name` (a plain dict), with changes."""
    return {**CONFIG[name].to_dict(), **changes}


def build(name, /, **changes):
    """Section `name` from its config keys; model.* and task.* hold the keys that are not
    their own fields in one mapping (the architecture, the task factory's arguments)."""
    values = keys(name, **changes)
    if name == "model":
        run = {k: values.pop(k) for k in sections.MODEL_RUN_KEYS}
        return sections.ModelSection(**run, architecture=values)
    if name == "task":
        data = {k: values.pop(k) for k in sections.TASK_DATA_KEYS}
        return sections.TaskSection(**data, kwargs=values)
    return CLASSES[name](**values)


def raises_one_line(name, /, **changes):
    """The ConfigError message of building section `name` with changes: one line."""
    with pytest.raises(ConfigError) as error:
        build(name, **changes)
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name", sorted(set(CLASSES) - {"model", "task"}))
def test_a_section_holds_its_config_keys(name):
    section = build(name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(section, dataclasses.fields(section)[0].name, None)
    expected = keys(name)
    assert set(spec_lib.config_keys(name)) == set(expected)
    for key, value in expected.items():
        got = getattr(section, key)
        if isinstance(value, list):  # a config.json's lists are held as tuples
            assert isinstance(got, tuple)
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        if name == "mesh" and key == "rules":
            value = tuple(
                (axis, tuple(m) if isinstance(m, tuple | list) else m) for axis, m in value
            )
        assert got == value, key


def test_mesh_rules_from_lists_are_tuples_all_the_way_down():
    mesh = build("mesh", shape=[2, 2, 2], rules=[["batch", ["data", "fsdp"]], ["vocab", None]])
    assert mesh.shape == (2, 2, 2)
    assert mesh.rules == (("batch", ("data", "fsdp")), ("vocab", None))
    hash(mesh)  # frozen and hashable: a spec can key a cache


def test_model_and_task_split_their_own_keys_from_the_rest():
    model = build("model")
    architecture = {k: v for k, v in keys("model").items() if k not in sections.MODEL_RUN_KEYS}
    assert (model.init, model.checkpoint) == ("warmstart", "")
    assert dict(model.architecture) == architecture and model.max_len == architecture["max_len"]
    config = model.config()
    assert isinstance(config, model_lib.ModelConfig)
    # lora_targets is written as a comma-separated string, held as a tuple.
    targets = architecture.pop("lora_targets")
    assert set(config.lora_targets) == set(targets.split(",")) and config.lora_targets
    assert all(getattr(config, k) == v for k, v in architecture.items())
    architecture["lora_targets"] = targets
    assert model.checkpoint_overrides() == {
        k: architecture[k] for k in sections.CHECKPOINT_OVERRIDES if k in architecture
    }
    task = build("task")
    assert task.name == "arith" and task.num_train == keys("task")["num_train"]
    assert set(task.kwargs) == set(keys("task")) - set(sections.TASK_DATA_KEYS)
    assert task.to_dict() == keys("task")


def test_library_arguments_from_the_sections():
    rollout = build("rollout", prompts_per_step=3, group_size=4, dtype="", cache_dtype="bfloat16")
    assert rollout.rollouts == 12
    assert rollout.numerics() == {"dtype": None, "cache_dtype": "bfloat16"}  # '': the model's
    # The rollout section is a SamplingConfig: the sampler takes it as it is, and keeps
    # the distribution's fields alone.
    rollout = build("rollout", temperature=0.7, top_k=5, top_p=0.9)
    assert isinstance(rollout, distributions.SamplingConfig)
    sampler = sampler_lib.make_sampler(
        TINY, rollout, max_prompt_len=4, max_new_tokens=4, stop_ids=(1,), pad_id=0
    )
    kept = dict(temperature=0.7, top_k=5, top_p=0.9, top_p_candidates=rollout.top_p_candidates)
    assert sampler.sampling == distributions.SamplingConfig(**kept)

    # The replay section is a ReplayConfig: the store takes it as it is.
    replay = build("replay", max_age=0, max_reuse=3, capacity=8)
    assert isinstance(replay, replay_lib.ReplayConfig)
    buffer = replay_lib.make_replay_buffer(replay, 2)
    assert (buffer.capacity, buffer.num_shards, buffer.shard_capacity) == (8, 2, 4)
    assert (buffer.max_age, buffer.max_reuse) == (0, 3)  # 0: no limit
    assert buffer.bias_size == 8  # positive_bias_size is no config key: 0, the capacity

    # The loss section is the library's LossConfig itself: the loss takes it as it is.
    loss = build("loss", dual_clip=0.0, asymre_delta_v=-0.3, name="asymre")
    assert isinstance(loss, objectives.LossConfig)
    assert loss.dual_clip == 0.0 and loss.asymre_delta_v == -0.3 and loss.name == "asymre"

    optimizer = build("optimizer", total_steps=77)
    assert isinstance(optimizer, train_step_lib.OptimizerConfig) and optimizer.total_steps == 77
    assert optimizer.learning_rate == keys("optimizer")["learning_rate"]
    # Not keys of the section: the run's total_steps, and Adam's eps at its default.
    fields = {f.name for f in dataclasses.fields(optimizer)}
    assert fields - set(keys("optimizer")) == {"total_steps", "eps"}
    assert optimizer.eps == train_step_lib.OptimizerConfig().eps

    warmstart = build("warmstart", cache_dir="/somewhere").config()
    assert isinstance(warmstart, sections.WarmStartConfig)
    expected = {k: v for k, v in keys("warmstart").items() if k != "cache_dir"}
    assert dataclasses.asdict(warmstart) == expected


# One-of keys: every allowed value (from the module's constants) is taken, any other is
# refused with a message that names the key and lists what is allowed.
ONE_OF = [
    ("tokenizer", "name", sections.TOKENIZERS, {}),
    ("task", "long_prompts", sections.LONG_PROMPTS, {}),
    ("rollout", "placement", sections.PLACEMENTS, {}),
    ("rollout", "dtype", tuple(model_lib.DTYPES), {}),
    ("rollout", "cache_dtype", tuple(model_lib.DTYPES), {}),
    ("model", "dtype", tuple(model_lib.DTYPES), {}),
    ("model", "param_dtype", tuple(model_lib.DTYPES), {}),
    ("optimizer", "schedule", train_step_lib.SCHEDULES, {}),
    ("optimizer", "state_dtype", train_step_lib.STATE_DTYPES, {}),
    ("replay", "mode", sections.REPLAY_MODES, {}),
    ("replay", "strategy", replay_lib.STRATEGIES, {}),
    ("replay", "sample_mode", replay_lib.SAMPLE_MODES, {}),
    ("replay", "auto_design", tuple(designs.DESIGNS), {"mode": "auto"}),
    ("loss", "aggregation", objectives.AGGREGATIONS, {}),
    ("log", "wandb_mode", ("offline", "online"), {}),
]


@pytest.mark.parametrize(
    "name, key, allowed, context", ONE_OF, ids=[f"{n}.{k}" for n, k, _, _ in ONE_OF]
)
def test_a_key_of_a_few_values_takes_each_and_names_them_when_refused(name, key, allowed, context):
    for value in allowed:
        section = build(name, **context, **{key: value})
        held = section.architecture if name == "model" else vars(section)
        assert held[key] == value
    message = raises_one_line(name, **context, **{key: "bogus"})
    assert message.startswith(f"{name}.{key}='bogus'")
    assert str(tuple(allowed)) in message


def test_loss_names_and_model_inits_are_the_modules_constants():
    for loss in objectives.LOSSES:
        assert build("loss", name=loss).name == loss
    assert str(objectives.LOSSES) in raises_one_line("loss", name="dpo")
    assert str(sections.INITS) in raises_one_line("model", init="pretrained")
    assert build("model", init="random").init == "random"
    # auto_design is checked only where it is used, in auto mode.
    assert build("replay", mode="fixed", auto_design="bogus").auto_design == "bogus"


# Numeric keys: (section, key, a value just inside, one just outside, the bound stated).
BOUNDS = [
    ("rollout", "group_size", 2, 1, "group advantages"),
    ("rollout", "temperature", 1e-3, 0.0, "must be > 0"),
    ("rollout", "top_p", 1.0, 1.01, "<= 1"),
    ("rollout", "top_p", 0.01, 0.0, "> 0"),
    ("rollout", "top_k", 0, -1, "an integer >= 0"),
    ("rollout", "top_k", 3, 2.5, "an integer >= 0"),
    ("rollout", "top_p_candidates", 1, 0, "an integer >= 1"),
    ("rollout", "max_new_tokens", 1, 0, "> 0"),
    ("rollout", "sync_every", 1, 0, "an integer >= 1"),
    ("rollout", "max_policy_lag", 0, -1, "an integer >= 0"),
    ("rollout", "num_devices", 0, -1, "an integer >= 0"),
    ("train", "batch_size", 1, 0, "> 0"),
    ("train", "num_microbatches", 1, 0, "an integer >= 1"),
    ("train", "logits_chunk_size", 0, -1, "an integer >= 0"),
    ("train", "max_steps_per_generation", 1, 0, "an integer >= 1"),
    ("optimizer", "learning_rate", 1e-9, 0.0, "> 0"),
    ("optimizer", "b1", 0.0, 1.0, ">= 0 and < 1"),
    ("optimizer", "b2", 0.999, 1.0, ">= 0 and < 1"),
    ("optimizer", "weight_decay", 0.0, -0.1, ">= 0"),
    ("optimizer", "grad_clip", 0.0, -1.0, ">= 0"),
    ("optimizer", "warmup_steps", 0, 1.5, "an integer >= 0"),
    ("replay", "capacity", 1, 0, "> 0"),
    ("rollout", "slots", 0, -1, "an integer >= 0"),
    ("rollout", "refill_every", 1, 0, "an integer >= 1"),
    ("rollout", "max_admit", 0, -1, "an integer >= 0"),
    ("rollout", "drain_halvings", 0, -1, "an integer >= 0"),
    ("replay", "delta", 1.0, 1.5, ">= 0 and <= 1"),
    ("replay", "delta", 0.0, -0.1, ">= 0 and <= 1"),
    ("replay", "max_age", 0, -1, "an integer >= 0"),
    ("replay", "max_reuse", 2, 0.5, "an integer >= 0"),
    ("replay", "mu", 0.0, -1.0, ">= 0"),
    ("loss", "epsilon_low", 0.99, 1.0, ">= 0 and < 1"),
    ("loss", "epsilon_high", 0.0, -0.1, ">= 0"),
    ("loss", "rho_max", 0.01, 0.0, "> 0"),
    ("loss", "kl_coef", 0.0, -0.5, ">= 0"),
    ("loss", "entropy_coef", -0.01, float("nan"), "a finite number"),
    ("loss", "positive_weight", 0.5, 0.0, "> 0"),
    ("loss", "cov_cut_frac", 0.0, 1.0, ">= 0 and < 1"),
    ("eval", "every", 0, -1, ">= 0"),
    ("eval", "num_prompts", 1, 0, "> 0"),
    ("eval", "pass_k", 0, -1, "an integer >= 0"),
    ("eval", "max_rows", 0, 1.5, "an integer >= 0"),
    ("warmstart", "learning_rate", 1e-6, 0.0, "> 0"),
    ("warmstart", "batch_size", 1, 0, "an integer >= 1"),
    ("warmstart", "eval_every", 1, 0, "an integer >= 1"),
    ("task", "num_train", 0, -1, "an integer >= 0"),
    ("task", "num_test", 5, 2.5, "an integer >= 0"),
    ("log", "print_every_s", 0.0, -1.0, ">= 0"),
]


@pytest.mark.parametrize(
    "name, key, inside, outside, bound",
    BOUNDS,
    ids=[f"{n}.{k}={o}" for n, k, _, o, _ in BOUNDS],
)
def test_a_number_just_inside_its_range_is_taken_and_just_outside_is_named(
    name, key, inside, outside, bound
):
    assert getattr(build(name, **{key: inside}), key) == inside
    message = raises_one_line(name, **{key: outside})
    assert message.startswith(f"{name}.{key}={outside!r}"), message
    assert bound in message, message


def test_warmstart_pool_of_zero_is_the_train_split_and_old_bases_keep_their_key():
    assert build("warmstart", num_examples=0).config(num_train=500).num_examples == 500
    assert build("warmstart", num_examples=0).config().num_examples == 0  # a file: all
    assert build("warmstart", num_examples=300).config(num_train=500).num_examples == 300
    # configs/arith.py's 20,000 is what every base drew from before the key: its cache
    # key is the one it had then.
    before = {k: v for k, v in keys("warmstart").items() if k not in ("cache_dir", "num_examples")}
    assert build("warmstart").cache_fields() == before
    assert build("warmstart", num_examples=0).cache_fields() == {**before, "num_examples": 0}
    message = raises_one_line("warmstart", num_examples=-1)
    assert message.startswith("warmstart.num_examples=-1: must be an integer >= 0"), message


def test_warmstart_accuracies_are_ordered_within_zero_and_one():
    for low, high in ((0.0, 0.0), (0.2, 0.2), (0.1, 0.9), (0.0, 1.0), (1.0, 1.0)):
        config = sections.WarmStartConfig(min_accuracy=low, max_accuracy=high)
        assert (config.min_accuracy, config.max_accuracy) == (low, high)
        section = build("warmstart", min_accuracy=low, max_accuracy=high).config()
        assert (section.min_accuracy, section.max_accuracy) == (low, high)
    for low, high in ((0.5, 0.4), (-0.1, 0.3), (0.2, 1.1), (1.2, 1.5)):
        with pytest.raises(ValueError, match="min_accuracy .* <= max_accuracy") as error:
            sections.WarmStartConfig(min_accuracy=low, max_accuracy=high)
        assert f"({low})" in str(error.value) and f"({high})" in str(error.value)
        # Through the section: the same line, as a ConfigError.
        message = raises_one_line("warmstart", min_accuracy=low, max_accuracy=high)
        assert message == str(error.value)


def test_library_checks_come_back_as_one_line_config_errors():
    # dual_clip: 0 (off) or above 1, named with its full key.
    message = raises_one_line("loss", dual_clip=0.5)
    assert message.startswith("loss.dual_clip=0.5: allowed are 0 (off) or a bound c > 1")
    message = raises_one_line("mesh", rules=[["batch", "pipeline"]])
    assert "mesh.rules" in message and str(sharding.MESH_AXES) in message
    message = raises_one_line("mesh", rules=[["sequence", None]])
    assert "'sequence'" in message and str(sharding.LOGICAL_AXES) in message
    message = raises_one_line("model", num_heads=3)  # ModelConfig's own check
    assert message.startswith("model.")
    message = raises_one_line("model", d_modle=64)
    assert message.startswith("unknown config key model.d_modle (did you mean model.d_model?)")
    values = keys("model")
    del values["max_len"]
    with pytest.raises(ConfigError, match=r"^model.max_len is missing"):
        sections.ModelSection(init="random", checkpoint="", architecture=values)


def test_model_init_and_checkpoint_go_together(tmp_path):
    message = raises_one_line("model", init="checkpoint")
    assert "model.init='checkpoint'" in message and "model.checkpoint=''" in message
    message = raises_one_line("model", checkpoint=str(tmp_path))  # init stays 'warmstart'
    assert message.startswith("model.init='warmstart' with model.checkpoint=")
    missing = str(tmp_path / "nowhere")
    message = raises_one_line("model", init="checkpoint", checkpoint=missing)
    assert "no such directory" in message
    # ... and points to the page that builds the shipped real-model config's directory.
    page, anchor = message.split("docs/")[1].split()[0].split("#")
    with open(os.path.join(ROOT, "docs", page)) as f:
        headings = f.read().splitlines()
    assert f"## {anchor.replace('-', ' ')}" in [h.lower() for h in headings]
    gguf = tmp_path / "model.bin"
    gguf.write_bytes(b"GGUF" + bytes(12))  # a GGUF file by its magic bytes, whatever its name
    assert "is a GGUF file" in raises_one_line("model", init="checkpoint", checkpoint=str(gguf))
    # With a checkpoint the architecture comes from its config.json: model.* keys that are
    # not ModelConfig's are not checked here.
    model = build("model", init="checkpoint", checkpoint=str(tmp_path), num_heads=3)
    assert model.checkpoint == str(tmp_path)
    assert model.checkpoint_overrides()["max_len"] == keys("model")["max_len"]


def test_paths_must_exist(tmp_path):
    assert raises_one_line("tokenizer", path=str(tmp_path / "nope.json")).startswith(
        "tokenizer.path="
    )
    assert build("tokenizer", name="hf", path=str(tmp_path)).path == str(tmp_path)
    assert raises_one_line("task", data_dir=str(tmp_path / "nope")).startswith("task.data_dir=")
    assert build("task", data_dir=str(tmp_path)).data_dir == str(tmp_path)


def test_log_wandb_is_a_bool():
    assert build("log", wandb=False).wandb is False
    message = raises_one_line("log", wandb="yes")
    assert message == "log.wandb='yes': allowed are (False, True)"
