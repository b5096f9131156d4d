"""Tests for replax/rl/train_step.py: one compilation, the 8-device mesh (data x fsdp x tensor
= 2 x 2 x 2, parameters sharded) against one device, exact on-policy ratios, and a step
that moves the parameters and consumes (donates) the old state."""

import dataclasses

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from replax.core import sharding
from replax.model import logprobs as logprobs_lib
from replax.model import transformer as model_lib
from replax.rl import gradients, objectives
from replax.rl import train_step as train_step_lib

# Tiny policy; heads, kv heads, MLP, vocabulary and d_model all split over 2 devices.
CONFIG = model_lib.ModelConfig(
    vocab_size=32,
    num_layers=2,
    d_model=16,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=32,
    max_len=12,
)
# 8 rows split over the 4 data-parallel shards.
BATCH, LENGTH, PROMPT = 8, 12, 4
# Recorded by jax once per XLA compilation (jax._src.dispatch.BACKEND_COMPILE_EVENT).
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
MODEL = model_lib.Transformer(CONFIG)
RULES = sharding.validate_rules(sharding.DEFAULT_RULES)
OPTIMIZER = train_step_lib.make_optimizer(
    train_step_lib.OptimizerConfig(learning_rate=1e-2, grad_clip=1.0)
)


def make_batch(seed: int) -> dict[str, np.ndarray]:
    """Rollouts as the trainer stores them: prompts of 2-4 tokens left-padded to 4,
    completions of 3-8 tokens padded after their end, behaviour log-probs a guess. Host
    arrays only, so that feeding a batch compiles nothing."""
    rng = np.random.default_rng(seed)
    prompt_len = rng.integers(2, PROMPT + 1, BATCH)
    completion_len = rng.integers(3, LENGTH - PROMPT + 1, BATCH)
    column = np.arange(LENGTH)[None, :]
    prompt = (column < PROMPT) & (column >= PROMPT - prompt_len[:, None])
    completion = (column >= PROMPT) & (column < PROMPT + completion_len[:, None])
    mask = prompt | completion
    behaviour = -rng.uniform(2.0, 4.0, (BATCH, LENGTH))
    return {
        "tokens": np.where(mask, rng.integers(1, CONFIG.vocab_size, (BATCH, LENGTH)), 0).astype(
            np.int32
        ),
        "attention_mask": mask,
        "loss_mask": completion.astype(np.float32),
        "behaviour_logprobs": (behaviour * completion).astype(np.float32),
        "advantage": rng.normal(size=BATCH).astype(np.float32),
        "reward": rng.integers(0, 2, BATCH).astype(np.float32),
        "baseline": np.full(BATCH, 0.5, np.float32),
        "importance_weights": np.ones(BATCH, np.float32),
        "age": rng.integers(0, 4, BATCH).astype(np.int32),
        "times_sampled": rng.integers(0, 3, BATCH).astype(np.int32),
    }


def current_logprobs(params, batch, temperature=1.0):
    """The policy's own log-probs of the batch's tokens at the sampling temperature."""
    positions = model_lib.positions_from_mask(batch["attention_mask"])
    logits = MODEL.apply({"params": params}, batch["tokens"], positions, batch["attention_mask"])
    return np.asarray(logprobs_lib.token_logprobs(logits / temperature, batch["tokens"]))


def build(mesh_shape, devices=None, params=None, temperature=1.0):
    """(state, step) on a mesh of the given shape; params: place these instead of init."""
    mesh = sharding.make_mesh(mesh_shape, devices)
    state, state_shardings = train_step_lib.init_train_state(
        MODEL, OPTIMIZER, jax.random.key(0), mesh, RULES, params=params
    )
    batch_sharding = train_step_lib.batch_shardings(mesh, RULES, make_batch(0))
    step = train_step_lib.make_train_step(
        MODEL,
        OPTIMIZER,
        objectives.LossConfig(name="ppo"),
        mesh,
        RULES,
        state_shardings,
        batch_sharding,
        temperature=temperature,
    )
    return state, step


@pytest.fixture(scope="module")
def initial_params():
    state, _ = build((1, 1, 1), jax.devices()[:1])
    return jax.device_get(state.params)


