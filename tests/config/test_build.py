"""Tests for replax/config/build.py (parse and build): every bad setting is one
ConfigError line naming its key, raised before any compute; and the task section."""

import os

import pytest

from replax.config import build as configuration
from replax.config import spec as spec_lib
from replax.config import validation
from replax.core.config_utils import ConfigError
from replax.tools import experiments

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARITH = os.path.join(ROOT, "configs", "arith.py")

# R = 8, B = 16, N = 32: the 8 simulated devices divide every batch.
MICRO = {
    "rollout.prompts_per_step": 2,
    "rollout.group_size": 4,
    "train.batch_size": 16,
    "replay.capacity": 32,
    "eval.num_prompts": 16,
    "eval.pass_k": 2,
    "eval.pass_k_prompts": 8,
}


def config(variant="replay", **overrides):
    """configs/arith.py:VARIANT with --config.KEY=VALUE overrides, as scripts/train.py reads
    it (a task.name override keeps the task.* keys its factory can use)."""
    c = experiments.load_config(ARITH, variant)
    for key, value in {**MICRO, **overrides}.items():
        experiments.set_value(c, key.replace("__", "."), value)
    return configuration.fit_task_section(c, experiments.load_config(ARITH, variant))


def test_the_shipped_variants_are_valid():
    configuration.validate(config("replay"))
    configuration.validate(config("onpolicy", **{"replay.capacity": 8, "train.batch_size": 8}))


