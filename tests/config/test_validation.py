"""Tests for replax/config/validation.py: each rule across sections, on small numbers."""

import dataclasses
import os
import types

import numpy as np
import pytest

from replax.config import spec as spec_lib
from replax.config import validation
from replax.core.config_utils import ConfigError
from replax.tools import experiments

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# R = 2 x 4 = 8, B = 16, N = 32.
BASE = spec_lib.parse(experiments.load_config(os.path.join(ROOT, "configs", "arith.py")))
BASE = dataclasses.replace(
    BASE,
    rollout=dataclasses.replace(BASE.rollout, group_size=4),
    train=dataclasses.replace(BASE.train, batch_size=16),
    replay=dataclasses.replace(BASE.replay, capacity=32),
    eval=dataclasses.replace(BASE.eval, num_prompts=16, pass_k=2, pass_k_prompts=8),
)


def spec(**changes):
    """BASE with section fields changed ('rollout__group_size': 1), not yet checked: a
    stand-in with RunSpec's fields and properties, so one rule can be tried alone."""
    sections = {f.name: getattr(BASE, f.name) for f in dataclasses.fields(BASE)}
    for key, value in changes.items():
        name, field = key.split("__")
        sections[name] = types.SimpleNamespace(**{**vars(sections[name]), field: value})
    s = types.SimpleNamespace(**sections)
    s.rollouts_per_step = s.rollout.prompts_per_step * s.rollout.group_size
    s.seq_len = s.rollout.max_prompt_len + s.rollout.max_new_tokens
    s.sampler_mesh_shape = s.rollout.mesh_shape or s.mesh.shape
    pass_k_prompts = min(s.eval.pass_k_prompts, s.eval.num_prompts)
    s.eval = types.SimpleNamespace(**vars(s.eval), pass_k_rows=pass_k_prompts * s.eval.pass_k)
    return s


def fails(rule, *args, match):
    with pytest.raises(ConfigError, match=match) as error:
        rule(*args)
    assert "\n" not in str(error.value)


def test_the_base_passes_every_rule():
    validation.validate_spec(spec())
    validation.validate_microbatches(spec(), 8)
    validation.validate_data_shards(spec(), 8)
    validation.validate_rollout_batch(spec(), (8, 1, 1), 8, 1)


def test_validate_buffer_holds_batch_and_step():
    fails(
        validation.validate_buffer_holds_batch_and_step,
        spec(replay__capacity=8),
        match="than train.batch_size=16",
    )
    rule = validation.validate_buffer_holds_batch_and_step
    fails(rule, spec(rollout__group_size=20), match=r"2 x 20 = 40 fresh rollouts")
    rule(spec(replay__capacity=16))  # N = B = 16 >= R = 8


def test_validate_task_sizes():
    fails(
        validation.validate_task_sizes,
        spec(task__num_train=1),
        match=r"^rollout.prompts_per_step=2 is more than the 1 train examples of task.num_train=1",
    )
    fails(
        validation.validate_task_sizes,
        spec(task__num_test=8),
        match=r"set eval.num_prompts to 8 or less, or task.num_test to 16 or more$",
    )
    validation.validate_task_sizes(spec(task__num_train=0, task__num_test=0))  # all of a file


def test_validate_auto_mode():
    auto = dict(replay__mode="auto")
    fails(validation.validate_auto_mode, spec(**auto, train__batch_size=15), match="even")
    # B / R = 16 / 8 = 2: auto_max_y must be >= 2.
    fails(validation.validate_auto_mode, spec(**auto, replay__auto_max_y=1.0), match="B / R = 2")
    validation.validate_auto_mode(spec(**auto, replay__auto_max_y=2.0))
    validation.validate_auto_mode(spec(train__batch_size=15))  # fixed mode: any B


def test_validate_sequence_fits_model():
    rule = validation.validate_sequence_fits_model
    fails(rule, spec(rollout__max_new_tokens=23), match="= 33 exceeds model.max_len=32")
    rule(spec(rollout__max_new_tokens=22))


def test_validate_microbatches_with_loss_and_shards():
    rule = validation.validate_microbatches_with_loss
    fails(rule, spec(train__num_microbatches=2, loss__name="m2po"), match="m2po")
    rule(spec(loss__name="m2po"))
    # B = 16 over 2 microbatches: 8 rows each split over 8 shards, not over 16.
    validation.validate_microbatches(spec(train__num_microbatches=2), 8)
    fails(validation.validate_microbatches, spec(train__num_microbatches=2), 16, match="16 data")
    auto = spec(train__num_microbatches=2, replay__mode="auto")
    fails(validation.validate_microbatches, auto, 8, match="half of train.batch_size=8")


def test_a_batch_that_does_not_split_over_the_shards_names_train_batch_size():
    # B = 20 over 8 data shards: the batch is at fault, not the (default) 1 microbatch.
    fails(
        validation.validate_microbatches,
        spec(train__batch_size=20),
        8,
        match=r"^train.batch_size=20: it must split over the 8 data-parallel shards: use a "
        r"multiple of 8$",
    )
    fails(
        validation.validate_microbatches,
        spec(train__batch_size=20, replay__mode="auto"),
        8,
        match=r"^train.batch_size=20: half of it must split .* use a multiple of 16$",
    )