def test_the_step_compiles_once_over_several_calls():
    state, step = build((2, 2, 2))
    batches = [make_batch(seed) for seed in range(4)]
    state, _ = step(state, batches[0])
    compiles = []

    def listener(event, duration, **kwargs):
        if event == BACKEND_COMPILE_EVENT:
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for batch in batches[1:]:
            state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
    assert int(state.step) == 4


@pytest.mark.parametrize("poison", ["advantage", "behaviour_logprobs"])
def test_a_non_finite_step_changes_nothing_and_is_counted(initial_params, poison):
    state, step = build((2, 2, 2), params=initial_params)
    bad = make_batch(1)
    bad[poison] = np.full_like(bad[poison], np.nan)
    before = jax.device_get((state.params, state.opt_state, state.step))
    state, metrics = step(state, bad)
    assert int(metrics["skipped"]) == 1
    after = jax.device_get((state.params, state.opt_state, state.step))
    jax.tree.map(np.testing.assert_array_equal, after, before)
    # The next finite batch trains as usual.
    state, metrics = step(state, make_batch(2))
    assert int(metrics["skipped"]) == 0 and int(state.step) == 1
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), jax.device_get(state.params), before[0])
    assert max(jax.tree.leaves(moved)) > 0


def test_an_overflowing_update_is_skipped(initial_params):
    huge = train_step_lib.make_optimizer(train_step_lib.OptimizerConfig(learning_rate=1e38))
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    state, shardings = train_step_lib.init_train_state(
        MODEL, huge, jax.random.key(0), mesh, RULES, params=initial_params
    )
    step = train_step_lib.make_train_step(
        MODEL,
        huge,
        objectives.LossConfig(name="ppo"),
        mesh,
        RULES,
        shardings,
        train_step_lib.batch_shardings(mesh, RULES, make_batch(0)),
    )
    state, metrics = step(state, make_batch(0))
    assert int(metrics["skipped"]) == 1 and int(state.step) == 0
    finite = jax.tree.map(lambda x: bool(np.isfinite(x).all()), jax.device_get(state.params))
    assert all(jax.tree.leaves(finite))


SCANNED = model_lib.Transformer(dataclasses.replace(CONFIG, num_layers=3, scan_layers=True))


@pytest.mark.parametrize("model", [MODEL, SCANNED], ids=["layers", "scanned_layers"])
def test_the_layerwise_update_norm_is_the_norm_of_the_whole_update(model):
    """The non-finite check's update norm, taken a stacked layer at a time after a global
    clip, against optax's update of the whole tree (clip and adamw in one chain)."""
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    state, _ = train_step_lib.init_train_state(model, OPTIMIZER, jax.random.key(0), mesh, RULES)
    leaves, tree = jax.tree.flatten(state.params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    # Gradients of norm about 30: the clip at 1.0 acts.
    grads = jax.tree.unflatten(
        tree, [3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
    )
    # A second step, so that Adam's moments are not zero.
    _, opt_state = OPTIMIZER.update(grads, state.opt_state, state.params)
    expected = optax.tree_utils.tree_norm(OPTIMIZER.update(grads, opt_state, state.params)[0])
    got = gradients.layerwise_update_norm(OPTIMIZER, grads, opt_state, state.params, grad_clip=1.0)
    # Only its finiteness is used; the layers sum their squares in another order.
    np.testing.assert_allclose(float(got), float(expected), rtol=1e-5)


def test_an_overflowing_update_of_stacked_layers_changes_nothing():
    huge = train_step_lib.make_optimizer(
        train_step_lib.OptimizerConfig(learning_rate=1e38, grad_clip=1.0)
    )
    mesh = sharding.make_mesh((2, 2, 2))
    state, shardings = train_step_lib.init_train_state(
        SCANNED, huge, jax.random.key(0), mesh, RULES
    )
    step = train_step_lib.make_train_step(
        SCANNED,
        huge,
        objectives.LossConfig(name="ppo"),
        mesh,
        RULES,
        shardings,
        train_step_lib.batch_shardings(mesh, RULES, make_batch(0)),
        grad_clip=1.0,
    )
    before = jax.device_get(state)
    state, metrics = step(state, make_batch(0))
    assert int(metrics["skipped"]) == 1
    after = jax.device_get(state)
    assert jax.tree.structure(after) == jax.tree.structure(before)
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before)):
        np.testing.assert_array_equal(a, b)


