"""Tests for replax/model/lora.py and LoRA in the model and the train step: bad keys, the
adapted model equal to its base at init (logits and sampled log-probs), gradients and Adam
state only for the adapters, the adapters sharded with their layer, the KL reference from
the same weights with the adapters off, merging, and the base fingerprint."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from replax.config.sections import ModelSection
from replax.core import sharding
from replax.core.config_utils import ConfigError
from replax.model import lora
from replax.model import transformer as model_lib
from replax.rl import objectives
from replax.rl import train_step as train_step_lib
from replax.sampling import sampler as sampler_lib

BASE = model_lib.ModelConfig(
    vocab_size=32,
    num_layers=2,
    d_model=16,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=32,
    max_len=12,
)
LORA = dataclasses.replace(BASE, lora_rank=4, lora_alpha=8.0)
RULES = sharding.validate_rules(sharding.DEFAULT_RULES)
OPTIMIZER = train_step_lib.make_optimizer(
    train_step_lib.OptimizerConfig(learning_rate=1e-2, grad_clip=1.0)
)
BATCH, LENGTH, PROMPT = 8, 12, 4


def make_batch(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    column = np.arange(LENGTH)[None, :]
    completion_len = rng.integers(3, LENGTH - PROMPT + 1, BATCH)
    completion = (column >= PROMPT) & (column < PROMPT + completion_len[:, None])
    mask = (column < PROMPT) | completion
    return {
        "tokens": np.where(mask, rng.integers(1, BASE.vocab_size, (BATCH, LENGTH)), 0).astype(
            np.int32
        ),
        "attention_mask": mask,
        "loss_mask": completion.astype(np.float32),
        "behaviour_logprobs": (-rng.uniform(2.0, 4.0, (BATCH, LENGTH)) * completion).astype(
            np.float32
        ),
        "advantage": rng.normal(size=BATCH).astype(np.float32),
        "reward": rng.integers(0, 2, BATCH).astype(np.float32),
        "baseline": np.full(BATCH, 0.5, np.float32),
        "importance_weights": np.ones(BATCH, np.float32),
        "age": np.zeros(BATCH, np.int32),
        "times_sampled": np.zeros(BATCH, np.int32),
    }


def init(config, seed=0):
    tokens = jnp.zeros((1, 4), jnp.int32)
    return nn.unbox(model_lib.Transformer(config).init(jax.random.key(seed), tokens, tokens))[
        "params"
    ]


def logits(config, params, tokens):
    positions = model_lib.positions_from_mask(jnp.ones_like(tokens, bool))
    return model_lib.Transformer(config).apply({"params": params}, tokens, positions)


def flat(tree):
    return {"/".join(k): v for k, v in traverse_util.flatten_dict(tree).items()}


# CONFIG


@pytest.mark.parametrize(
    "key, value",
    [
        ("lora_rank", -1),
        ("lora_rank", 2.5),
        ("lora_rank", True),
        ("lora_alpha", 0.0),
        ("lora_alpha", "big"),
        ("lora_targets", "q,x"),
        ("lora_targets", ""),
        ("lora_targets", ("q", "q")),
    ],
)
def test_a_bad_lora_key_is_one_line_naming_it(key, value):
    with pytest.raises(ValueError, match=f"^model.{key}=") as e:
        dataclasses.replace(BASE, **{key: value})
    assert "\n" not in str(e.value) and "allowed" in str(e.value)
    # Through the run spec, with a checkpoint's architecture too: a ConfigError.
    with pytest.raises(ConfigError, match=f"^model.{key}="):
        ModelSection(init="random", checkpoint="", architecture={"max_len": 8, key: value})


def test_targets_read_from_a_comma_separated_string_in_a_fixed_order():
    config = dataclasses.replace(BASE, lora_rank=2, lora_targets="down, q")
    assert config.lora_targets == ("q", "down")
    assert config.lora_scale == 16.0 / 2


def test_rank_zero_adds_no_parameter():
    assert flat(init(dataclasses.replace(BASE, lora_rank=0, lora_targets="q"))).keys() == (
        flat(init(BASE)).keys()
    )


# EXACT AT INIT


@pytest.mark.parametrize("scan", [False, True])
def test_the_adapted_model_equals_its_base_at_init(scan):
    base_config = dataclasses.replace(BASE, scan_layers=scan)
    config = dataclasses.replace(LORA, scan_layers=scan)
    params = init(config)
    adapters, base = lora.partition(params, True)
    names = {k.split("/")[-1] for k in flat(adapters)}
    assert names == {f"{t}_lora_{ab}" for t in model_lib.LORA_TARGETS for ab in "ab"}
    assert all(not np.any(v) for k, v in flat(adapters).items() if k.endswith("_lora_b"))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (3, 10)), jnp.int32)
    expected = logits(base_config, base, tokens)
    np.testing.assert_array_equal(logits(config, params, tokens), expected)
    # The same params without the adapters (the KL reference) are the base model.
    np.testing.assert_array_equal(logits(config, base, tokens), expected)


def test_unrolled_base_params_are_those_of_the_model_without_lora():
    base = lora.without_adapters(init(LORA))
    jax.tree.map(np.testing.assert_array_equal, base, init(BASE))


@pytest.mark.parametrize("scan", [False, True])
def test_a_runs_lora_init_starts_from_the_base_of_rank_zero(scan):
    """The train state a run initialises (model.init='random'): with adapters its base
    is the params of the same run without them, scanned layers included (where the
    model's own init draws another base once adapters are added)."""
    init_state = lambda config: train_step_lib._init_fn(
        model_lib.Transformer(dataclasses.replace(config, scan_layers=scan)), OPTIMIZER, False
    )(jax.random.key(3))
    base = nn.unbox(init_state(BASE).params)
    adapted = nn.unbox(init_state(LORA).params)
    jax.tree.map(np.testing.assert_array_equal, lora.without_adapters(adapted), base)
    assert lora.has_adapters(adapted)


def test_the_sampler_draws_the_bases_tokens_and_logprobs_at_init():
    params = init(LORA)
    settings = dict(max_prompt_len=4, max_new_tokens=6, stop_ids=(31,), pad_id=0)
    ids = jnp.asarray([[0, 5, 6, 7], [1, 2, 3, 4]], jnp.int32)
    mask = ids > 0
    key = jax.random.key(3)
    got = sampler_lib.make_sampler(LORA, **settings).generate(params, ids, mask, key)
    want = sampler_lib.make_sampler(BASE, **settings).generate(
        lora.without_adapters(params), ids, mask, key
    )
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.logprobs, want.logprobs)