# (overrides of the micro config, the key its one-line error must name); the table of
# bad inputs in docs/bad_input.md is made from this list (scripts/bad_input_table.py).
BAD_SETTINGS = [
    ({"replay.capacity": 8}, "replay.capacity"),
    # The rollout engine: 8 rollouts a step, over the 8 data shards of the default mesh.
    ({"rollout.slots": 16}, "rollout.slots=16 exceeds the rollouts a step generates"),
    ({"rollout.slots": 4}, "rollout.slots=4 is not divisible by the 8 data shards"),
    ({"rollout.slots": 8, "rollout.refill_every": 200}, "rollout.refill_every=200 exceeds"),
    ({"rollout.slots": -1}, "rollout.slots=-1"),
    ({"rollout.slots": 8, "rollout.max_admit": 16}, "rollout.max_admit=16 exceeds rollout.slots"),
    ({"rollout.slots": 8, "rollout.max_admit": 4}, "rollout.max_admit=4 is not divisible by the 8"),
    # 8 slots over 8 data shards cannot halve: 4 slots would not split over them.
    ({"rollout.slots": 8, "rollout.drain_halvings": 1}, "rollout.drain_halvings=1: rollout.slots"),
    ({"rollout.drain_halvings": -1}, "rollout.drain_halvings=-1"),
    # The stream: disjoint placement through the engine, with room for a batch's lag.
    ({"rollout.stream": True}, "rollout.stream=True with rollout.placement='colocated'"),
    (
        {
            "rollout.stream": True,
            "rollout.placement": "disjoint",
            "rollout.slots": 4,
            "train.max_steps_per_generation": 2,
        },
        "rollout.max_policy_lag=1 with rollout.stream: allowed is >= 2",
    ),
    # R = 2 x 100,000 fresh rollouts a step into N = 32.
    ({"rollout.group_size": 100_000}, "rollout.prompts_per_step x rollout.group_size"),
    ({"rollout.group_size": 1}, "rollout.group_size"),
    ({"replay.strategy": "lifo"}, "replay.strategy"),
    ({"replay.sample_mode": "nearby"}, "sample_mode"),
    ({"replay.delta": 1.5}, "delta"),
    ({"loss.name": "dpo"}, "loss.name"),
    ({"loss.aggregation": "max"}, "loss.aggregation"),
    ({"model.dtype": "float8"}, "model.dtype"),
    ({"model.init": "pretrained"}, "model.init"),
    ({"model.num_kv_heads": 3}, "num_kv_heads"),
    ({"tokenizer.name": "sentencepiece"}, "tokenizer.name"),
    ({"mesh.shape": (3, 1, 1)}, "mesh"),
    ({"model.remat_policy": "dots"}, "model.remat_policy"),
    ({"model.attention": "flash"}, "model.attention"),
    ({"model.lora_rank": -1}, "model.lora_rank"),
    ({"model.lora_alpha": 0.0}, "model.lora_alpha"),
    ({"model.lora_targets": "q,x"}, "model.lora_targets"),
    # A TPU kernel on the CPU: refused before compiling, with what runs here.
    ({"model.attention": "splash"}, "model.attention"),
    ({"model.scan_layers": "yes"}, "model.scan_layers"),
    ({"train.num_microbatches": 3}, "train.num_microbatches"),
    ({"train.num_microbatches": 0}, "train.num_microbatches"),
    # B = 20 does not split over the 8 data shards: the batch size is at fault.
    ({"train.batch_size": 20}, "train.batch_size=20: it must split over the 8"),
    ({"train.num_microbatches": 2, "loss.name": "m2po"}, "train.num_microbatches"),
    ({"loss.positive_weight": 0.0}, "loss.positive_weight"),
    ({"loss.cov_cut_frac": 1.0}, "loss.cov_cut_frac"),
    ({"loss.clip_cov_ratio": 1.5}, "loss.clip_cov_ratio"),
    ({"loss.clip_cov_ratio": 2e-4, "loss.clip_cov_low": 5.0}, "loss.clip_cov_low"),
    ({"loss.kl_cov_frac": -0.1}, "loss.kl_cov_frac"),
    ({"loss.kl_cov_frac": 2e-3, "loss.kl_cov_coef": -1.0}, "loss.kl_cov_coef"),
    # Two answers to the same entropy collapse at once: one is allowed.
    ({"loss.cov_cut_frac": 0.2, "loss.clip_cov_ratio": 2e-4}, "loss.clip_cov_ratio"),
    # Auto mode splits each half of B = 16: 8 / 2 = 4 rows do not split over 8 shards.
    ({"train.num_microbatches": 2, "replay.mode": "auto"}, "half of train.batch_size"),
    ({"train.logits_chunk_size": -8}, "train.logits_chunk_size"),
    ({"optimizer.state_dtype": "int8"}, "optimizer.state_dtype"),
    ({"rollout.dtype": "float8"}, "rollout.dtype"),
    ({"rollout.cache_dtype": "int4"}, "rollout.cache_dtype"),
    ({"rollout.top_p_candidates": 0}, "rollout.top_p_candidates"),
    ({"rollout.mesh_shape": (3, 1, 1)}, "rollout.mesh_shape"),
    ({"rollout.mesh_shape": (1, 1, 8)}, "rollout.mesh_shape"),
    # Disjoint placement: the sampler's devices, its schedule, and its mesh on 4 devices.
    ({"rollout.placement": "split"}, "rollout.placement"),
    ({"rollout.placement": "disjoint", "rollout.num_devices": 8}, "rollout.num_devices"),
    ({"rollout.num_devices": 2}, "rollout.placement='disjoint'"),
    ({"rollout.placement": "disjoint", "rollout.max_policy_lag": -1}, "rollout.max_policy_lag"),
    ({"rollout.placement": "disjoint", "rollout.sync_every": 0}, "rollout.sync_every"),
    ({"train.max_steps_per_generation": 0}, "train.max_steps_per_generation"),
    ({"rollout.placement": "disjoint", "replay.mode": "auto"}, "replay.mode='fixed'"),
    ({"rollout.placement": "disjoint", "rollout.mesh_shape": (1, 1, 4)}, "rollout.mesh_shape"),
    # 3 prompts x pass_k 2 = 6 rows do not split over the 8 data shards.
    ({"eval.pass_k_prompts": 3}, "eval.pass_k_prompts"),
    ({"task.data_dir": "/nonexistent/replax"}, "task.data_dir"),
    ({"task.name": "sudoku"}, "task.name"),
    ({"task.name": "no_such_module:make"}, "task.name"),
    ({"task.name": "os.path:no_such_factory"}, "task.name"),
    ({"task.ops": "/"}, "ops"),
    # configs/arith.py's task section belongs to arith; tests/user_task.py takes `length`.
    ({"task.name": "user_task:make_task", "task.max_digits": 4}, "task.max_digits"),
    ({"train.batch_size": 0}, "train.batch_size"),
    ({"total_rollouts": -64}, "total_rollouts"),
    ({"checkpoint_every": 0}, "checkpoint_every"),
    ({"optimizer.schedule": "cyclic"}, "optimizer.schedule"),
    ({"optimizer.learning_rate": 0.0}, "optimizer.learning_rate"),
    ({"warmstart.min_accuracy": 0.5, "warmstart.max_accuracy": 0.4}, "min_accuracy"),
    ({"rollout.max_prompt_len": 4}, "rollout.max_prompt_len"),
    ({"task.long_prompts": "truncate"}, "task.long_prompts"),
    # Every prompt is longer than 4 tokens: skipping them leaves none to train on.
    ({"rollout.max_prompt_len": 4, "task.long_prompts": "skip"}, "task.long_prompts='skip'"),
    ({"rollout.max_new_tokens": 3}, "rollout.max_new_tokens"),
    ({"rollout.max_new_tokens": 30}, "model.max_len"),
    # B / R = 2 here: auto mode cannot plan a replay ratio below that.
    ({"replay.mode": "auto", "replay.auto_max_y": 1.0}, "replay.auto_max_y"),
    ({"replay.mode": "auto", "replay.auto_design": "magic"}, "replay.auto_design"),
    # Below 1 a rollout would be trained on less than once; above auto_max_y, no y is left.
    ({"replay.mode": "auto", "replay.auto_min_y": 0.5}, "replay.auto_min_y"),
    ({"replay.mode": "auto", "replay.auto_min_y": 9.0}, "replay.auto_min_y"),
    ({"replay.mode": "auto", "train.batch_size": 15}, "even"),
    # The on-policy batch: whole replay batches (microbatches of the same size), in the ring.
    ({"replay.mode": "auto", "replay.auto_onpolicy_batches": 0}, "replay.auto_onpolicy_batches"),
    ({"replay.mode": "auto", "replay.auto_onpolicy_batches": -1}, "replay.auto_onpolicy_batches"),
    ({"replay.mode": "auto", "replay.auto_onpolicy_batches": 3}, "replay.auto_onpolicy_batches"),
    ({"replay.mode": "sometimes"}, "replay.mode"),
    # Ranges that make training impossible or meaningless.
    ({"rollout.temperature": 0.0}, "rollout.temperature"),
    ({"rollout.temperature": -1.0}, "rollout.temperature"),
    ({"rollout.top_p": 0.0}, "rollout.top_p"),
    ({"rollout.top_k": -1}, "rollout.top_k"),
    ({"rollout.group_size": 1, "loss.normalize_std": False}, "rollout.group_size"),
    ({"optimizer.learning_rate": float("inf")}, "optimizer.learning_rate"),
    ({"optimizer.learning_rate": -1e-4}, "optimizer.learning_rate"),
    ({"optimizer.b1": 1.5}, "optimizer.b1"),
    ({"optimizer.b2": 1.0}, "optimizer.b2"),
    ({"optimizer.weight_decay": float("nan")}, "optimizer.weight_decay"),
    ({"optimizer.grad_clip": -1.0}, "optimizer.grad_clip"),
    ({"loss.epsilon_low": 1.0}, "loss.epsilon_low"),
    ({"loss.rho_max": 0.0}, "loss.rho_max"),
    ({"eval.pass_k_prompts": -1}, "eval.pass_k_prompts"),
    # 16 greedy prompts in blocks of 6; pass@2's 16 rows in blocks of 3 (not whole prompts).
    ({"eval.max_rows": 6}, "eval.max_rows=6: must divide eval.num_prompts=16"),
    ({"eval.max_rows": 3, "eval.num_prompts": 3}, "eval.max_rows=3: must be a multiple"),
    ({"log_every": 0}, "log_every"),
    ({"seed": -1}, "seed"),
    ({"replay.max_age": -2}, "replay.max_age"),
    ({"warmstart.learning_rate": 0.0}, "warmstart.learning_rate"),
    ({"warmstart.batch_size": 0}, "warmstart.batch_size"),
    ({"task.num_test": 8}, "task.num_test"),
    ({"task.num_train": 1}, "task.num_train"),
    ({"model.vocab_size": 100}, "model.vocab_size"),
]


