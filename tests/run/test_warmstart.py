"""Tests for replax/run/warmstart.py: the stage stops inside [min_accuracy, max_accuracy], an
interval that overshoots the window is rolled back to the last parameters below it and
retried at half the learning rate, and a finished warm start is reused from its cache.

The held-out accuracy comes from a scripted evaluator, so every branch is taken on
purpose, and the evaluator keeps the parameters it was shown. The task hands out one
arithmetic example over and over, so every SFT batch is the same and the retried steps
can be recomputed from the rolled-back parameters, whatever order warm_start draws its
examples in. One device: compilation, not arithmetic, is what these tests wait for."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from replax.core import sharding
from replax.model import transformer as model_lib
from replax.rl import train_step as train_step_lib
from replax.run import runtime, warmstart
from replax.tasks import Task
from replax.tasks.arith import EASY, ArithTask
from replax.text.tokenizer import ByteTokenizer

TOKENIZER = ByteTokenizer()
CONFIG = model_lib.ModelConfig(
    vocab_size=TOKENIZER.vocab_size,
    num_layers=1,
    d_model=16,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    mlp_dim=32,
    max_len=16,
)
MODEL = model_lib.Transformer(CONFIG)
RULES = sharding.validate_rules(sharding.DEFAULT_RULES)
SEED = 0
# "78-6=" -> "72": 6 prompt tokens with BOS, 3 answer tokens with EOS.
MAX_PROMPT_LEN, MAX_NEW_TOKENS = 8, 4
LEARNING_RATE = 1e-2
BATCH_SIZE = 4


class OneExampleTask(Task):
    """The first easy arithmetic example, `num` times, whatever the split and seed."""

    name = "one_example"

    def __init__(self):
        self.arith = ArithTask(EASY)
        self.example = self.arith.examples("train", 1, seed=0)[0]

    def examples(self, split, num, seed=0):
        return [self.example] * num

    def reward(self, completion, answer):
        return self.arith.reward(completion, answer)


TASK = OneExampleTask()


class ScriptedEvaluator:
    """Returns the scripted held-out accuracies in turn and keeps a host copy of the
    parameters it was shown (warm_start donates them to its next step)."""

    def __init__(self, accuracies):
        self.accuracies = list(accuracies)
        self.seen = []

    def accuracy(self, params, rng):
        if len(self.seen) == len(self.accuracies):
            raise AssertionError(f"evaluated more than the {len(self.accuracies)} scripted times")
        self.seen.append(jax.device_get(params))
        return self.accuracies[len(self.seen) - 1]


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])


def run_warm_start(
    mesh, evaluator, cache_dir, *, max_steps=40, log=None, stop=None, task=TASK, num_examples=20_000
):
    config = warmstart.WarmStartConfig(
        min_accuracy=0.15,
        max_accuracy=0.40,
        max_steps=max_steps,
        batch_size=BATCH_SIZE,
        learning_rate=LEARNING_RATE,
        eval_every=10,
        num_examples=num_examples,
    )
    return warmstart.warm_start(
        model=MODEL,
        config=config,
        tokenizer=TOKENIZER,
        task=task,
        evaluator=evaluator,
        seed=SEED,
        max_prompt_len=MAX_PROMPT_LEN,
        max_new_tokens=MAX_NEW_TOKENS,
        mesh=mesh,
        rules=RULES,
        cache_dir=str(cache_dir),
        key="run",
        log=log or (lambda message: None),
        stop=stop,
    )


def retrain(mesh, params, learning_rate, num_steps):
    """`params` after num_steps Adam steps, from a fresh optimizer, on the task's example."""
    # The learning rate is an input, not a constant: one compilation serves every rate.
    optimizer = optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate)
    params = jax.device_put(params, sharding.replicated(mesh))
    state = train_step_lib.TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params)
    )
    step = _reference_step(mesh, jax.tree.structure(state))
    examples = [TASK.example] * BATCH_SIZE
    batch = warmstart.demonstration_batch(TOKENIZER, examples, MAX_PROMPT_LEN, MAX_NEW_TOKENS)
    batch = sharding.shard_batch(batch, mesh, RULES)
    for _ in range(num_steps):
        state, _ = step(state, batch)
    return jax.device_get(state.params)


@functools.cache
def _reference_step(mesh, state_structure):
    optimizer = optax.inject_hyperparams(optax.adam)(learning_rate=0.0)
    state_shardings = jax.tree.unflatten(
        state_structure, [sharding.replicated(mesh)] * state_structure.num_leaves
    )
    return warmstart.make_sft_step(MODEL, optimizer, mesh, RULES, state_shardings)


def assert_params_close(actual, expected):
    jax.tree.map(
        lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6), actual, expected
    )


def assert_params_differ(actual, expected):
    difference = jax.tree.map(lambda a, e: float(np.max(np.abs(a - e))), actual, expected)
    assert max(jax.tree.leaves(difference)) > 1e-3