def test_a_sampler_with_a_decode_dtype_merges_the_adapters():
    """Exact at init either way; trained adapters merged decode as applied ones do."""
    settings = dict(max_prompt_len=4, max_new_tokens=6, stop_ids=(31,), pad_id=0)
    merging = sampler_lib.make_sampler(LORA, dtype="float32", **settings)
    applying = sampler_lib.make_sampler(LORA, **settings)
    assert merging.merges_adapters and not applying.merges_adapters
    ids = jnp.asarray([[0, 5, 6, 7], [1, 2, 3, 4]], jnp.int32)
    key = jax.random.key(3)
    params = init(LORA)
    base = sampler_lib.make_sampler(BASE, **settings).generate(
        lora.without_adapters(params), ids, ids > 0, key
    )
    at_init = merging.generate(params, ids, ids > 0, key)
    np.testing.assert_array_equal(at_init.logprobs, base.logprobs)
    trained = jax.tree_util.tree_map_with_path(
        lambda p, x: x + 0.05 if "lora_b" in jax.tree_util.keystr(p) else x, params
    )
    merged = merging.generate(trained, ids, ids > 0, key)
    applied = applying.generate(trained, ids, ids > 0, key)
    np.testing.assert_array_equal(merged.tokens, applied.tokens)
    np.testing.assert_allclose(merged.logprobs, applied.logprobs, atol=1e-5)
    assert np.abs(merged.logprobs - base.logprobs).max() > 1e-3  # the adapters count


# MERGING


@pytest.mark.parametrize("scan", [False, True])
def test_merged_params_compute_the_adapted_model(scan):
    config = dataclasses.replace(LORA, scan_layers=scan)
    params = init(config)
    rng = np.random.default_rng(1)
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: (
            x + rng.normal(size=x.shape).astype(np.float32) * 0.3
            if "lora_b" in jax.tree_util.keystr(p)
            else x
        ),
        params,
    )
    tokens = jnp.asarray(rng.integers(0, 32, (2, 9)), jnp.int32)
    adapted = logits(config, params, tokens)
    assert np.abs(adapted - logits(config, lora.without_adapters(params), tokens)).max() > 0.1
    merged = lora.merged(params, config)
    np.testing.assert_allclose(
        logits(lora.base_config(config), merged, tokens), adapted, atol=2e-5, rtol=1e-5
    )