def test_the_8_device_mesh_shards_parameters_and_matches_one_device(initial_params):
    one, step_one = build((1, 1, 1), jax.devices()[:1], params=initial_params)
    eight, step_eight = build((2, 2, 2), params=initial_params)
    assert len(jax.devices()) == 8
    gate = eight.params["layer_0"]["mlp"]["gate"]  # [embed, mlp] over (fsdp, tensor)
    assert gate.sharding.spec == P("fsdp", "tensor")
    assert gate.addressable_shards[0].data.shape == (CONFIG.d_model // 2, CONFIG.mlp_dim // 2)
    moment = eight.opt_state[1][0].mu["layer_0"]["mlp"]["gate"]  # adam's first moment
    assert moment.sharding.is_equivalent_to(gate.sharding, 2)
    # The sharded sums run in another order; Adam's m / sqrt(v) magnifies that for a
    # weight whose gradient is near zero, up to a fraction of the step size (lr 1e-2). A
    # wrong layout or reduction is off by the order of lr itself: the weights are held to
    # 1% of it (on one processor they differ by up to 1.6e-5 after three steps). The
    # first step, on equal weights, agrees to float32 rounding; later steps' metrics to
    # 1e-4 (the importance-sampling ESS, exp of a sum of token log-ratios, moves most:
    # 5e-5 at the third step on that processor).
    for seed in range(3):
        batch = make_batch(seed)
        one, metrics_one = step_one(one, batch)
        eight, metrics_eight = step_eight(eight, batch)
        assert metrics_one.keys() == metrics_eight.keys()
        rtol = 2e-5 if seed == 0 else 1e-4
        for key in metrics_one:
            np.testing.assert_allclose(
                metrics_eight[key], metrics_one[key], rtol=rtol, atol=1e-6, err_msg=key
            )
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4),
        jax.device_get(eight.params),
        jax.device_get(one.params),
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_on_policy_batch_has_unit_ratios_and_nothing_clipped(initial_params, temperature):
    state, step = build((2, 2, 2), params=initial_params, temperature=temperature)
    batch = make_batch(1)
    behaviour = current_logprobs(initial_params, batch, temperature) * batch["loss_mask"]
    batch["behaviour_logprobs"] = behaviour.astype(np.float32)
    _, metrics = step(state, batch)
    assert float(metrics["is_ratio_mean"]) == pytest.approx(1.0, abs=1e-5)
    assert float(metrics["is_ratio_max"]) == pytest.approx(1.0, abs=1e-5)
    assert float(metrics["is_ess"]) == pytest.approx(1.0, abs=1e-5)
    assert float(metrics["clip_frac"]) == 0.0


def test_a_step_moves_the_parameters_and_consumes_the_old_state(initial_params):
    state, step = build((2, 2, 2), params=initial_params)
    old_embedding = state.params["embedding"]
    new_state, metrics = step(state, make_batch(2))
    assert old_embedding.is_deleted()  # donated: updated in place
    assert int(new_state.step) == 1
    assert float(metrics["grad_norm"]) > 0
    assert all(np.isfinite(float(v)) for v in metrics.values())
    changed = jax.tree.map(
        lambda new, old: not np.allclose(new, old), jax.device_get(new_state.params), initial_params
    )
    assert all(jax.tree.leaves(changed)), changed


