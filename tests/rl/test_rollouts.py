"""Tests for replax/rl/rollouts.py: the stored-rollout layout and add-and-sample."""

import os

import jax
import jax.numpy as jnp
import numpy as np
from micro_run import MICRO_OVERRIDES

from replax.replay import store as replay
from replax.rl import evaluation, rollouts, scoring

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fresh(rng, r=4, prompt_len=3, new_tokens=4):
    prompt_mask = np.array([[0, 1, 1], [1, 1, 1], [0, 0, 1], [0, 1, 1]], bool)[:r]
    prompt_ids = np.where(prompt_mask, rng.integers(3, 50, (r, prompt_len)), 0).astype(np.int32)
    lengths = np.array([4, 1, 2, 3])[:r]
    mask = np.arange(new_tokens)[None] < lengths[:, None]
    completion = {
        "tokens": np.where(mask, rng.integers(3, 50, (r, new_tokens)), 0).astype(np.int32),
        "mask": mask,
        "logprobs": np.where(mask, -rng.random((r, new_tokens)), 7.0).astype(np.float32),
    }
    return prompt_ids, prompt_mask, completion


def test_make_rollouts_aligns_completion_logprobs_with_their_tokens():
    rng = np.random.default_rng(0)
    prompt_ids, prompt_mask, completion = _fresh(rng)
    rewards = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
    items = rollouts.make_rollouts(
        prompt_ids, prompt_mask, completion, rewards, group_size=2, normalize_std=False
    )
    spec = rollouts.rollout_spec(7)
    assert set(items) == set(spec)
    for key, s in spec.items():
        assert items[key].shape == (4, *s.shape) and items[key].dtype == s.dtype, key
    np.testing.assert_array_equal(items["tokens"][:, :3], prompt_ids)
    np.testing.assert_array_equal(items["tokens"][:, 3:], completion["tokens"])
    np.testing.assert_array_equal(items["attention_mask"][:, 3:], completion["mask"])
    # Trained on: completion tokens only; their behaviour log-probs sit on the same column,
    # zero elsewhere (the 7.0 written past each completion's end never leaks in).
    np.testing.assert_array_equal(items["loss_mask"][:, :3], 0.0)
    np.testing.assert_array_equal(items["loss_mask"][:, 3:], completion["mask"])
    want = np.where(completion["mask"], completion["logprobs"], 0.0)
    np.testing.assert_array_equal(items["behaviour_logprobs"][:, 3:], want)
    np.testing.assert_array_equal(items["behaviour_logprobs"][:, :3], 0.0)
    # Dr.GRPO advantages by hand: groups (1, 0) and (0, 0).
    np.testing.assert_allclose(items["advantage"], [0.5, -0.5, 0.0, 0.0])
    np.testing.assert_allclose(items["baseline"], [0.5, 0.5, 0.0, 0.0])


def test_add_and_sample_stores_nothing_on_a_step_without_generation():
    rng = np.random.default_rng(1)
    prompt_ids, prompt_mask, completion = _fresh(rng)
    buffer = replay.make_replay_buffer(replay.ReplayConfig(capacity=8, strategy="uniform"))
    state = buffer.init(rollouts.rollout_spec(7))
    add_and_sample = jax.jit(
        rollouts.make_add_and_sample(
            buffer, group_size=2, batch_size=4, normalize_std=True, drop_zero_advantage=True
        )
    )
    rewards = jnp.array([1.0, 0.0, 1.0, 1.0])
    args = (prompt_ids, prompt_mask, completion, rewards)
    key = jax.random.key(0)
    state, batch, stats = add_and_sample(
        state, *args, jnp.int32(0), key, jnp.bool_(True), jnp.int32(2**30)
    )
    # The second group's rewards agree: zero advantage, not stored.
    assert int(stats["rollouts_kept"]) == 2 and int(stats["replay_size"]) == 2
    assert set(batch) == set(rollouts.batch_spec(4, 7))
    assert set(np.asarray(batch["tokens"])[:, 0]) <= set(prompt_ids[:2, 0])
    state, _, stats = add_and_sample(
        state, *args, jnp.int32(1), key, jnp.bool_(False), jnp.int32(2**30)
    )
    assert int(stats["rollouts_kept"]) == 0 and int(stats["replay_size"]) == 2


