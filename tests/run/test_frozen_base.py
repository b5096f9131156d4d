"""Tests for replax/run/frozen_base.py: a LoRA run's step checkpoints hold the adapters
(and their Adam state, the replay store, the loop state), the frozen base is stored once
and checked on resume, and an interrupted LoRA run resumes exactly."""

import dataclasses
import json
import os
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util
from micro_run import read, run_train, strip_timing

from replax.core.config_utils import ConfigError
from replax.model import lora
from replax.model import transformer as model_lib
from replax.rl import train_step as train_step_lib
from replax.run import assemble as run_lib
from replax.run import frozen_base

TINY = model_lib.ModelConfig(
    vocab_size=32,
    num_layers=1,
    d_model=16,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    mlp_dim=32,
    max_len=8,
    lora_rank=2,
)


def _state(config):
    model = model_lib.Transformer(config)
    init = train_step_lib._init_fn(model, optax.adam(1e-3), False)
    return jax.jit(lambda key: nn.unbox(init(key)))(jax.random.key(0))


@pytest.mark.parametrize("rank", [0, 2])
def test_stored_keeps_the_adapters_alone_and_whole_puts_them_back(rank):
    run = types.SimpleNamespace(model_config=dataclasses.replace(TINY, lora_rank=rank))
    state = _state(run.model_config)
    kept = frozen_base.stored(run, state)
    names = list(traverse_util.flatten_dict(kept.params))
    if rank == 0:  # full fine-tuning: the whole train state, as it was
        assert kept is state
        return
    assert names and all(lora.is_adapter(k) for k in names)
    assert len(names) == 2 * len(TINY.lora_targets)
    back = frozen_base.whole(run, kept, lora.without_adapters(state.params))
    jax.tree.map(np.testing.assert_array_equal, back, state)
    # The ShapeDtypeStructs a checkpoint restores into split the same way.
    abstract = jax.eval_shape(lambda: state)
    assert jax.tree.structure(frozen_base.stored(run, abstract)) == jax.tree.structure(kept)


def test_a_base_other_than_the_saved_one_is_refused_in_one_line():
    saved = {"source": "random seed 0", "sha256": "a" * 64}
    with pytest.raises(ConfigError, match="^the checkpoint.s adapters belong to random seed") as e:
        frozen_base._check(saved, {"source": "random seed 0", "sha256": "b" * 64}, "x")
    assert "\n" not in str(e.value)
    frozen_base._check(saved, dict(saved), "x")  # the same base passes


# RUNS: tests/counting_task.py (its rewards spread under a random policy, so every step
# trains) at a shape where, as in real models, the adapters are a small part of the
# weights (2 layers, d_model 128, MLP 512; rank 4).
SHAPE = (
    "--config.model.num_layers=2",
    "--config.model.d_model=128",
    "--config.model.num_heads=4",
    "--config.model.num_kv_heads=2",
    "--config.model.head_dim=32",
    "--config.model.mlp_dim=512",
    "--config.eval.every=2",
    "--config.checkpoint_every=2",
    "--config.loss.kl_coef=0.05",  # the KL reference is the base: a wrong base shows
)
LORA = ("--config.model.lora_rank=4",)


def _train(workdir, *flags):
    return run_train(workdir, *flags, config="tests/counting_task.py")


def _bytes(directory):
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(directory)
        for name in names
    )


def _train_state_leaves(step_dir):
    """The paths of the params a step's train state holds (orbax's tree metadata)."""
    with open(os.path.join(step_dir, "train_state", "_METADATA")) as f:
        keys = json.load(f)["tree_metadata"]  # "('params', 'layer_0', 'attn', 'q_lora_a')"
    return [k for k in keys if k.startswith("('params',")]


def test_a_lora_run_checkpoints_its_adapters_and_resumes_exactly(tmp_path):
    whole, interrupted, full = (str(tmp_path / n) for n in ("whole", "interrupted", "full"))
    proc = _train(whole, *SHAPE, *LORA, "--config.total_steps=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _train(interrupted, *SHAPE, *LORA, "--config.total_steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _train(full, *SHAPE, "--config.total_steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The step holds adapters only; the base lies once beside the steps.
    step_dir = os.path.join(interrupted, "checkpoints", "2")
    params = _train_state_leaves(step_dir)
    assert params and all("_lora_" in str(p) for p in params), params[:5]
    assert os.path.isfile(os.path.join(interrupted, frozen_base.BASE_DIR, "fingerprint.json"))
    # A step's directory on disk against full fine-tuning's at the same shape.
    lora_bytes, full_bytes = _bytes(step_dir), _bytes(os.path.join(full, "checkpoints", "2"))
    ratio = lora_bytes / full_bytes
    print(f"step checkpoint bytes: LoRA {lora_bytes:,}, full {full_bytes:,}, ratio {ratio:.3f}")
    assert ratio <= 0.3
    # Resumed from step 2, the run reads as the uninterrupted one (the KL to the base too).
    proc = _train(interrupted, *SHAPE, *LORA, "--config.total_steps=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from step 2" in proc.stdout
    records = strip_timing(read(interrupted))
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert any(r.get("kl", 0) > 0 for r in records)
    assert records == strip_timing(read(whole))
    # The stored base loads and checks; changed under the adapters, it is refused.
    run, saved = _built(interrupted)
    abstract = run_lib.abstract_states(run)[0].params
    base = frozen_base.load_base(run, saved, abstract)
    assert not lora.has_adapters(base)
    _replace_first_embedding_row(os.path.join(interrupted, frozen_base.BASE_DIR, "params"))
    with pytest.raises(ConfigError, match="^the checkpoint.s adapters belong to random seed ") as e:
        frozen_base.load_base(run, saved, abstract)
    assert saved["sha256"][:12] in str(e.value) and "\n" not in str(e.value)


def _built(workdir):
    """The run of a workdir (its config.json) and its stored base's fingerprint."""
    from replax.config import spec as spec_lib

    with open(os.path.join(workdir, "config.json")) as f:
        run = run_lib.build(spec_lib.parse(json.load(f)), workdir)
    with open(os.path.join(workdir, frozen_base.BASE_DIR, frozen_base.FINGERPRINT)) as f:
        return run, json.load(f)


def _replace_first_embedding_row(path):
    """Rewrites the stored base with its first embedding row changed."""
    import orbax.checkpoint as ocp

    checkpointer = ocp.StandardCheckpointer()
    base = checkpointer.restore(path)
    base["embedding"] = np.asarray(base["embedding"]).copy()
    base["embedding"][0] += 1.0
    checkpointer.save(path, jax.tree.map(jnp.asarray, base), force=True)
    checkpointer.wait_until_finished()