def test_train_step_with_half_batch_stats_matches_the_plain_step():
    """With a per-sequence mean loss the mean of the halves' gradients is the batch
    gradient, so the flag changes nothing but the extra statistics."""
    import optax

    from replax.replay import auto as auto_replay
    from replax.rl import train_step as train_step_lib

    rules = sharding.validate_rules(
        (
            ("batch", "data"),
            ("buffer", "data"),
            ("length", None),
            ("embed", None),
            ("heads", None),
            ("kv_heads", None),
            ("head_dim", None),
            ("mlp", None),
            ("vocab", None),
        )
    )
    mesh = sharding.make_mesh((-1, 1, 1))
    config = model_lib.ModelConfig(
        vocab_size=16,
        num_layers=1,
        d_model=16,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        mlp_dim=32,
        max_len=8,
    )
    model = model_lib.Transformer(config)
    optimizer = optax.sgd(1.0)
    loss = objectives.LossConfig(name="ppo", aggregation="sequence_mean")
    rng = np.random.default_rng(0)
    batch_size, length = 16, 8
    batch = {
        "tokens": rng.integers(0, 16, (batch_size, length)).astype(np.int32),
        "attention_mask": np.ones((batch_size, length), bool),
        "loss_mask": np.tile(np.arange(length) >= 4, (batch_size, 1)).astype(np.float32),
        "behaviour_logprobs": np.full((batch_size, length), -2.7, np.float32),
        "advantage": rng.normal(size=batch_size).astype(np.float32),
        "reward": np.zeros(batch_size, np.float32),
        "baseline": np.zeros(batch_size, np.float32),
        "importance_weights": np.ones(batch_size, np.float32),
        "age": rng.integers(0, 6, batch_size).astype(np.int32),
        "times_sampled": np.zeros(batch_size, np.int32),
    }
    batch_sharding = train_step_lib.batch_shardings(mesh, rules, batch)
    params = {}
    for flag in (False, True):
        state, shardings = train_step_lib.init_train_state(
            model, optimizer, jax.random.key(0), mesh, rules
        )
        step = train_step_lib.make_train_step(
            model, optimizer, loss, mesh, rules, shardings, batch_sharding, half_batch_stats=flag
        )
        state, metrics = step(state, batch)
        params[flag] = jax.device_get(state.params)
        if flag:
            assert set(auto_replay.STAT_KEYS) <= set(metrics)
            ages = np.sort(batch["age"])
            assert float(metrics["halves_age_fresh"]) == pytest.approx(ages[:8].mean())
            assert float(metrics["halves_age_stale"]) == pytest.approx(ages[8:].mean())
            noise = float(metrics["halves_noise_fresh"]) + float(metrics["halves_noise_stale"])
            assert noise > 0
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), params[False], params[True]
    )


# MEMORY-BOUNDING OPTIONS: chunked log-probs, microbatches, mixed precision.

PPO = objectives.LossConfig(name="ppo")


def build_with(
    options,
    *,
    mesh_shape=(2, 2, 2),
    loss=PPO,
    optimizer=None,
    model=MODEL,
    params=None,
    with_reference=False,
    temperature=1.0,
    vocab_size=None,
):
    """(state, step) with make_train_step's keyword options; sgd(1) by default, so that a
    step's parameter change is minus the gradient."""
    import optax

    optimizer = optimizer or optax.sgd(1.0)
    mesh = sharding.make_mesh(mesh_shape, jax.devices()[: int(np.prod(mesh_shape))])
    state, state_shardings = train_step_lib.init_train_state(
        model,
        optimizer,
        jax.random.key(0),
        mesh,
        RULES,
        params=params,
        with_reference=with_reference,
    )
    step = train_step_lib.make_train_step(
        model,
        optimizer,
        loss,
        mesh,
        RULES,
        state_shardings,
        train_step_lib.batch_shardings(mesh, RULES, make_batch(0)),
        temperature=temperature,
        vocab_size=vocab_size,
        **options,
    )
    return state, step


def run_steps(state, step, seeds):
    """Steps over the batches of seeds: (params, [metrics of each step]) on the host."""
    history = []
    for seed in seeds:
        state, metrics = step(state, make_batch(seed))
        history.append(jax.device_get(metrics))
    return jax.device_get(state.params), history


# The passes a step ran (gradients.train_passes): a covariance option's in microbatches
# differ from the single pass's, by design.
PASSES = ("forward_passes", "backward_passes")


def assert_same_steps(got, expected, tol=1e-5, skip=()):
    (params, history), (expected_params, expected_history) = got, expected
    for metrics, expected_metrics in zip(history, expected_history, strict=True):
        assert metrics.keys() == expected_metrics.keys()
        for key in set(metrics) - set(skip):
            np.testing.assert_allclose(
                metrics[key], expected_metrics[key], rtol=tol, atol=tol, err_msg=key
            )
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=tol, atol=tol), params, expected_params
    )