def test_overshoot_rolls_back_and_retries_at_half_the_learning_rate(mesh, tmp_path):
    # Step 10: below the window. Step 20: above it, so back to step 10's parameters and
    # 5 steps (half the interval) at half the learning rate. Step 25: inside, stop.
    evaluator = ScriptedEvaluator([0.0, 0.9, 0.2])
    params, info = run_warm_start(mesh, evaluator, tmp_path)

    assert info["sft_steps"] == 25
    assert info["base_accuracy"] == 0.2
    assert info["in_window"] is True and info["cached"] is False
    after_10, after_20, after_25 = evaluator.seen
    assert_params_differ(after_20, after_10)
    retried = retrain(mesh, after_10, LEARNING_RATE / 2, 5)
    assert_params_close(after_25, retried)
    assert_params_close(params, retried)
    # The same 5 steps at the full learning rate land measurably elsewhere.
    assert_params_differ(retried, retrain(mesh, after_10, LEARNING_RATE, 5))


def test_overshoot_in_the_last_interval_returns_and_caches_the_parameters_below_the_window(
    mesh, tmp_path
):
    # max_steps=20: the overshoot at step 20 ends the budget; what comes back is step 10's
    # parameters and their accuracy, outside the window.
    evaluator = ScriptedEvaluator([0.05, 0.9])
    params, info = run_warm_start(mesh, evaluator, tmp_path, max_steps=20)
    assert info["sft_steps"] == 20
    assert info["base_accuracy"] == 0.05
    assert info["in_window"] is False and info["cached"] is False
    after_10, after_20 = evaluator.seen
    assert_params_differ(after_20, after_10)
    assert_params_close(params, after_10)

    # The same key again: the cached result, no evaluation (so no SFT interval) at all.
    never = ScriptedEvaluator([])
    cached_params, cached_info = run_warm_start(mesh, never, tmp_path, max_steps=20)
    assert cached_info == {**info, "cached": True}
    assert_params_close(cached_params, after_10)
    for restored, original in zip(jax.tree.leaves(cached_params), jax.tree.leaves(params)):
        assert restored.sharding.is_equivalent_to(original.sharding, restored.ndim)


def test_a_warm_start_that_ends_below_its_window_says_so_and_what_to_change(mesh, tmp_path):
    # Held-out accuracy 0.0 and then 0.05 at steps 10 and 20: the budget of 20 ends below
    # [0.15, 0.4]. The warning names the window, the accuracy reached and the settings;
    # a reuse of the cached base warns again.
    lines = []
    _, info = run_warm_start(
        mesh, ScriptedEvaluator([0.0, 0.05]), tmp_path, max_steps=20, log=lines.append
    )
    assert info["in_window"] is False
    warning = (
        "warning: the warm start ended outside its accuracy window [0.15, 0.4]: held-out "
        "accuracy 0.050 after 20 SFT steps; RL goes on from this base. To reach the window, "
        "raise warmstart.max_steps (now 20) or warmstart.learning_rate (now 0.01), or lower "
        "warmstart.min_accuracy (a changed warmstart.* setting trains a new base)"
    )
    assert lines[-1] == warning
    again = []
    run_warm_start(mesh, ScriptedEvaluator([]), tmp_path, max_steps=20, log=again.append)
    assert again[-1] == warning
    # Inside the window: no warning.
    inside = []
    run_warm_start(
        mesh, ScriptedEvaluator([0.2]), tmp_path / "inside", max_steps=20, log=inside.append
    )
    assert not any(line.startswith("warning") for line in inside)


class StopAfter:
    """A runtime.StopRequest stand-in that is requested from its `checks`-th poll on."""

    signal_name = "SIGTERM"

    def __init__(self, checks):
        self.checks, self.polls = checks, 0

    @property
    def requested(self):
        self.polls += 1
        return self.polls >= self.checks


def test_a_stop_request_ends_the_warm_start_between_sft_steps_and_caches_nothing(mesh, tmp_path):
    # Requested at the third poll, before SFT step 3 of an interval of 10: no evaluation
    # (the scripted evaluator has none to give), Preempted after step 2, no base cached.
    lines = []
    with pytest.raises(runtime.Preempted) as stopped:
        run_warm_start(mesh, ScriptedEvaluator([]), tmp_path, log=lines.append, stop=StopAfter(3))
    assert stopped.value.step == 2
    assert str(stopped.value).startswith(
        "stopped by SIGTERM during the warm start (after SFT step 2 of at most 40); no base "
        "was cached"
    )
    assert lines[-1] == "warm start: stopped by SIGTERM after SFT step 2; nothing cached"
    assert not (tmp_path / "run").exists()
    # The same command again trains the base from the start.
    _, info = run_warm_start(mesh, ScriptedEvaluator([0.2]), tmp_path)
    assert info["cached"] is False and info["sft_steps"] == 10


class FileTask(OneExampleTask):
    """Three records, as a file holds them: num <= 0 asks for all of them. Records what it
    was asked."""

    def __init__(self):
        super().__init__()
        self.asked = []

    def examples(self, split, num, seed=0):
        self.asked.append((split, num))
        if num > 3:
            raise ValueError(f"3 {split} records, asked {num}")
        return [self.example] * (3 if num <= 0 else num)


def test_the_demonstrations_are_the_first_num_examples_of_the_train_split(mesh, tmp_path):
    # A file of three records: 0 takes all of them, where the 20,000 of the embedded
    # task's pool would fail.
    for num_examples in (0, 2):
        task = FileTask()
        _, info = run_warm_start(
            mesh,
            ScriptedEvaluator([0.2]),
            tmp_path / str(num_examples),
            max_steps=10,
            task=task,
            num_examples=num_examples,
        )
        assert task.asked == [("train", num_examples)] and info["sft_steps"] == 10
