"""The trainer's weights onto the sampler's devices, for disjoint placement.

Every array that goes from the trainer's devices to the sampler's goes through
`transfer`: in one process, one `jax.device_put` of the whole tree given; across
processes (a trainer spanning hosts, each with a sampler of its own devices), the
two-step copy of `processes.copy_to_process_mesh`, whose reshard every process takes
part in. With LoRA the base is frozen, so it crosses once, with the first sync, and is
kept on the sampler's devices; every later sync gives `transfer` the adapters alone.
The sampler then casts them (and the base, once) to its dtype, or merges them into the
base it keeps (`Sampler.merges_adapters`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
from flax import traverse_util

from replax.core import processes
from replax.model import lora


def transfer(tree, targets, stage_cache: dict):
    """`tree` (arrays on the trainer's devices) on `targets` (NamedShardings of the
    sampler's mesh, the same structure), as it is: no cast. stage_cache: the compiled
    reshards of `copy_to_process_mesh`, kept per target tree."""
    leaves, structure = jax.tree.flatten(tree)
    target_leaves = structure.flatten_up_to(targets)
    if all(x.is_fully_addressable for x in leaves):
        moved = jax.device_put(leaves, target_leaves)
    else:
        moved = processes.copy_to_process_mesh(leaves, target_leaves, stage_cache)
    return jax.tree.unflatten(structure, moved)


def tree_bytes(tree) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


class WeightSync:
    """`sync(params)`: the trainer's params as the sampler's decode loop reads them, on its
    devices. `bytes`: what the last sync gave `transfer` (with LoRA, after the first, the
    adapters' bytes)."""

    def __init__(self, sampler, model_config):
        self.sampler = sampler
        self.lora_on = lora.enabled(model_config)
        self.bytes = 0
        self._base = None  # with LoRA: the frozen base on the sampler's devices
        self._stages = {}

    def __call__(self, params):
        params = nn.unbox(params)
        sampler = self.sampler
        if not self.lora_on:
            self.bytes = tree_bytes(params)
            return sampler.prepare_params(self._move(params))
        if self._base is None:  # the first sync: the base goes over, once
            moved = self._move(params)
            base = lora.partition(moved, True)[1]
            # Merging needs the base as the trainer has it; otherwise it is cast once.
            self._base = base if sampler.merges_adapters else sampler.cast_params(base)
            adapters = lora.partition(moved, True)[0]
            self.bytes = tree_bytes(params)
        else:
            adapters = lora.partition(params, True)[0]
            self.bytes = tree_bytes(adapters)
            adapters = self._move(adapters)
        if sampler.merges_adapters:
            return sampler.prepare_params(lora.combine(adapters, self._base))
        return lora.combine(sampler.cast_params(adapters), self._base)

    def _move(self, tree):
        """tree (the params, or a part of them) in the sampler's layout, on its devices."""
        return transfer(tree, _subtree(self.sampler.params_shardings, tree), self._stages)


def _subtree(targets, tree):
    """The leaves of `targets` at the paths of `tree` (nested dicts of the same layout)."""
    flat_targets = traverse_util.flatten_dict(targets)
    return traverse_util.unflatten_dict(
        {k: flat_targets[k] for k in traverse_util.flatten_dict(tree)}
    )
