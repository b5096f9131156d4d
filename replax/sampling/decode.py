"""The traced decode loop: one prefill call, then every new token inside `lax.while_loop`.

Prompts come left-padded (`prompt_ids int32[B, P]`, `prompt_mask bool[B, P]`), so every
row's last prompt token sits in slot P - 1 and the t-th new token goes to slot P + t of
the KV cache for every row alike; positions continue from each row's prompt length. The
prefill writes slots [0, P - 1); iteration t of the loop feeds the token in slot P - 1 + t
(the last prompt token, then each sampled one), samples token t and stops early once
every row has produced a stop token. The loop runs in up to four segments, each over a cache just
long enough for it, so that early steps do not read slots that are not written yet.

`decode` is a pure function of params, prompts, rng and the sampling setting;
`replax.sampling.sampler.Sampler` validates the settings, binds them and jits it.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax
import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import PartitionSpec as P

from replax.core import sharding
from replax.model import attention, layers
from replax.model import transformer as model_lib
from replax.model.logprobs import mask_vocab
from replax.sampling.distributions import SamplingConfig, sample_tokens


@flax.struct.dataclass
class SampleOutput:
    tokens: jax.Array  # int32[B, N] completion; pad_id after EOS (EOS itself kept)
    mask: jax.Array  # bool[B, N] generated tokens, up to and including EOS
    logprobs: jax.Array  # float32[B, N] behaviour log-probs; 0 where mask is False
    lengths: jax.Array  # int32[B] number of generated tokens (= mask.sum(-1))


# Decode-loop segments: at most this many, each at least this many steps long.
_MAX_SEGMENTS = 4
_MIN_SEGMENT_STEPS = 16


def _segment_ends(num_steps: int) -> tuple[int, ...]:
    """Exclusive end step of each segment of the decode loop, e.g. 64 -> (16, 32, 48, 64)."""
    length = max(_MIN_SEGMENT_STEPS, -(-num_steps // _MAX_SEGMENTS))
    return tuple(range(length, num_steps, length)) + (num_steps,)


def vocab_axes(vocab: int) -> tuple[str, ...] | None:
    """The mesh axes (those of size > 1) to split a vocabulary of this size over, or None
    off a mesh or where it does not divide."""
    mesh = jax.sharding.get_abstract_mesh()
    # The split is for accelerators' HBM; CPU devices (tests, simulated meshes) keep the
    # training layout and with it the numerics their earlier runs had.
    if mesh.empty or attention.target_platform() == "cpu":
        return None
    axes = tuple(a for a in mesh.axis_names if mesh.shape[a] > 1)
    if not axes or vocab % math.prod(mesh.shape[a] for a in axes):
        return None
    return axes


def decode_head(params, config: model_lib.ModelConfig):
    """The output projection [E, V] laid out for decoding: split over the vocabulary
    across every axis of the mesh. The training layout splits it over the embedding
    (fsdp), so each decode step would gather all of it into every device's HBM and read
    it back (on the real configs the largest item of a step). Laid out once a generation
    by the vocabulary, a step reads only its device's share; `step_logits` then hands
    each row's logits to the row's device. Unchanged off a mesh, or where the vocabulary
    does not divide."""
    head = model_lib.output_head(flax.linen.meta.unbox(params), config)
    axes = vocab_axes(head.shape[1])
    if axes is None:
        return head
    return jax.lax.with_sharding_constraint(head, P(None, axes))


def step_logits(model: model_lib.Transformer, params, head, tokens, positions, **cached):
    """(fp32 logits [B, T, V], cache) of a cached model call through `decode_head`'s
    head: computed split by vocabulary (the rows' final states [B, T, E] are kilobytes
    to gather), then split by rows for sampling (each row's V logits to its device)."""
    # Under the weight-stationary rules: the rows' activations whole over the axes that
    # split the weights, so no weight is gathered (the cache stays split by rows).
    rules = sharding.weight_stationary_rules(nn.get_logical_axis_rules())
    with nn.logical_axis_rules(rules):
        hidden, cache = model.apply(
            {"params": params}, tokens, positions, return_hidden=True, **cached
        )
    logits = layers.dense(hidden, head).astype(jnp.float32)  # [B, T, V]
    axes = vocab_axes(head.shape[1])
    if axes is None:
        return layers.constrain(logits, ("batch", "length", None)), cache
    logits = jax.lax.with_sharding_constraint(logits, P(None, None, axes))
    # Rows over the same axes when they divide: on a tensor-parallel mesh the logical
    # batch is not split, and holding every row's V logits on each device (then sorting
    # them for top-p) would cost more HBM traffic than the rest of the step.
    mesh = jax.sharding.get_abstract_mesh()
    if logits.shape[0] % math.prod(mesh.shape[a] for a in axes) == 0:
        return jax.lax.with_sharding_constraint(logits, P(axes, None, None)), cache
    return layers.constrain(logits, ("batch", "length", None)), cache


def _constrain_cache(cache, config: model_lib.ModelConfig):
    """Every KV-cache leaf ([B, KV, S, D] per layer, or [L, B, KV, S, D] with the layers
    stacked: batch is axis -4 and length axis -2 either way) held to its logical axes."""
    axes = model_lib.cache_axes(config)
    return jax.tree_util.tree_map(lambda x: layers.constrain(x, axes), cache)


def _grow_cache(cache, config: model_lib.ModelConfig, length: int):
    """Zero-pads the length axis (-2) of every key and value array to `length` slots."""

    def grow(x):
        pad = length - x.shape[-2]
        return jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pad), (0, 0)]) if pad else x

    return _constrain_cache(jax.tree_util.tree_map(grow, cache), config)


