"""The rollout engine's whole program of one batch (`replax.sampling.engine` binds and
jits `run`): prefill the queue, rounds of harvest, refill and K decode steps while
rollouts are queued, then the drain that decodes the last ones to the end, stepping the
slots down as they come to fit in fewer (`rollout.drain_halvings`).

    out, stats = run(params, prompt_ids, prompt_mask, rng, sampling, G, row_block, settings)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from replax.sampling import decode as decode_lib
from replax.sampling.decode import SampleOutput
from replax.sampling.distributions import SamplingConfig
from replax.sampling.slots import (
    EngineStats,
    Settings,
    Slots,
    _rows,
    chunk,
    decode_chunk,
    empty_slots,
    empty_table,
    harvest,
    prefill_queue,
    refill,
)


def drain_sizes(slots: int, halvings: int, data_shards: int) -> tuple[int, ...]:
    """The slot counts `drain` steps down to: S / 2, S / 4, ... (`halvings` of them), each
    a whole multiple of the data shards, or a ValueError naming what is allowed."""
    # S / 2^H whole and a multiple of the shards makes every size before it one too.
    if halvings < 0 or slots % 2**halvings or (slots >> halvings) % data_shards:
        raise ValueError(
            f"rollout.drain_halvings={halvings}: allowed is 0 <= drain_halvings with "
            f"rollout.slots={slots} / 2^drain_halvings a whole multiple of the sampler's "
            f"{data_shards} data shards"
        )
    return tuple(slots >> i for i in range(1, halvings + 1))


def _compact(state: Slots, size: int, settings: Settings) -> Slots:
    """The first `size` slots of `state` with its live ones first (at most `size` are)."""
    keep = jnp.argsort(state.done, stable=True)[:size]
    take = lambda x: jnp.take(x, keep, axis=0)
    cache = jax.tree_util.tree_map(lambda x: _rows(x, keep), state.cache)
    rows = [f.name for f in dataclasses.fields(Slots) if f.name != "cache"]
    fields = {name: take(getattr(state, name)) for name in rows}
    return Slots(cache=decode_lib._constrain_cache(cache, settings.model.config), **fields)


def drain(params, head, state: Slots, table, stats, sampling, settings: Settings):
    """Decodes the slots to the end once the queue is empty. With drain_halvings h the
    slots step down to S / 2, ..., S / 2^h as the live rollouts come to fit (the stopped
    ones handed to the table first): the long tail of the last rollouts then decodes in
    fewer rows rather than beside empty ones. Each size is a loop of its own shapes in
    the one program; while stepping down the old and new slots are both held, 1.5x the
    slots' cache at the first."""

    def decode_while(state, stats, more):
        def body(carry):
            state, stats = carry
            state, steps, useful = decode_chunk(params, head, state, sampling, settings)
            rows = steps * state.done.shape[0]
            zero = jnp.zeros((), jnp.int32)
            return state, jax.tree_util.tree_map(
                jnp.add, stats, EngineStats(steps, useful, zero, rows)
            )

        return jax.lax.while_loop(lambda carry: more(carry[0]), body, (state, stats))

    sizes = drain_sizes(settings.slots, settings.drain_halvings, settings.data_shards)
    for size in sizes:
        over = lambda state, size=size: jnp.sum(~state.done) > size  # live rows
        state, stats = decode_while(state, stats, over)
        state, table = harvest(state, table, settings)
        state = _compact(state, size, settings)
    state, stats = decode_while(state, stats, lambda state: ~jnp.all(state.done))
    return state, table, stats


def run(
    params,
    prompt_ids,
    prompt_mask,
    rng,
    first_rollout,
    sampling: SamplingConfig,
    num_samples: int,
    row_block: tuple[int, int],
    settings: Settings,
) -> tuple[SampleOutput, EngineStats]:
    """The traced engine over one batch: prompt_ids int32[B, P], prompt_mask bool[B, P]
    (left-padded), G = num_samples rollouts of each, R = B x G, queued prompt by prompt;
    row_block (i, n): these are rollouts [i R, (i + 1) R) of a batch of n R, numbered from
    first_rollout (int32[]) in the run: the indices of their keys. Prefill, then chunks
    until the queue is empty and every slot stopped."""
    b, p = prompt_ids.shape
    total = b * num_samples
    n = settings.max_new_tokens
    # PREFILL each prompt once.
    queue = prefill_queue(
        params,
        prompt_ids,
        prompt_mask,
        rng,
        first_rollout + row_block[0] * total,
        num_samples,
        settings,
    )
    head = decode_lib.decode_head(params, settings.model.config)  # once a generation

    # CHUNKS of K decode steps, the slots refilled between them, to the end; or, stepping
    # down (drain_halvings), while rollouts are queued, then DRAIN the last ones.
    def more(carry):
        state, _, next_rollout, _ = carry
        if settings.drain_halvings:
            return next_rollout < total
        return (next_rollout < total) | ~jnp.all(state.done)

    def body(carry):
        state, table, next_rollout, stats = carry
        state, table, next_rollout, new = chunk(
            params, head, state, queue, table, next_rollout, sampling, num_samples, settings
        )
        stats = jax.tree_util.tree_map(jnp.add, stats, new)
        return state, table, next_rollout, stats

    # The FIRST FILL admits every slot; later refills at most `max_admit` (their copies
    # bounded by it), as a few slots free up every K steps.
    zero = jnp.zeros((), jnp.int32)
    state, next_rollout, admitted = refill(
        empty_slots(settings, p), queue, zero, total, num_samples, settings, settings.slots
    )
    stats = EngineStats(zero, zero, admitted.astype(jnp.int32), zero)
    carry = (state, empty_table(total, settings), next_rollout, stats)
    state, table, _, stats = jax.lax.while_loop(more, body, carry)
    if settings.drain_halvings:
        state, table, stats = drain(params, head, state, table, stats, sampling, settings)
    _, table = harvest(state, table, settings)

    # OUTPUT in queue order, as the static sampler lays it out.
    mask = jnp.arange(n) < table["lengths"][:, None]  # [R, N]
    out = SampleOutput(
        tokens=jnp.where(mask, table["tokens"], settings.pad_id),
        mask=mask,
        logprobs=jnp.where(mask, table["logprobs"], 0.0),
        lengths=table["lengths"],
    )
    return out, stats
