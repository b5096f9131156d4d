"""Tests for replax/rl/weight_sync.py: what crosses from the trainer's devices to the
sampler's at each sync, observed where arrays are placed (every `jax.device_put` and
`processes.copy_to_process_mesh` call, wherever it is made), not read off the code's own
byte count. With LoRA the first sync moves the whole tree and every later one the
adapters alone; the sampler's copy of the base is then the same arrays, and its params
equal the trainer's. tests/scripts/test_multihost.py checks the same across processes."""

import dataclasses

import jax
import numpy as np
import optax
import pytest

from replax.core import processes, sharding
from replax.model import lora
from replax.model import transformer as model_lib
from replax.rl import placement, weight_sync
from replax.rl import train_step as train_step_lib
from replax.sampling import sampler as sampler_lib

CONFIG = model_lib.ModelConfig(
    vocab_size=32,
    num_layers=1,
    d_model=16,
    num_heads=4,
    num_kv_heads=2,
    head_dim=4,
    mlp_dim=32,
    max_len=12,
    lora_rank=2,
)
RULES = sharding.validate_rules(sharding.DEFAULT_RULES)


class Crossings:
    """The arrays on the trainer's devices handed to a placement (jax.device_put or the
    copy across processes) since the last `clear`."""

    def __init__(self, monkeypatch, trainer_devices):
        self.arrays = []
        trainer = set(trainer_devices)
        real_put, real_copy = jax.device_put, processes.copy_to_process_mesh

        def put(x, *args, **kwargs):
            self.arrays += [
                y
                for y in jax.tree.leaves(x)
                if isinstance(y, jax.Array) and y.sharding.device_set == trainer
            ]
            return real_put(x, *args, **kwargs)

        def copy(leaves, *args, **kwargs):
            self.arrays += list(leaves)
            return real_copy(leaves, *args, **kwargs)

        monkeypatch.setattr(jax, "device_put", put)
        monkeypatch.setattr(processes, "copy_to_process_mesh", copy)

    def ids(self):
        return {id(x) for x in self.arrays}

    def clear(self):
        self.arrays = []


def _bump_adapters(params):
    """The params after a train step: the adapters moved, the base as it was."""
    return jax.jit(
        lambda p: jax.tree_util.tree_map_with_path(
            lambda path, x: x + 0.25 if "lora" in jax.tree_util.keystr(path) else x, p
        )
    )(params)


def _ids(tree):
    return {id(x) for x in jax.tree.leaves(tree)}


@pytest.mark.parametrize("rank, decode_dtype", [(2, None), (2, "float32"), (0, None)])
def test_after_the_first_sync_only_the_adapters_cross(monkeypatch, rank, decode_dtype):
    config = dataclasses.replace(CONFIG, lora_rank=rank)
    trainer_devices, sampler_devices = placement.split_devices(4)
    mesh = sharding.make_mesh((1, 2, 2), devices=trainer_devices)
    state, _ = train_step_lib.init_train_state(
        model_lib.Transformer(config), optax.adam(1e-3), jax.random.key(0), mesh, RULES
    )
    sampler = sampler_lib.make_sampler(
        config,
        max_prompt_len=4,
        max_new_tokens=4,
        stop_ids=(31,),
        pad_id=0,
        mesh=sharding.make_mesh((1, 2, 2), devices=sampler_devices),
        rules=RULES,
        dtype=decode_dtype,
    )
    crossed = Crossings(monkeypatch, trainer_devices)
    sync = weight_sync.WeightSync(sampler, config)
    first = sync(state.params)
    assert crossed.ids() == _ids(state.params)  # the whole tree, once
    crossed.clear()
    params = _bump_adapters(state.params)
    second = sync(params)
    adapters, base = lora.partition(params, rank > 0)
    moved = sum(x.nbytes for x in crossed.arrays)
    assert sync.bytes == moved  # the reported bytes are those that crossed
    if rank == 0:  # full fine-tuning: the whole tree every time
        assert crossed.ids() == _ids(params)
    else:
        assert crossed.ids() == _ids(adapters) and not crossed.ids() & _ids(base)
        assert moved == lora.adapter_bytes(params) < sum(x.nbytes for x in jax.tree.leaves(base))
    # What the sampler decodes with is the trainer's params (merged when it merges).
    expected = jax.device_get(params)
    if sampler.merges_adapters:
        expected = lora.merged(expected, config)
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6),
        jax.device_get(second),
        expected,
    )
    assert all(x.sharding.device_set == set(sampler_devices) for x in jax.tree.leaves(second))
    if rank and not sampler.merges_adapters:
        # The sampler's base is the one it received at the first sync, the same arrays.
        kept, again = lora.partition(first, True)[1], lora.partition(second, True)[1]
        assert all(a is b for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(again)))