@pytest.mark.parametrize("chunk_size", [4, 5])
def test_chunked_logprobs_give_the_unchunked_step(initial_params, chunk_size):
    """Two sgd steps (so the KL reference differs from the policy in the second) at a
    temperature, with the vocabulary's last 2 ids masked and the entropy bonus on: loss,
    entropy, KL, ratios and gradients as without chunks. 11 predicting positions: chunks
    of 5 leave a padded last chunk."""
    common = dict(
        loss=objectives.LossConfig(name="ppo", kl_coef=0.5, entropy_coef=0.01),
        params=initial_params,
        with_reference=True,
        temperature=0.7,
        vocab_size=CONFIG.vocab_size - 2,
    )
    expected = run_steps(*build_with({}, **common), seeds=(1, 2))
    got = run_steps(*build_with({"logits_chunk_size": chunk_size}, **common), seeds=(1, 2))
    assert expected[1][1]["kl"] > 0 and expected[1][0]["train_entropy"] > 0
    assert_same_steps(got, expected)


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_microbatches_give_the_single_pass_step(initial_params, aggregation):
    """2 microbatches of 4 rows, each taking one row from each of the 4 data shards: the
    gradient (sgd: the parameter change) and every metric equal the single pass."""
    loss = objectives.LossConfig(name="ppo", aggregation=aggregation, entropy_coef=0.01)
    expected = run_steps(*build_with({}, loss=loss, params=initial_params), seeds=(1, 2))
    got = run_steps(
        *build_with({"num_microbatches": 2}, loss=loss, params=initial_params), seeds=(1, 2)
    )
    assert_same_steps(got, expected)


@pytest.mark.parametrize(
    "loss",
    [
        objectives.LossConfig(name="ppo", cov_cut_frac=0.2),
        # A band wide enough for the test batch's small covariances.
        objectives.LossConfig(
            name="ppo", clip_cov_ratio=0.2, clip_cov_low=0.0, clip_cov_high=100.0
        ),
        objectives.LossConfig(name="ppo", kl_cov_frac=0.2, aggregation="sequence_mean"),
    ],
    ids=["cov_cut", "clip_cov", "kl_cov"],
)
def test_microbatches_choose_the_covariance_tokens_over_the_whole_batch(initial_params, loss):
    """The covariance means and ranking are over the whole batch, not each microbatch:
    2 microbatches give the single pass's step, the same tokens cut or penalised (Clip-Cov
    draws with the step's key, the same in both)."""
    expected = run_steps(*build_with({}, loss=loss, params=initial_params), seeds=(1, 2))
    got = run_steps(
        *build_with({"num_microbatches": 2}, loss=loss, params=initial_params), seeds=(1, 2)
    )
    option = loss.covariance_option
    assert all(metrics[option] > 0.1 for metrics in expected[1])
    assert_same_steps(got, expected, skip=PASSES)
    # Too many tokens to correct afterwards: a forward of the batch ranks them first.
    assert all((m["forward_passes"], m["backward_passes"]) == (2, 1) for m in got[1])


@pytest.mark.parametrize(
    "mesh_shape, options",
    [((1, 2, 2), {}), ((1, 1, 2), {"half_batch_stats": True})],
    ids=["two_shards", "halves"],
)
def test_microbatches_add_a_few_covariance_tokens_part_afterwards(
    initial_params, mesh_shape, options
):
    """KL-Cov at 2% acts on one token (of about 44 valid; at most one of the 96 any batch
    of 8 x 12 holds): the microbatches take the loss without it, and a forward and
    backward of its row adds the option's part, a slice of 2 rows on 2 data shards, or
    with half_batch_stats 1 row in the half that holds the token, and 1 in the other: the
    halves' loops are vmapped, so both run the longer one's trips, and both are counted.
    The single pass's step, at a quarter of the batch more in each direction."""
    loss = objectives.LossConfig(name="ppo", kl_cov_frac=0.02, kl_cov_coef=5.0)
    common = dict(mesh_shape=mesh_shape, loss=loss, params=initial_params)
    expected = run_steps(*build_with(options, **common), seeds=(1, 2))
    got = run_steps(*build_with({"num_microbatches": 2, **options}, **common), seeds=(1, 2))
    assert all(metrics["kl_cov_frac"] > 0 for metrics in expected[1])
    assert_same_steps(got, expected, skip=PASSES)
    assert all((m["forward_passes"], m["backward_passes"]) == (1.25, 1.25) for m in got[1])