# TRAIN STEP


def build(config, mesh_shape=(2, 2, 2), kl_coef=0.0):
    mesh = sharding.make_mesh(mesh_shape)
    model = model_lib.Transformer(config)
    with_reference = kl_coef > 0
    state, shardings = train_step_lib.init_train_state(
        model, OPTIMIZER, jax.random.key(0), mesh, RULES, with_reference=with_reference
    )
    step = train_step_lib.make_train_step(
        model,
        OPTIMIZER,
        objectives.LossConfig(name="ppo", kl_coef=kl_coef),
        mesh,
        RULES,
        shardings,
        train_step_lib.batch_shardings(mesh, RULES, make_batch(0)),
    )
    return state, shardings, step


def test_only_the_adapters_train_and_have_adam_state():
    state, _, step = build(LORA)
    before = jax.device_get(state.params)
    adapter_bytes = lora.adapter_bytes(before)
    # Adam's two moments for the adapters, and nothing for the base.
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim]
    assert sum(x.nbytes for x in moments) == 2 * adapter_bytes
    state, metrics = step(state, make_batch(1))
    assert int(metrics["skipped"]) == 0
    after = jax.device_get(state.params)
    for k, v in flat(after).items():
        moved = np.abs(v - flat(before)[k]).max()
        if lora.is_adapter(tuple(k.split("/"))):
            assert k.endswith("_lora_a") or moved > 0, k  # B moves; A may move after B
        else:
            assert moved == 0, k


def test_the_adapter_gradient_is_the_chain_rule_of_the_base_gradient():
    """dL/dB at B = 0 is scale * A^T dL/dW (y = x W + scale x A B), dL/dW from the model
    without adapters: an independent check of what the LoRA step differentiates."""
    from replax.rl import gradients

    params = init(LORA)
    adapters, base = lora.partition(params, True)
    batch = make_batch(2)
    loss = objectives.LossConfig(name="ppo")
    lora_grads, _ = gradients.make_gradient_fn(model_lib.Transformer(LORA), loss)(
        adapters, None, batch, frozen=base
    )
    base_grads, _ = gradients.make_gradient_fn(model_lib.Transformer(BASE), loss)(base, None, batch)
    assert set(flat(lora_grads)) == set(flat(adapters))
    for layer in ("layer_0", "layer_1"):
        for block, name in (("attn", "q"), ("attn", "o"), ("mlp", "down")):
            a = np.asarray(adapters[layer][block][f"{name}_lora_a"])  # [*in, r]
            dw = np.asarray(base_grads[layer][block][name])  # [*in, *out]
            db = np.asarray(lora_grads[layer][block][f"{name}_lora_b"])  # [r, *out]
            a2 = a.reshape(-1, a.shape[-1])  # [in, r]
            expected = LORA.lora_scale * a2.T @ dw.reshape(a2.shape[0], -1)  # [r, out]
            np.testing.assert_allclose(db.reshape(db.shape[0], -1), expected, atol=1e-6, rtol=1e-4)


def test_the_adapters_shard_with_the_layer_they_adapt():
    _, shardings, _ = build(LORA)
    specs = flat(jax.tree.map(lambda s: s.spec, shardings.params))
    for path, spec in specs.items():
        if not path.endswith("_lora_a") and not path.endswith("_lora_b"):
            continue
        weight = specs[path[: -len("_lora_a")]]
        if path.endswith("_lora_a"):  # [*in, r]: the weight's input axes, the rank replicated
            assert tuple(spec)[:-1] == tuple(weight)[: len(spec) - 1] and spec[-1] is None
        else:  # [r, *out]
            n_out = len(spec) - 1
            assert spec[0] is None and tuple(spec)[1:] == tuple(weight)[-n_out:], path
    # At least one adapter is really split (not everything replicated).
    assert any(any(a is not None for a in s) for p, s in specs.items() if "lora" in p)


def test_the_kl_reference_is_the_base_with_no_copy_of_it():
    state, _, step = build(LORA, kl_coef=0.1)
    assert state.reference_params is None
    batch = make_batch(3)
    state, metrics = step(state, batch)
    # At init the policy is its base: the KL to the reference is zero exactly.
    assert float(metrics["kl"]) == 0.0
    state, metrics = step(state, batch)
    assert float(metrics["kl"]) > 0.0


# FINGERPRINT