def test_a_streams_rollouts_keep_each_tokens_version_and_report_the_batchs_token_age():
    """A stream's completion carries each token's version: stored aligned with the token
    (-1 on the prompt and past the completion's end), and the batch drawn reports the mean
    age of its completion tokens, each from its own version (numpy on the drawn rows)."""
    rng = np.random.default_rng(2)
    prompt_ids, prompt_mask, completion = _fresh(rng)
    versions = np.array([[3, 3, 4, 5], [3, 9, 9, 9], [4, 4, 9, 9], [2, 3, 3, 9]], np.int32)
    completion = {**completion, "versions": versions}  # 9: past each row's end
    rewards = np.array([1.0, 0.0, 1.0, 0.0], np.float32)
    items = rollouts.make_rollouts(
        prompt_ids, prompt_mask, completion, rewards, group_size=2, normalize_std=False
    )
    assert set(items) == set(rollouts.rollout_spec(7, token_versions=True))
    np.testing.assert_array_equal(items["token_version"][:, :3], -1)
    np.testing.assert_array_equal(
        items["token_version"][:, 3:], np.where(completion["mask"], versions, -1)
    )
    buffer = replay.make_replay_buffer(replay.ReplayConfig(capacity=8, strategy="uniform"))
    state = buffer.init(rollouts.rollout_spec(7, token_versions=True))
    add_and_sample = jax.jit(
        rollouts.make_add_and_sample(
            buffer, group_size=2, batch_size=3, normalize_std=True, drop_zero_advantage=True
        )
    )
    step, row_versions = 7, jnp.array([3, 3, 4, 2], jnp.int32)
    _, batch, stats = add_and_sample(
        state,
        prompt_ids,
        prompt_mask,
        completion,
        jnp.asarray(rewards),
        jnp.int32(step),
        jax.random.key(0),
        jnp.bool_(True),
        jnp.int32(2**30),
        row_versions,
    )
    assert set(batch) == set(rollouts.batch_spec(3, 7, token_versions=True))
    trained = np.asarray(batch["loss_mask"]) > 0
    token_age = step - np.asarray(batch["token_version"])[trained]
    np.testing.assert_allclose(float(stats["replay_token_age_mean"]), token_age.mean())
    # No token is older than its row (its group's oldest version).
    row_age = np.broadcast_to(np.asarray(batch["age"])[:, None], trained.shape)[trained]
    assert (token_age <= row_age).all() and (token_age < row_age).any()


def test_add_and_sample_reports_the_fresh_rollouts_entropy():
    """rollout_entropy = minus the mean behaviour log-prob over the completion tokens of
    all fresh rows, stored or not: here 3 tokens of log-probs -0.5, -1.0, -1.5 -> 1.0
    (the 7.0 past each completion's end is no token)."""
    buffer = replay.make_replay_buffer(replay.ReplayConfig(capacity=8, strategy="uniform"))
    state = buffer.init(rollouts.rollout_spec(4))
    add_and_sample = jax.jit(
        rollouts.make_add_and_sample(
            buffer, group_size=2, batch_size=2, normalize_std=True, drop_zero_advantage=True
        )
    )
    completion = {
        "tokens": np.array([[5, 6, 0], [7, 0, 0]], np.int32),
        "mask": np.array([[1, 1, 0], [1, 0, 0]], bool),
        "logprobs": np.array([[-0.5, -1.0, 7.0], [-1.5, 7.0, 7.0]], np.float32),
    }
    prompt_ids, prompt_mask = np.full((2, 1), 3, np.int32), np.ones((2, 1), bool)
    # Equal rewards: the group is not stored, and its entropy is still reported.
    args = (prompt_ids, prompt_mask, completion, jnp.zeros(2), jnp.int32(0))
    _, _, stats = add_and_sample(state, *args, jax.random.key(0), jnp.bool_(True), jnp.int32(2**30))
    assert int(stats["rollouts_kept"]) == 0
    np.testing.assert_allclose(float(stats["rollout_entropy"]), 1.0, rtol=1e-6)
    # No completion token at all: 0, not a division by zero.
    empty = {**completion, "mask": np.zeros((2, 3), bool)}
    assert float(evaluation.rollout_entropy(empty)) == 0.0