@pytest.mark.parametrize("overrides, key", BAD_SETTINGS)
def test_bad_setting_is_one_line_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as error:
        configuration.validate(config(**overrides))
    message = str(error.value)
    assert "\n" not in message and key in message, message


def test_a_step_of_fresh_rollouts_must_fit_in_the_buffer():
    with pytest.raises(ConfigError) as error:
        configuration.validate(config(**{"rollout.group_size": 100_000}))
    assert str(error.value) == (
        "R = rollout.prompts_per_step x rollout.group_size = 2 x 100000 = 200000 fresh "
        "rollouts a step exceeds replay.capacity=32: the buffer must hold one step's rollouts "
        "(R <= replay.capacity)"
    )


def test_a_split_too_small_names_the_key_the_user_set_and_values_that_work():
    """The step's or the evaluation's prompts are named first, with the value of either key
    that fits, whichever of the two was set (configs/arith.py writes 2000 test examples)."""
    with pytest.raises(ConfigError) as error:
        configuration.validate(config(**{"eval.num_prompts": 5000}))
    assert str(error.value) == (
        "eval.num_prompts=5000 is more than the 2000 test examples of task.num_test=2000: "
        "set eval.num_prompts to 2000 or less, or task.num_test to 5000 or more"
    )
    with pytest.raises(ConfigError) as error:
        configuration.validate(config(**{"task.num_train": 1}))
    assert str(error.value) == (
        "rollout.prompts_per_step=2 is more than the 1 train examples of task.num_train=1: "
        "set rollout.prompts_per_step to 1 or less, or task.num_train to 2 or more"
    )


