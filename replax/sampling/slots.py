"""The rollout engine's slots: S decoding slots, a queue of prefilled prompts, and the
rounds that harvest stopped slots, refill free ones in queue order and decode up to K
steps (`replax.sampling.generation.run` is the whole program of one batch).

    queue = prefill_queue(params, prompt_ids, prompt_mask, rng, first, G, settings)
    state, table, next, stats = chunk(params, state, queue, table, next, sampling, G, settings)

Every function is pure and traceable.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import PartitionSpec as P

from replax.core import sharding
from replax.model import layers
from replax.model import transformer as model_lib
from replax.model.logprobs import mask_vocab
from replax.sampling import decode as decode_lib
from replax.sampling.distributions import SamplingConfig, sample_tokens


@flax.struct.dataclass
class Slots:
    """The S decoding slots. C = P - 1 + N cache slots per row."""

    cache: Any  # per layer {'k', 'v'} [S, KV, C, D] (or stacked [L, S, KV, C, D])
    kv_mask: jax.Array  # bool[S, C] valid cache slots (prompt padding False)
    last_tokens: jax.Array  # int32[S] the token fed at the next step
    last_positions: jax.Array  # int32[S] position of the slot's last prompt token
    step: jax.Array  # int32[S] tokens its rollout has sampled
    rollout: jax.Array  # int32[S] index in the queue of the rollout held; -1: empty
    done: jax.Array  # bool[S] stopped (or empty): free at the next refill
    uniforms: jax.Array  # float32[S, N] the rollout's own random numbers
    tokens: jax.Array  # int32[S, N] its completion so far (pad after it)
    logprobs: jax.Array  # float32[S, N] their behaviour log-probs


@flax.struct.dataclass
class EngineStats:
    decode_steps: jax.Array  # int32[] decode steps run
    useful_row_steps: jax.Array  # int32[] row-steps that produced a kept token
    refills: jax.Array  # int32[] refills that admitted at least one rollout
    row_steps: jax.Array  # int32[] row-steps decoded: each step times the slots it ran


def _rows(x, index):
    """x[index] along the batch axis (-4) of a cache leaf."""
    return jnp.take(x, index, axis=x.ndim - 4)


def row_major(cache, xp=jnp):
    """Cache leaves [.., rows, KV, C, D] (layer-major, the decoder's layout) with the row
    axis (-4) moved first; `xp` is jax.numpy for traced arrays, numpy for saved ones."""
    return jax.tree_util.tree_map(lambda x: xp.moveaxis(x, x.ndim - 4, 0), cache)


def layer_major(cache):
    """The inverse of `row_major`."""
    return jax.tree_util.tree_map(lambda x: jnp.moveaxis(x, 0, x.ndim - 4), cache)


@flax.struct.dataclass
class Queue:
    """The queued rollouts, their prompts prefilled once: rollout i is sample i % G of
    prompt i // G. Every device holds the tables whole (a slot may take any rollout)."""

    # per layer {'k', 'v'} [B, KV, P - 1, D] (or stacked [B, L, KV, P - 1, D]: prompt axis
    # first, the slot-major order the refill copies in; None when P = 1)
    prefix: Any
    kv_mask: jax.Array  # bool[B, C] valid cache slots of a slot holding the prompt
    last_tokens: jax.Array  # int32[B] each prompt's last token (fed at step 0)
    last_positions: jax.Array  # int32[B] its position
    uniforms: jax.Array  # float32[R, N] each rollout's random numbers, from its own key


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the engine's programs are specialised to (static under jit)."""

    model: model_lib.Transformer
    slots: int
    refill_every: int
    max_new_tokens: int
    stop_ids: tuple[int, ...]
    pad_id: int
    vocab_size: int | None
    cache_dtype: Any
    data_shards: int
    drain_halvings: int = 0  # see `drain`
    # At most this many slots take a rollout at one refill (0: every free slot); a
    # multiple of the data shards, each shard admitting its share. See `refill`.
    max_admit: int = 0


def prefill_queue(params, prompt_ids, prompt_mask, rng, first_rollout, num_samples, settings):
    """The Queue of prompt_ids int32[B, P] / prompt_mask bool[B, P] (left-padded), G =
    num_samples rollouts each: the prompts through the model once (slots [0, P - 1) of the
    cache), and the random numbers of rollouts first_rollout ... first_rollout + B G - 1."""
    b, p = prompt_ids.shape
    n = settings.max_new_tokens
    positions = model_lib.positions_from_mask(prompt_mask)  # [B, P]
    kv_mask = decode_lib._kv_mask(prompt_mask, n)  # [B, C]
    prefix = None
    if p > 1:
        prefix = decode_lib._prefill(
            {"params": params},
            prompt_ids,
            positions,
            kv_mask[:, : p - 1],
            model=settings.model,
            cache_len=p - 1,
            cache_dtype=settings.cache_dtype,
            num_samples=1,
            data_shards=settings.data_shards,
        )
        prefix = jax.tree_util.tree_map(
            lambda x: layers.constrain(x, (None,) * x.ndim), row_major(prefix)
        )
    ids = first_rollout + jnp.arange(b * num_samples)
    return Queue(
        prefix=prefix,
        kv_mask=kv_mask,
        last_tokens=prompt_ids[:, -1],
        last_positions=positions[:, -1],
        uniforms=decode_lib.rollout_uniforms(rng, ids, n),
    )


def empty_slots(settings: Settings, prompt_len: int) -> Slots:
    """S free slots, each with a cache of P - 1 + N slots."""
    s, n = settings.slots, settings.max_new_tokens
    cache_len = prompt_len - 1 + n
    cfg = settings.model.config
    cache = model_lib.init_cache(cfg, s, cache_len, settings.cache_dtype)
    return Slots(
        cache=decode_lib._constrain_cache(cache, cfg),
        kv_mask=jnp.zeros((s, cache_len), bool),
        last_tokens=jnp.zeros((s,), jnp.int32),
        last_positions=jnp.zeros((s,), jnp.int32),
        step=jnp.zeros((s,), jnp.int32),
        rollout=jnp.full((s,), -1, jnp.int32),
        done=jnp.ones((s,), bool),
        uniforms=jnp.zeros((s, n), jnp.float32),
        tokens=jnp.full((s, n), settings.pad_id, jnp.int32),
        logprobs=jnp.zeros((s, n), jnp.float32),
    )


def harvest(state: Slots, table, settings: Settings):
    """Finished slots hand their completion to the output table (tokens [R, N], logprobs
    [R, N], lengths [R], at the row of their queue entry mod R: a stream's table is a
    ring) and become free."""
    total = table["lengths"].shape[0]
    finished = state.done & (state.rollout >= 0)
    index = jnp.where(finished, state.rollout % total, total)  # total: dropped
    lengths = jnp.minimum(state.step, settings.max_new_tokens)
    table = {
        "tokens": table["tokens"].at[index].set(state.tokens, mode="drop"),
        "logprobs": table["logprobs"].at[index].set(state.logprobs, mode="drop"),
        "lengths": table["lengths"].at[index].set(lengths, mode="drop"),
    }
    return state.replace(rollout=jnp.where(finished, -1, state.rollout)), table


def _copy_admitted(cache, prefix, take, prompt, limit):
    """Each admitted slot's cache (leaves [.., S, KV, C, D], slot axis -4) takes its
    prompt's prefix (leaves [B, .., KV, P - 1, D]) in its first P - 1 positions, written
    in place one admitted slot at a time: the other slots' caches are not touched (a
    select over every slot would read and write all their prefixes each refill). At most
    `limit` (static) slots are admitted: the copy loop's bound."""
    order = jnp.argsort(~take, stable=True)  # the admitted slots first
    count = jnp.sum(take, dtype=jnp.int32)
    # Slot-major while copying, the order the TPU compiler lays the decoder's cache out in.
    # Copied layer-major, the cache was held twice, once in each order, and converted
    # between them at every refill.
    cache = row_major(cache)

    def put(i, cache):
        slot = order[i]

        def one(slot_cache, prompt_cache):
            rows = jax.lax.dynamic_slice_in_dim(prompt_cache, prompt[slot], 1, 0)
            start = [slot] + [0] * (slot_cache.ndim - 1)
            return jax.lax.dynamic_update_slice(slot_cache, rows.astype(slot_cache.dtype), start)

        return jax.tree_util.tree_map(one, cache, prefix)

    # A static bound with the slots past `count` skipped keeps the loop countable.
    body = lambda i, cache: jax.lax.cond(i < count, lambda c: put(i, c), lambda c: c, cache)
    cache = jax.lax.fori_loop(0, limit, body, cache)
    return layer_major(cache)


def _copy_admitted_on_mesh(cache, prefix, take, prompt, limit, settings: Settings):
    """`_copy_admitted` where the slots are split over data shards: each device copies into
    its own slots, in place, under `shard_map` (a dynamic slot index on a split axis would
    make the partitioner gather every slot's cache). The prefix table is whole on every
    device along its prompt axis, so any slot may take any prompt."""
    mesh = jax.sharding.get_abstract_mesh()
    if settings.data_shards == 1 or mesh.empty:
        return _copy_admitted(cache, prefix, take, prompt, limit)
    spec = sharding.logical_to_spec(
        model_lib.cache_axes(settings.model.config), nn.get_logical_axis_rules()
    )
    # Whole along the length (if a rule splits it), as the prefix fills its first P - 1.
    spec = P(*spec[:-2], None, spec[-1])
    slots, prefix_spec = spec[-4], P(None, *spec[:-4], *spec[-3:])
    copy = lambda *args: _copy_admitted(*args, limit // settings.data_shards)
    return jax.shard_map(
        copy,
        mesh=mesh,
        in_specs=(spec, prefix_spec, P(slots), P(slots)),
        out_specs=spec,
    )(cache, prefix, take, prompt)


def admission_limit(settings: Settings) -> int:
    """The most slots one refill of the decode loop admits (`Settings.max_admit`)."""
    return settings.max_admit or settings.slots


def refill(state: Slots, queue: Queue, next_rollout, num_queued, num_samples, settings, limit=None):
    """Free slots take the next queued rollouts in order: entries next_rollout ... (while
    < num_queued; entry e at row e mod the queue's rollouts), each copying its prompt's
    prefix into the slot's cache. At most `limit` slots are admitted (None:
    `admission_limit`), an equal share of them in each data shard's slots: the refill's
    copies are bounded by it, not by S. Returns (slots, next_rollout, whether any was
    admitted)."""
    s, shards = settings.slots, settings.data_shards
    limit = admission_limit(settings) if limit is None else limit
    free = state.done & (state.rollout < 0)
    if limit < s:  # the first free slots of each shard, up to its share
        rank = jnp.cumsum(free.reshape(shards, s // shards).astype(jnp.int32), axis=1)
        free = free & (rank.reshape(s) <= limit // shards)
    new = next_rollout + jnp.cumsum(free.astype(jnp.int32)) - 1
    take = free & (new < num_queued)
    new = jnp.where(take, new, 0)
    # Entry numbers run on across a stream's generations; the queue is a ring of them.
    entry = new % queue.uniforms.shape[0]
    prompt = entry // num_samples

    # No lax.cond around this on whether any slot is admitted: a branch that may update
    # the slots' cache made whole copies of it (most refills admit some slot anyway).
    cache = state.cache
    if queue.prefix is not None:
        cache = _copy_admitted_on_mesh(cache, queue.prefix, take, prompt, limit, settings)
    pick = lambda new_value, old: jnp.where(
        take.reshape((-1,) + (1,) * (old.ndim - 1)), new_value, old
    )
    state = state.replace(
        cache=cache,
        kv_mask=pick(queue.kv_mask[prompt], state.kv_mask),
        last_tokens=pick(queue.last_tokens[prompt], state.last_tokens),
        last_positions=pick(queue.last_positions[prompt], state.last_positions),
        step=pick(0, state.step),
        rollout=pick(new, state.rollout),
        done=pick(False, state.done),
        uniforms=pick(queue.uniforms[entry], state.uniforms),
        tokens=pick(settings.pad_id, state.tokens),
        logprobs=pick(0.0, state.logprobs),
    )
    admitted = jnp.any(take)
    return state, next_rollout + jnp.sum(take, dtype=jnp.int32), admitted


def decode_step(params, head, state: Slots, sampling: SamplingConfig, settings: Settings) -> Slots:
    """One decode step of every slot: each live slot feeds its last token, writes its keys
    and values at its own cache slot and samples its next token with its rollout's own
    uniform. Stopped and empty slots compute and keep nothing. head: the output projection
    as `decode_lib.decode_head` lays it out."""
    model, n = settings.model, settings.max_new_tokens
    cache_len = state.kv_mask.shape[1]
    prompt_slots = cache_len - n  # P - 1
    is_stop = lambda tokens: jnp.isin(tokens, jnp.asarray(settings.stop_ids, jnp.int32))
    logits, cache = decode_lib.step_logits(
        model,
        params,
        head,
        state.last_tokens[:, None],
        (state.last_positions + state.step)[:, None],
        cache=state.cache,
        cache_index=jnp.minimum(prompt_slots + state.step, cache_len - 1),
        kv_mask=state.kv_mask,
    )
    logits = mask_vocab(logits[:, 0], settings.vocab_size)
    column = jnp.minimum(state.step, n - 1)
    uniform = jnp.take_along_axis(state.uniforms, column[:, None], axis=1)[:, 0]
    tokens, logprobs = sample_tokens(uniform, logits, sampling)
    live = ~state.done
    write = live[:, None] & (jnp.arange(n) == column[:, None])  # [S, N]
    steps = state.step + live
    return state.replace(
        cache=cache,
        last_tokens=jnp.where(live, tokens, state.last_tokens),
        step=steps,
        done=state.done | (live & (is_stop(tokens) | (steps >= n))),
        tokens=jnp.where(write, tokens[:, None], state.tokens),
        logprobs=jnp.where(write, logprobs[:, None], state.logprobs),
    )


def decode_chunk(params, head, state: Slots, sampling: SamplingConfig, settings: Settings):
    """Up to K = refill_every decode steps of every slot (fewer once every slot has
    stopped). Returns (slots, steps run, row-steps that produced a kept token)."""

    def cond(inner):
        t, state, _ = inner
        return (t < settings.refill_every) & ~jnp.all(state.done)

    def body(inner):
        t, state, useful = inner
        useful = useful + jnp.sum(~state.done, dtype=jnp.int32)
        return t + 1, decode_step(params, head, state, sampling, settings), useful

    zero = jnp.zeros((), jnp.int32)
    steps, state, useful = jax.lax.while_loop(cond, body, (zero, state, zero))
    return state, steps, useful


def chunk(
    params, head, state: Slots, queue: Queue, table, next_rollout, sampling, num_samples, settings
):
    """One host-free round of the engine: harvest finished slots into the output table,
    refill the free ones from the queue, decode up to K steps. Returns (slots, table,
    next_rollout, EngineStats of this round)."""
    num_queued = queue.uniforms.shape[0]
    state, table = harvest(state, table, settings)
    state, next_rollout, admitted = refill(
        state, queue, next_rollout, num_queued, num_samples, settings
    )
    state, steps, useful = decode_chunk(params, head, state, sampling, settings)
    rows = steps * state.done.shape[0]
    return state, table, next_rollout, EngineStats(steps, useful, admitted.astype(jnp.int32), rows)


def empty_table(total: int, settings: Settings):
    n = settings.max_new_tokens
    return {
        "tokens": jnp.full((total, n), settings.pad_id, jnp.int32),
        "logprobs": jnp.zeros((total, n), jnp.float32),
        "lengths": jnp.zeros((total,), jnp.int32),
    }