def test_first_step_train_logprobs_equal_the_samplers_behaviour_logprobs(tmp_path):
    """On the first step of a fresh fp32 run the batch is the rollouts just generated by
    the same params, so pi / mu = 1 on every completion token: any off-by-one between the
    sampler's log-probs and the stored tokens would show here."""
    from replax.run import metrics, trainer
    from replax.tools import experiments

    c = experiments.load_config(os.path.join(ROOT, "configs/arith.py"), "onpolicy")
    for key, value in {
        **MICRO_OVERRIDES,
        "train.batch_size": 8,
        "replay.capacity": 8,
        "eval.every": 0,
        "total_steps": 1,
    }.items():
        experiments.set_value(c, key, value)
    trainer.train(c, str(tmp_path), log=lambda _: None)
    (record,) = metrics.read_metrics(str(tmp_path))
    assert record["rollouts_kept"] == 8 and record["gen_tokens"] > 8
    # The fresh rollouts' entropy: positive at temperature 1, within log(vocabulary).
    assert 0.0 < record["rollout_entropy"] < np.log(264), record["rollout_entropy"]
    assert abs(record["is_ratio_mean"] - 1.0) < 1e-5, record["is_ratio_mean"]
    assert record["clip_frac"] == 0.0


def test_generate_and_score_prefills_each_prompt_once_as_repeated_prompts_would():
    """G completions of each prompt from one prefill per prompt: on a (2, 2, 2) mesh, whose
    4 data shards do not divide the 2 prompts, the rollouts (tokens, log-probs, rewards,
    their repeated prompts) are those of the 2 x G repeated prompts, greedy and sampled."""
    import flax.linen as nn

    from replax.core import sharding
    from replax.model import transformer as model_lib
    from replax.sampling import sampler as sampler_lib
    from replax.tasks.arith import EASY, ArithTask
    from replax.text.tokenizer import ByteTokenizer, encode_prompts

    tokenizer, task, group = ByteTokenizer(), ArithTask(EASY), 4
    config = model_lib.ModelConfig(
        vocab_size=264,  # the tokenizer's 259 ids, padded to split over 2 tensor shards
        num_layers=1,
        d_model=16,
        num_heads=2,
        num_kv_heads=2,
        head_dim=8,
        mlp_dim=32,
        max_len=24,
    )
    dummy = jnp.zeros((1, 1), jnp.int32)
    variables = jax.jit(model_lib.Transformer(config).init)(jax.random.key(0), dummy, dummy)
    params = nn.unbox(variables)["params"]
    examples = task.examples("train", 2)
    ids, mask = encode_prompts(tokenizer, [e.prompt for e in examples], 12)
    prompts = {
        "prompt_ids": ids,
        "prompt_mask": mask,
        "answer": np.array([e.answer for e in examples]),
    }
    for temperature in (0.0, 1.0):
        sampler = sampler_lib.make_sampler(
            config,
            sampler_lib.SamplingConfig(temperature=temperature),
            max_prompt_len=12,
            max_new_tokens=6,
            stop_ids=tokenizer.stop_ids,
            pad_id=tokenizer.pad_id,
            vocab_size=tokenizer.vocab_size,
            mesh=sharding.make_mesh((2, 2, 2)),
        )
        key = jax.random.key(3)
        fresh = rollouts.generate_and_score(sampler, task, tokenizer, group, params, prompts, key)
        repeated = sampler.generate(
            params, np.repeat(ids, group, axis=0), np.repeat(mask, group, axis=0), key
        )
        np.testing.assert_array_equal(np.asarray(fresh.prompt_ids), np.repeat(ids, group, axis=0))
        np.testing.assert_array_equal(np.asarray(fresh.prompt_mask), np.repeat(mask, group, axis=0))
        for field in ("tokens", "mask"):
            np.testing.assert_array_equal(
                np.asarray(fresh.completion[field]), np.asarray(getattr(repeated, field))
            )
        np.testing.assert_allclose(
            fresh.completion["logprobs"], repeated.logprobs, rtol=1e-5, atol=1e-5
        )
        assert np.asarray(fresh.rewards).shape == (2 * group,)
        np.testing.assert_array_equal(fresh.lengths, np.asarray(repeated.lengths))
        # Cut at max_new_tokens: the rows that hold no stop token at all.
        no_stop = ~np.isin(np.asarray(repeated.tokens), tokenizer.stop_ids).any(axis=1)
        assert fresh.diagnostics["truncated_frac"] == no_stop.mean()
        assert fresh.diagnostics["completion_len_max"] == np.asarray(repeated.lengths).max()


def test_a_step_without_generation_reports_none_for_every_completion_statistic():
    fresh = rollouts.nothing_generated(8, 3, 4)
    assert fresh.diagnostics == dict.fromkeys(scoring.FRESH_KEYS)
