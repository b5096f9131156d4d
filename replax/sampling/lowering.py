"""A sampler's programs lowered ahead of time from abstract inputs (nothing allocated):
the whole decode program and the prefill alone, for any topology's compiler
(`replax.tools.aot` compiles them for a TPU slice on any host)."""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from replax.core import sharding
from replax.model import lora
from replax.sampling import decode as decode_lib
from replax.sampling import sampler as sampler_lib


def abstract_inputs(sampler, num_prompts: int, abstract_params):
    """The decode program's arguments as ShapeDtypeStructs with their shardings, for
    `num_prompts` prompts of max_prompt_len tokens: params in the sampler's dtype and
    layout (from the policy's abstract params), prompt ids and mask, a PRNG key and the
    index of the batch's first rollout."""
    if sampler.mesh is None:
        raise ValueError("abstract_inputs: the sampler has no mesh to place inputs on")

    def param(x, target):
        dtype = (
            sampler.dtype if jnp.issubdtype(x.dtype, jnp.floating) and sampler.dtype else x.dtype
        )
        return jax.ShapeDtypeStruct(x.shape, dtype, sharding=target)

    abstract_params = nn.unbox(abstract_params)
    if sampler.merges_adapters:  # the decode loop reads the merged weights
        abstract_params = lora.without_adapters(abstract_params)
    params = jax.tree_util.tree_map(param, abstract_params, sampler._decode_shardings)
    shape = (num_prompts, sampler.max_prompt_len)
    ids = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sampler._prompt_sharding)
    mask = jax.ShapeDtypeStruct(shape, jnp.bool_, sharding=sampler._prompt_sharding)
    first = jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding.replicated(sampler.mesh))
    return params, ids, mask, sharding.abstract_key(sampler.mesh), first


def lower(sampler, abstract_params, num_prompts: int, num_samples: int = 1, **overrides):
    """The whole decode program `Sampler.generate` runs (prefill and the token loop) for
    num_prompts x num_samples rows, lowered from abstract inputs (nothing allocated):
    `.compile()` it for the sampler mesh's devices, whatever the host's backend.
    overrides: temperature / top_k / top_p, as in `Sampler.generate`."""
    sampling = dataclasses.replace(sampler.sampling, **overrides)
    sampler_lib.Sampler._check_sampling(sampling, sampler.model_config)
    sharding.check_batch(
        "sampler batch size", num_prompts * num_samples, sampler.mesh, sampler.rules
    )
    args = abstract_inputs(sampler, num_prompts, abstract_params)
    with sharding.activation_rules(sampler.mesh, sampler.rules):
        return sampler._jitted.lower(*args, sampling, int(num_samples), (0, 1))


def lower_prefill(sampler, abstract_params, num_prompts: int, num_samples: int = 1):
    """The prefill alone (the prompts through the model into the KV cache of the
    decode loop's first segment), lowered as `lower` does: the part of the decode
    program whose cost grows with the prompt, for memory and FLOP figures."""
    params, ids, mask, _, _ = abstract_inputs(sampler, num_prompts, abstract_params)
    prefill = functools.partial(
        decode_lib.prefill_prompts,
        model=sampler.model,
        max_new_tokens=sampler.max_new_tokens,
        cache_dtype=sampler._cache_dtype,
        num_samples=int(num_samples),
        data_shards=sampler.data_shards,
    )
    jitted = jax.jit(
        prefill,
        in_shardings=(
            sampler._params_shardings,
            sampler._prompt_sharding,
            sampler._prompt_sharding,
        ),
    )
    with sharding.activation_rules(sampler.mesh, sampler.rules):
        return jitted.lower(params, ids, mask)