def test_microbatches_chunks_and_a_reference_together(initial_params):
    """4 microbatches of 2 rows on 2 data shards, chunked log-probs, the KL reference and
    importance weights that differ per row."""
    loss = objectives.LossConfig(name="ppo", kl_coef=0.5, aggregation="sequence_mean")
    common = dict(mesh_shape=(1, 2, 2), loss=loss, params=initial_params, with_reference=True)
    expected = run_steps(*build_with({}, **common), seeds=(3, 4))
    options = {"num_microbatches": 4, "logits_chunk_size": 3}
    assert_same_steps(run_steps(*build_with(options, **common), seeds=(3, 4)), expected)


HALVES = objectives.LossConfig(name="ppo", entropy_coef=0.01)


@pytest.mark.parametrize("microbatches", [1, 2])
@pytest.mark.parametrize(
    "loss",
    [
        HALVES,
        objectives.LossConfig(name="ppo", cov_cut_frac=0.2),
        objectives.LossConfig(
            name="ppo", clip_cov_ratio=0.2, clip_cov_low=0.0, clip_cov_high=100.0
        ),
        objectives.LossConfig(name="ppo", kl_cov_frac=0.2, aggregation="sequence_mean"),
    ],
    ids=["token_mean", "cov_cut", "clip_cov", "kl_cov"],
)
def test_half_batch_stats_give_the_plain_step(initial_params, loss, microbatches):
    """The halves' parts sum to the batch's gradient: a token mean over the whole batch's
    tokens (halves of different token counts) and the covariance option's tokens chosen
    over the whole batch, so the step and its metrics are the plain step's; only the
    halves_* statistics are added."""
    options = {"num_microbatches": microbatches} if microbatches > 1 else {}
    common = dict(mesh_shape=(2, 1, 2), loss=loss, params=initial_params)
    expected = run_steps(*build_with(options, **common), seeds=(1, 2))
    params, history = run_steps(
        *build_with({"half_batch_stats": True, **options}, **common), seeds=(1, 2)
    )
    assert all(m["halves_noise_fresh"] + m["halves_noise_stale"] > 0 for m in history)
    halves_keys = [k for k in history[0] if k.startswith("halves_")]
    history = [{k: v for k, v in m.items() if k not in halves_keys} for m in history]
    assert_same_steps((params, history), expected, skip=PASSES)
    option = loss.covariance_option
    if option is not None:
        assert all(m[option] > 0.1 for m in expected[1])


def test_microbatches_with_half_batch_stats(initial_params):
    """Each half (freshest, stalest) is split into microbatches: the same gradient and
    halves_* statistics as without."""
    common = dict(mesh_shape=(2, 1, 2), params=initial_params)
    expected = run_steps(*build_with({"half_batch_stats": True}, **common), seeds=(1,))
    got = run_steps(
        *build_with({"half_batch_stats": True, "num_microbatches": 2}, **common), seeds=(1,)
    )
    assert "halves_cross" in got[1][0]
    assert_same_steps(got, expected)


def test_microbatches_that_do_not_split_the_batch_are_refused():
    state, step = build_with({"num_microbatches": 3}, mesh_shape=(1, 1, 1))
    with pytest.raises(
        ValueError, match=r"train.num_microbatches=3 must divide train.batch_size=8"
    ):
        step(state, make_batch(0))
    # 4 microbatches of 2 rows cannot take rows from each of 4 data shards.
    state, step = build_with({"num_microbatches": 4}, mesh_shape=(2, 2, 2))
    with pytest.raises(ValueError, match=r"2 rows per microbatch .* 4 data-parallel shards"):
        step(state, make_batch(0))


def test_m2po_with_microbatches_is_refused():
    with pytest.raises(ValueError, match=r"loss.name='m2po' .* train.num_microbatches=2"):
        build_with({"num_microbatches": 2}, loss=objectives.LossConfig(name="m2po"))