def test_disjoint_placement_on_one_device_says_it_needs_two():
    fails(
        validation.placement_devices,
        spec(rollout__placement="disjoint"),
        1,
        1,
        match=r"^rollout.placement='disjoint' needs at least 2 devices .* this machine has 1",
    )


def test_validate_data_shards_and_rollout_batch():
    fails(validation.validate_data_shards, spec(eval__pass_k_prompts=3), 8, match="=6 is not")
    fails(validation.validate_rollout_batch, spec(), (16, 1, 1), 16, 1, match="R = prompts")
    fails(validation.validate_rollout_batch, spec(), (8, 1, 1), 8, 4, match="4 processes")
    validation.validate_rollout_batch(spec(), (8, 1, 1), 8, 2)


def test_validate_heads_split_and_vocab():
    model = types.SimpleNamespace(num_heads=4, num_kv_heads=2, vocab_size=264)
    validation.validate_heads_split(spec(), model, (1, 1, 2), 2)
    rule = validation.validate_heads_split
    fails(rule, spec(), model, (1, 1, 4), 4, match="num_kv_heads=2 is not divisible by the 4")
    validation.validate_vocab(model, types.SimpleNamespace(vocab_size=264))
    fails(validation.validate_vocab, model, types.SimpleNamespace(vocab_size=300), match=">= 300")


def test_answers_fit_and_prompts_fit_by_the_bound():
    # arith's rollout: max_prompt_len 10, max_new_tokens 6; BOS and EOS take one each.
    validation.validate_answers_fit(spec(), 5)
    fails(validation.validate_answers_fit, spec(), 6, match="max_new_tokens=6")
    validation.validate_answers_fit(spec(tokenizer__name="hf"), 100)  # not by characters
    assert validation.prompts_fit_by_bound(spec(), 9)
    assert not validation.prompts_fit_by_bound(spec(), 10)
    assert not validation.prompts_fit_by_bound(spec(), None)  # the task knows no bound
    assert not validation.prompts_fit_by_bound(spec(tokenizer__name="hf"), 1)


PROMPTS = {
    "train": ["<sys> one two", "<sys> three four five six seven eight nine ten", "<sys> a"],
    "test": ["<sys> b", "<sys> c d"],
}


def test_long_prompts_error_names_the_longest_by_split_index_and_words():
    lengths = {"train": np.array([8, 14, 3]), "test": np.array([11, 4])}  # limit 10
    fails(
        validation.long_prompts,
        spec(),
        PROMPTS,
        lengths,
        # The shared "<sys> " is left out of the words shown.
        match=r"^rollout.max_prompt_len=10 is shorter than 2 of the task's 5 prompts: the "
        r"longest, train prompt 1 \('three four five six seven eight \.\.\.'\), is 14 tokens; "
        r"raise rollout.max_prompt_len or set task.long_prompts='skip' to leave them out$",
    )
    fits = {"train": np.array([8, 10, 3]), "test": np.array([1, 4])}
    assert validation.long_prompts(spec(), PROMPTS, fits) == {}


def test_long_prompts_skip_returns_them_and_keeps_enough():
    lengths = {"train": np.array([8, 14, 3]), "test": np.array([11, 4])}
    skip = spec(task__long_prompts="skip", rollout__prompts_per_step=2, eval__num_prompts=1)
    assert validation.long_prompts(skip, PROMPTS, lengths) == {"train": (1,), "test": (0,)}
    too_few = spec(task__long_prompts="skip", rollout__prompts_per_step=3, eval__num_prompts=1)
    fails(
        validation.long_prompts,
        too_few,
        PROMPTS,
        lengths,
        match=r"leaves 2 of 3 train prompts .*rollout.prompts_per_step=3 needs",
    )


def test_disjoint_placement_on_several_processes():
    # 2 processes of 4 devices: the sampler takes k of each, the trainer a multiple of k.
    disjoint = dict(rollout__placement="disjoint")
    assert validation.placement_devices(spec(**disjoint, rollout__num_devices=4), 8, 2) == (4, 2)
    assert validation.placement_devices(spec(**disjoint, rollout__num_devices=2), 8, 2) == (6, 1)
    for n in (3, 6):  # 3 does not split over 2 processes; 3 of 4 leaves the trainer 1
        fails(
            validation.placement_devices,
            spec(**disjoint, rollout__num_devices=n),
            8,
            2,
            match=rf"rollout.num_devices={n} on 2 processes of 4 devices.*allowed are \[2, 4\]",
        )
    # R = 8 rows: each of 2 processes decodes 4, over its sampler's data shards.
    validation.validate_rollout_batch(spec(**disjoint), (2, 1, 1), 2, 2)
    fails(
        validation.validate_rollout_batch,
        spec(**disjoint),
        (8, 1, 1),
        8,
        2,
        match="on each of 2 processes",
    )