def test_task_keys_go_to_the_task_factory():
    c = config(**{"task.max_digits": 2, "task.min_digits": 1})
    task = configuration.validate(c).task
    assert task.difficulty.max_digits == 2 and task.difficulty.min_digits == 1
    assert "num_train" not in spec_lib.parse(c).task.kwargs


def test_a_task_name_override_drops_the_files_task_keys_left_as_the_file_set_them():
    c = config(**{"task.name": "user_task:make_task"})
    assert spec_lib.parse(c).task.kwargs == {}  # min_terms ... max_mul_operand: arith's
    assert c.task.num_train == 50_000  # the data keys stay
    assert repr(configuration.validate(c).task) == "ReverseTask(length=3)"


def test_a_changed_key_of_the_files_task_is_refused_in_one_line():
    with pytest.raises(ConfigError) as error:
        config(**{"task.name": "user_task:make_task", "task.min_digits": 2})
    assert str(error.value) == (
        "task.min_digits=2 belongs to the arith task, not to user_task:make_task (it takes: "
        "length); give your task its own task section, as tests/user_task_config.py does"
    )


def test_a_task_name_override_passes_the_keys_its_factory_takes():
    c = config(**{"task.name": "replax.tasks.arith:make_arith_task", "task.max_digits": 4})
    spec = spec_lib.parse(c)
    assert spec.task.kwargs["max_digits"] == 4
    task = configuration.make_task(
        spec.task, configuration.make_tokenizer(spec.tokenizer, spec.model)
    )
    assert task.difficulty.max_digits == 4


def test_rollouts_per_step_and_auto_max_period():
    c = config(**{"replay.mode": "auto", "replay.auto_max_y": 8.0})
    assert spec_lib.parse(c).rollouts_per_step == 8
    # B = 16, R = 8: y = 2 per generation; y <= 8 allows generating every 4th step.
    assert spec_lib.parse(c).auto_max_period == 4


def test_a_prompt_longer_than_max_prompt_len_is_named_before_anything_is_written(tmp_path):
    """Prompts are measured as the run feeds them (chat template, instruction, tokenizer)
    over the whole data set, before any data build, warm start or model load."""
    import long_prompts

    from replax.run import trainer

    c = long_prompts.get_config(long_prompts.write(str(tmp_path)))
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        trainer.train(spec_lib.parse(c), str(workdir))
    assert str(error.value) == (
        "rollout.max_prompt_len=16 is shorter than 1 of the task's 17 prompts: the longest, "
        "train prompt 4 ('a farmer has many many many ...'), is 37 tokens; raise "
        "rollout.max_prompt_len or set task.long_prompts='skip' to leave them out"
    )
    assert not workdir.exists()
    c.rollout.max_prompt_len, c.model.max_len = 37, 48  # the longest fits: nothing to say
    assert configuration.validate(c).skipped_prompts == {}