@flax.struct.dataclass
class _LoopState:
    step: jax.Array  # int32[] index t of the token sampled in this iteration
    last_tokens: jax.Array  # int32[R] token fed in this iteration (at slot P - 1 + t)
    tokens: jax.Array  # int32[R, N]
    logprobs: jax.Array  # float32[R, N]
    done: jax.Array  # bool[R] EOS already sampled
    # KV cache: keys and values [R, KV, S, D] (per layer, or stacked [L, R, KV, S, D]);
    # S grows per segment up to P + N - 1.
    cache: Any


def _prefill(
    variables,
    prompt_ids,
    prompt_positions,
    kv_mask,
    *,
    model,
    cache_len,
    cache_dtype,
    num_samples: int,
    data_shards: int,
):
    """The KV cache of R = B x G rows, each prompt run through the model once.

    prompt_ids, prompt_positions int32[B, P]; kv_mask bool[B, cache_len]. Fills slots
    [0, P - 1) for the B prompts, then repeats each prompt's cache G times along the batch
    axis (rows of one prompt consecutive). When the data shards do not divide B (they
    divide R), the prefill runs on B padded with empty rows up to a multiple of them.
    """
    b, p = prompt_ids.shape
    padded = -(-b // data_shards) * data_shards
    if padded > b:
        pad = ((0, padded - b), (0, 0))
        prompt_ids, prompt_positions = jnp.pad(prompt_ids, pad), jnp.pad(prompt_positions, pad)
        kv_mask = jnp.pad(kv_mask, pad)  # empty rows: no valid key, finite attention
    cache = model_lib.init_cache(model.config, padded, cache_len, cache_dtype)
    cache = _constrain_cache(cache, model.config)
    # The last prompt token is fed by the first loop iteration, so the prefill's logits
    # are unused and compiled away.
    _, cache = model.apply(
        variables,
        prompt_ids[:, :-1],
        prompt_positions[:, :-1],
        cache=cache,
        cache_index=0,
        kv_mask=kv_mask,
    )

    def per_row(x):  # [.., padded, KV, S, D] -> [.., B x G, KV, S, D]
        x = jax.lax.slice_in_dim(x, 0, b, axis=x.ndim - 4)
        return jnp.repeat(x, num_samples, axis=x.ndim - 4)

    return _constrain_cache(jax.tree_util.tree_map(per_row, cache), model.config)


def rollout_uniforms(rng, rollout_ids, max_new_tokens: int):
    """float32[R, N]: the uniforms rollout i draws its N tokens with, from its own key
    fold_in(rng, i) (rollout_ids int32[R]): the same wherever and beside whatever it is
    decoded."""
    draw = lambda i: jax.random.uniform(jax.random.fold_in(rng, i), (max_new_tokens,))
    return jax.vmap(draw)(rollout_ids)


def _kv_mask(prompt_mask, max_new_tokens: int):
    """bool[B, P + N - 1]: the valid cache slots. Completion slots are always valid keys:
    the causal mask hides those not yet written."""
    b = prompt_mask.shape[0]
    return jnp.concatenate([prompt_mask, jnp.ones((b, max_new_tokens - 1), bool)], axis=1)


def prefill_prompts(
    params,
    prompt_ids,
    prompt_mask,
    *,
    model,
    max_new_tokens: int,
    cache_dtype,
    num_samples: int,
    data_shards: int,
):
    """The KV cache the decode loop starts from: its first segment's slots, with
    [0, P - 1) holding the B left-padded prompts' keys and values, repeated for the
    R = B x num_samples rows."""
    b, p = prompt_ids.shape
    first_length = p - 1 + _segment_ends(max_new_tokens)[0]  # cache slots of the first segment
    if p == 1:  # nothing to prefill: the loop feeds the only prompt token
        cache = model_lib.init_cache(model.config, b * num_samples, first_length, cache_dtype)
        return _constrain_cache(cache, model.config)
    return _prefill(
        {"params": params},
        prompt_ids,
        model_lib.positions_from_mask(prompt_mask),
        _kv_mask(prompt_mask, max_new_tokens)[:, :first_length],
        model=model,
        cache_len=first_length,
        cache_dtype=cache_dtype,
        num_samples=num_samples,
        data_shards=data_shards,
    )


def decode(
    params,
    prompt_ids,
    prompt_mask,
    rng,
    first_rollout,
    sampling: SamplingConfig,
    num_samples: int,
    row_block: tuple[int, int] = (0, 1),
    rollout_keys: bool = False,
    *,
    model: model_lib.Transformer,
    max_new_tokens: int,
    stop_ids: tuple[int, ...],
    pad_id: int,
    vocab_size: int | None,
    cache_dtype,
    data_shards: int,
) -> SampleOutput:
    """The traced sampler. prompt_ids int32[B, P], prompt_mask bool[B, P] (left-padded):
    G = num_samples completions of each, R = B x G rows. row_block (i, n): these are rows
    [i R, (i + 1) R) of n R decoded together under the same rng, and draw those rows'
    random numbers (a process decoding its block of a batch alone). rollout_keys: row r
    draws from `rollout_uniforms(rng, first_rollout + i R + r)` alone, so that a rollout
    does not depend on the rows decoded beside it (what `replax.sampling.engine` draws);
    first_rollout (int32[], traced) numbers the batch's rollouts within a longer run."""
    b, p = prompt_ids.shape
    rows = b * num_samples
    is_stop = lambda tokens: jnp.isin(tokens, jnp.asarray(stop_ids, jnp.int32))
    n = max_new_tokens
    prompt_positions = model_lib.positions_from_mask(prompt_mask)  # [B, P]
    kv_mask = _kv_mask(prompt_mask, n)  # [B, S]

    # PREFILL slots [0, P - 1) once per prompt, then broadcast to the R rows.
    cache = prefill_prompts(
        params,
        prompt_ids,
        prompt_mask,
        model=model,
        max_new_tokens=n,
        cache_dtype=cache_dtype,
        num_samples=num_samples,
        data_shards=data_shards,
    )
    repeat = lambda x: jnp.repeat(x, num_samples, axis=0)  # [B, ...] -> [R, ...]
    kv_mask, last_positions = repeat(kv_mask), repeat(prompt_positions[:, -1])

    head = decode_head(params, model.config)  # once a generation, not once a step

    def next_logits(cache, last_tokens, step, kv_mask):
        """Logits for the token at `step`, fed the token before it at slot P - 1 + step."""
        positions = (last_positions + step)[:, None]  # [R, 1]
        logits, cache = step_logits(
            model,
            params,
            head,
            last_tokens[:, None],
            positions,
            cache=cache,
            cache_index=p - 1 + step,
            kv_mask=kv_mask,
        )
        return logits[:, 0], cache

    def cond(state: _LoopState, end: int):
        return (state.step < end) & ~jnp.all(state.done)

    def body(state: _LoopState, kv_mask):
        logits, cache = next_logits(state.cache, state.last_tokens, state.step, kv_mask)
        logits = mask_vocab(logits, vocab_size)
        tokens, logprobs = sample_tokens(uniforms[state.step], logits, sampling)
        tokens = jnp.where(state.done, pad_id, tokens)
        logprobs = jnp.where(state.done, 0.0, logprobs)
        return _LoopState(
            step=state.step + 1,
            last_tokens=tokens,
            tokens=jax.lax.dynamic_update_slice(state.tokens, tokens[:, None], (0, state.step)),
            logprobs=jax.lax.dynamic_update_slice(
                state.logprobs, logprobs[:, None], (0, state.step)
            ),
            done=state.done | is_stop(tokens),
            cache=cache,
        )

    # DECODE the R rows. The random numbers of every step are drawn at once, outside the
    # loop (on CPU each draw inside it would be a loop of its own), as for R prompts.
    block, num_blocks = row_block
    if rollout_keys:  # row r is rollout block R + r, drawing from its own key
        ids = first_rollout + block * rows + jnp.arange(rows)
        uniforms = rollout_uniforms(rng, ids, n).T  # [N, R]
    else:
        uniforms = jax.random.uniform(rng, (n, rows * num_blocks), jnp.float32)  # [N, nR]
        uniforms = jax.lax.slice_in_dim(uniforms, block * rows, (block + 1) * rows, axis=1)
    state = _LoopState(
        step=jnp.zeros((), jnp.int32),
        last_tokens=repeat(prompt_ids[:, -1]),
        tokens=jnp.full((rows, n), pad_id, jnp.int32),
        logprobs=jnp.zeros((rows, n), jnp.float32),
        done=jnp.zeros((rows,), bool),
        cache=cache,
    )
    # The loop runs in a few segments, each over a cache just long enough for its last
    # step, so that early steps do not attend over (read) slots not yet written. Between
    # segments the cache grows by zero padding: one copy per segment, not per step.
    for end in _segment_ends(n):
        length = p - 1 + end
        state = state.replace(cache=_grow_cache(state.cache, model.config, length))
        state = jax.lax.while_loop(
            functools.partial(cond, end=end),
            functools.partial(body, kv_mask=kv_mask[:, :length]),
            state,
        )

    # OUTPUT: each row up to and including its first stop token; when every row stopped
    # early, the columns never visited stay pad.
    stopped = is_stop(state.tokens)
    mask = (jnp.cumsum(stopped, axis=1) - stopped < 1) & (jnp.arange(n) < state.step)  # [R, N]
    return SampleOutput(
        tokens=jnp.where(mask, state.tokens, pad_id),
        mask=mask,
        logprobs=jnp.where(mask, state.logprobs, 0.0),
        lengths=jnp.sum(mask, axis=1, dtype=jnp.int32),
    )