def _bf16_model(param_dtype):
    import dataclasses

    config = dataclasses.replace(CONFIG, param_dtype=param_dtype, dtype="bfloat16")
    return model_lib.Transformer(config)


def test_float32_master_weights_keep_updates_that_bfloat16_params_lose():
    """Adam at lr 1e-6 moves each weight by ~1e-6: kept by float32 master weights (each
    layer casts its own weights to the bfloat16 compute dtype), lost to rounding (bf16
    keeps 8 significant bits) when the params themselves are bfloat16."""
    adam = train_step_lib.make_optimizer(
        train_step_lib.OptimizerConfig(learning_rate=1e-6, grad_clip=1.0)
    )
    changed = {}
    for param_dtype in ("float32", "bfloat16"):
        state, step = build_with({}, model=_bf16_model(param_dtype), optimizer=adam)
        before = jax.device_get(state.params)
        after, (metrics,) = run_steps(state, step, seeds=(1,))
        assert metrics["skipped"] == 0 and metrics["grad_norm"] > 0
        assert jax.tree.leaves(after)[0].dtype == np.dtype(param_dtype)
        moved = [np.mean(a != b) for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before))]
        changed[param_dtype] = float(np.mean(moved))
    assert changed["float32"] > 0.9, changed
    assert changed["bfloat16"] < 0.01, changed


def test_bfloat16_compute_without_microbatches_matches_with(initial_params):
    """Float32 master weights, bfloat16 compute: 2 microbatches give the same step up to
    bfloat16 rounding of the gradients."""
    model = _bf16_model("float32")
    common = dict(model=model, params=initial_params)
    expected = run_steps(*build_with({}, **common), seeds=(1,))
    options = {"num_microbatches": 2, "logits_chunk_size": 4}
    got = run_steps(*build_with(options, **common), seeds=(1,))
    assert_same_steps(got, expected, tol=2e-2)


def test_adam_state_dtype():
    optimizer = train_step_lib.make_optimizer(
        train_step_lib.OptimizerConfig(state_dtype="bfloat16")
    )
    adam = optimizer.init({"w": jnp.zeros(3, jnp.float32)})[1][0]
    assert adam.mu["w"].dtype == jnp.bfloat16
    assert adam.nu["w"].dtype == jnp.float32  # see OptimizerConfig.state_dtype
    with pytest.raises(ValueError, match=r"optimizer.state_dtype='float16': allowed are"):
        train_step_lib.OptimizerConfig(state_dtype="float16")


def test_abstract_train_state_is_the_initialised_one():
    mesh = sharding.make_mesh((2, 2, 2))
    abstract = train_step_lib.abstract_train_state(
        MODEL, OPTIMIZER, mesh, RULES, with_reference=True
    )
    state, _ = train_step_lib.init_train_state(
        MODEL, OPTIMIZER, jax.random.key(0), mesh, RULES, with_reference=True
    )
    assert jax.tree.structure(abstract) == jax.tree.structure(state)
    for spec, array in zip(jax.tree.leaves(abstract), jax.tree.leaves(state)):
        assert isinstance(spec, jax.ShapeDtypeStruct)
        assert (spec.shape, spec.dtype) == (array.shape, array.dtype)
        assert spec.sharding.is_equivalent_to(array.sharding, array.ndim)


def test_learning_rates_are_the_rates_the_optimizer_applies():
    config = train_step_lib.OptimizerConfig(
        learning_rate=1.0, schedule="linear", warmup_steps=2, total_steps=6, grad_clip=0.0
    )
    table = train_step_lib.learning_rates(config, 6)
    # Warm-up 0 -> 1 over 2 updates, then 1 -> 0 over the other 4.
    np.testing.assert_allclose(table, [0.0, 0.5, 1.0, 0.75, 0.5, 0.25])
    # Adam on a constant gradient moves each update by the rate itself (m / sqrt(v) = 1).
    optimizer = train_step_lib.make_optimizer(config)
    params = jnp.zeros(())
    state = optimizer.init(params)
    moves = []
    for _ in range(6):
        updates, state = optimizer.update(jnp.ones(()), state, params)
        params = params + updates
        moves.append(-float(updates))
    np.testing.assert_allclose(moves, table, rtol=1e-4)  # float32 bias correction