def test_engine_slots_past_the_devices_memory_are_refused_with_what_fits():
    """The cache of rollout.slots rows against what an accelerator reports: the arith
    model's cache of one slot is 2 x layers x kv heads x (P - 1 + N) x head_dim x 4 bytes."""
    spec = spec_lib.parse(config(**{"rollout.slots": 8}))
    mcfg = configuration.model_config(spec.model)
    per_slot = 2 * mcfg.num_layers * mcfg.num_kv_heads * (10 - 1 + 6) * mcfg.head_dim * 4
    # 8 slots over 8 data shards: one row a device; on one device all 8.
    assert validation.engine_cache_bytes(spec, mcfg, (8, 1, 1), 8) == per_slot
    assert validation.engine_cache_bytes(spec, mcfg, (1, 1, 1), 1) == 8 * per_slot
    validation.validate_engine_cache(spec, mcfg, (1, 1, 1), 1, bytes_limit=8 * per_slot)
    validation.validate_engine_cache(spec, mcfg, (1, 1, 1), 1, bytes_limit=None)
    with pytest.raises(ConfigError) as error:
        validation.validate_engine_cache(spec, mcfg, (1, 1, 1), 1, bytes_limit=8 * per_slot - 1)
    assert str(error.value).startswith("rollout.slots=8: its KV cache needs")
    assert "allowed are at most 7 slots" in str(error.value)


def test_split_sizes_of_a_file_name_the_key_and_a_value_that_fits():
    check, source = configuration.check_split_sizes, "task.data_path='my.jsonl'"
    spec = spec_lib.parse(config(**{"eval.num_prompts": 64, "warmstart.num_examples": 0}))
    # 30 held-out records over 8 data shards: 24 of them can be evaluated.
    with pytest.raises(ConfigError) as error:
        check(spec, {"train": 270, "test": 30}, 8, source)
    assert str(error.value) == (
        "eval.num_prompts=64 is more than the 30 held-out examples of task.data_path="
        "'my.jsonl': set eval.num_prompts=24 (or less, a multiple of the 8 data shards)"
    )
    with pytest.raises(ConfigError, match="8 data shards need at least 8: give the task more"):
        check(spec, {"test": 5}, 8, source)
    check(spec, {"train": 270, "test": 64}, 8, source)
    check(spec, {"train": 270}, 8, source)  # a test split given by count is not measured
    pool = spec_lib.parse(config(**{"warmstart.num_examples": 20_000}))
    with pytest.raises(ConfigError) as error:
        check(pool, {"train": 270}, 8, source)
    assert str(error.value).endswith("set warmstart.num_examples to 270 or less (0: all of them)")
    check(spec_lib.parse(config(**{"model.init": "random"})), {"train": 270}, 8, source)
    with pytest.raises(ConfigError, match="set rollout.prompts_per_step to 1 or less"):
        check(spec, {"train": 1}, 8, source)


def test_the_jsonl_config_checks_its_sizes_against_the_file(tmp_path):
    data = tmp_path / "my_data.jsonl"
    data.write_text("".join(f'{{"prompt": "{i}+{i}=", "answer": "{2 * i}"}}\n' for i in range(300)))
    c = experiments.load_config(os.path.join(ROOT, "configs", "jsonl.py"))
    experiments.set_value(c, "task.data_path", str(data))
    built = configuration.validate(c)  # the file's defaults fit a few hundred records
    test = len(built.task.examples("test", 0))
    experiments.set_value(c, "eval.num_prompts", 64)
    with pytest.raises(ConfigError) as error:
        configuration.validate(c)
    assert str(error.value).startswith(
        f"eval.num_prompts=64 is more than the {test} held-out examples of task.data_path="
        f"{str(data)!r}: set eval.num_prompts={test // 8 * 8} "
    )