def test_the_fingerprint_tells_bases_apart_and_ignores_the_adapters():
    a, b = init(LORA, seed=0), init(LORA, seed=1)
    fa = lora.fingerprint_of_params(a, "x")
    assert fa == lora.fingerprint_of_params(lora.without_adapters(a), "x")
    assert fa["sha256"] != lora.fingerprint_of_params(b, "x")["sha256"]


# RUNS (scripts/train.py on configs/arith.py, tiny)


def _model_config(workdir):
    import json
    import os

    from replax.config import spec as spec_lib

    with open(os.path.join(workdir, "config.json")) as f:
        return spec_lib.parse(json.load(f)).model.config()


# Without a decode dtype the sampler applies the adapters; with one it merges them.
@pytest.mark.parametrize("decode_dtype", ["", "float32"])
def test_a_disjoint_lora_run_syncs_only_the_adapters(tmp_path, decode_dtype):
    from micro_run import read, run_train

    workdir = str(tmp_path / "run")
    proc = run_train(
        workdir,
        "--config.model.lora_rank=4",
        "--config.loss.kl_coef=0.05",
        "--config.rollout.placement=disjoint",
        f"--config.rollout.dtype={decode_dtype}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read(workdir)
    params = init(_model_config(workdir))
    whole = sum(x.nbytes for x in jax.tree.leaves(params))
    # The base went to the sampler once, before the first record (generations 0 and 1 both
    # start at step 0); every sync since moved the adapters alone.
    assert {r["sync_bytes"] for r in records} == {lora.adapter_bytes(params)}
    assert lora.adapter_bytes(params) < whole / 2
    assert all(np.isfinite(r["kl"]) for r in records)


def _check_exports(workdir, tmp_path, base_dir):
    """scripts/export.py on a LoRA run: a PEFT adapter, and merged weights whose model
    (no adapters) gives the run's adapted logits."""
    import json
    import subprocess
    import sys

    from micro_run import ROOT

    from replax.config import spec as spec_lib
    from replax.hf import checkpoint as hf
    from replax.run import assemble as run_lib
    from replax.run import checkpoint, frozen_base

    adapter, merged = str(tmp_path / "adapter"), str(tmp_path / "merged")
    for out, extra in ((adapter, ["--adapter_only"]), (merged, [])):
        cmd = [sys.executable, "scripts/export.py", f"--workdir={workdir}", f"--out={out}"]
        proc = subprocess.run(cmd + extra, cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
    with open(f"{adapter}/adapter_config.json") as f:
        saved = json.load(f)
    assert saved["r"] == 2 and saved["base_model_name_or_path"] == base_dir
    with open(f"{workdir}/config.json") as f:
        run = run_lib.build(spec_lib.parse(json.load(f)), workdir)
    reader = checkpoint.Checkpointer(f"{workdir}/checkpoints")
    abstract = run_lib.abstract_states(run)[0]
    state = frozen_base.restore_train_state(run, reader, 2, abstract)
    reader.close()
    config, params = hf.load_pretrained(merged, max_len=run.model_config.max_len)
    assert config.lora_rank == 0 and not lora.has_adapters(params)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 12)), jnp.int32)
    np.testing.assert_allclose(
        logits(config, params, tokens),
        logits(run.model_config, jax.device_get(state.params), tokens),
        atol=1e-5,
    )


def test_a_changed_base_refuses_to_resume_in_one_line(tmp_path):
    from micro_run import run_train

    from replax.hf import checkpoint as hf

    base_dir, workdir = str(tmp_path / "base"), str(tmp_path / "run")
    # configs/arith.py's byte vocabulary and max_len at test_trainer.MICRO's shape.
    config = model_lib.ModelConfig(
        vocab_size=264,
        num_layers=1,
        d_model=32,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        mlp_dim=64,
        max_len=32,
    )
    hf.save_pretrained(base_dir, config, init(config, seed=1))
    args = (
        "--config.model.init=checkpoint",
        f"--config.model.checkpoint={base_dir}",
        "--config.model.lora_rank=2",
        "--config.checkpoint_every=2",
    )
    proc = run_train(workdir, *args, "--config.total_steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_exports(workdir, tmp_path, base_dir)
    # The same base resumes; another one written in its place does not.
    proc = run_train(workdir, *args, "--config.total_steps=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    hf.save_pretrained(base_dir, config, init(config, seed=2))
    proc = run_train(workdir, *args, "--config.total_steps=4")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert "adapters belong to" in lines[-1] and "model.checkpoint=" in lines[-1], lines[-3:]
