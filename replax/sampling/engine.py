"""The rollout engine: continuous batching in the jitted sampler.

A static batch decodes all R rows until the longest one stops, so with the long-tailed
completion lengths of reasoning tasks most decoded row-steps are spent on rows that have
already finished. The engine keeps S slots decoding instead. When a slot's rollout stops
(a stop token or the length cap) its completion leaves and the next queued
(prompt, sample) takes the slot:

    engine = make_engine(sampler, slots=32, refill_every=4)
    out = engine.generate(params, prompt_ids, prompt_mask, rng, num_samples=8)
    out, stats = engine.generate_with_stats(...)   # stats: decode steps, row-steps

- Each prompt is prefilled once, into a table of prompt caches; a slot taking one of its
  G samples copies that prefix into its own cache (slots [0, P - 1)).
- The decode loop runs in chunks of K = refill_every steps (fewer when every slot has
  stopped); between chunks, finished slots hand their completion to the output table and
  take the next queued rollouts. Prefill, chunks and refills are one compiled program: no
  host round trip per token or per chunk, static shapes, one compile per shape.
- What a rollout is does not depend on its slot: rollout i draws its tokens from its own
  key, fold_in(rng, i) (`decode.rollout_uniforms`), and attends only to its own cache
  rows. It equals the rollout the static sampler generates with `rollout_keys=True`,
  alone or in any batch (tests/sampling/test_engine.py checks it token for token).
- Outputs come back in queue order, rows i G ... i G + G - 1 those of prompt i, as
  `Sampler.generate` returns them, so the engine is a drop-in for it.

Each slot holds a cache of P - 1 + N slots (prompt plus the length cap), so memory is
S x (P - 1 + N) whatever the lengths: S is what bounds it, not R.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from replax.core import sharding
from replax.model import layers
from replax.model import transformer as model_lib
from replax.model.logprobs import mask_vocab
from replax.sampling import decode as decode_lib
from replax.sampling.decode import SampleOutput
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
    decode_steps: jax.Array  # int32[] decode steps run (each over all S slots)
    useful_row_steps: jax.Array  # int32[] row-steps that produced a kept token
    refills: jax.Array  # int32[] refills that admitted at least one rollout


def _rows(x, index):
    """x[index] along the batch axis (-4) of a cache leaf."""
    return jnp.take(x, index, axis=x.ndim - 4)


def _where_rows(pick, new, old):
    """Per row of the batch axis (-4): new where pick[row], else old."""
    shape = [1] * old.ndim
    shape[old.ndim - 4] = pick.shape[0]
    return jnp.where(pick.reshape(shape), new, old)


@flax.struct.dataclass
class Queue:
    """The queued rollouts, their prompts prefilled once: rollout i is sample i % G of
    prompt i // G. Every device holds the tables whole (a slot may take any rollout)."""

    prefix: Any  # per layer {'k', 'v'} [B, KV, P - 1, D] (None when P = 1)
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
        prefix = jax.tree_util.tree_map(lambda x: layers.constrain(x, (None,) * x.ndim), prefix)
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
    [R, N], lengths [R], at the row of their queue entry) and become free."""
    total = table["lengths"].shape[0]
    finished = state.done & (state.rollout >= 0)
    index = jnp.where(finished, state.rollout, total)  # total: dropped
    lengths = jnp.minimum(state.step, settings.max_new_tokens)
    table = {
        "tokens": table["tokens"].at[index].set(state.tokens, mode="drop"),
        "logprobs": table["logprobs"].at[index].set(state.logprobs, mode="drop"),
        "lengths": table["lengths"].at[index].set(lengths, mode="drop"),
    }
    return state.replace(rollout=jnp.where(finished, -1, state.rollout)), table


def refill(state: Slots, queue: Queue, next_rollout, num_queued, num_samples, settings):
    """Free slots take the next queued rollouts in order: queue entries next_rollout ...
    (while < num_queued), each copying its prompt's prefix into the slot's cache. Returns
    (slots, next_rollout, whether any was admitted)."""
    free = state.done & (state.rollout < 0)
    new = next_rollout + jnp.cumsum(free.astype(jnp.int32)) - 1
    take = free & (new < num_queued)
    new = jnp.where(take, new, 0)
    prompt = new // num_samples

    def fill(state: Slots) -> Slots:
        cache = state.cache
        if queue.prefix is not None:
            prefix_len = jax.tree_util.tree_leaves(queue.prefix)[0].shape[-2]

            def copy(slot_cache, prompt_cache):
                head = jax.lax.slice_in_dim(slot_cache, 0, prefix_len, axis=slot_cache.ndim - 2)
                head = _where_rows(take, _rows(prompt_cache, prompt), head)
                return jax.lax.dynamic_update_slice(slot_cache, head, [0] * slot_cache.ndim)

            cache = jax.tree_util.tree_map(copy, cache, queue.prefix)
            cache = decode_lib._constrain_cache(cache, settings.model.config)
        pick = lambda new_value, old: jnp.where(
            take.reshape((-1,) + (1,) * (old.ndim - 1)), new_value, old
        )
        return state.replace(
            cache=cache,
            kv_mask=pick(queue.kv_mask[prompt], state.kv_mask),
            last_tokens=pick(queue.last_tokens[prompt], state.last_tokens),
            last_positions=pick(queue.last_positions[prompt], state.last_positions),
            step=pick(0, state.step),
            rollout=pick(new, state.rollout),
            done=pick(False, state.done),
            uniforms=pick(queue.uniforms[new], state.uniforms),
            tokens=pick(settings.pad_id, state.tokens),
            logprobs=pick(0.0, state.logprobs),
        )

    admitted = jnp.any(take)
    state = jax.lax.cond(admitted, fill, lambda x: x, state)
    return state, next_rollout + jnp.sum(take, dtype=jnp.int32), admitted


def decode_step(params, state: Slots, sampling: SamplingConfig, settings: Settings) -> Slots:
    """One decode step of every slot: each live slot feeds its last token, writes its keys
    and values at its own cache slot and samples its next token with its rollout's own
    uniform. Stopped and empty slots compute and keep nothing."""
    model, n = settings.model, settings.max_new_tokens
    cache_len = state.kv_mask.shape[1]
    prompt_slots = cache_len - n  # P - 1
    is_stop = lambda tokens: jnp.isin(tokens, jnp.asarray(settings.stop_ids, jnp.int32))
    logits, cache = model.apply(
        {"params": params},
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


def decode_chunk(params, state: Slots, sampling: SamplingConfig, settings: Settings):
    """Up to K = refill_every decode steps of every slot (fewer once every slot has
    stopped). Returns (slots, steps run, row-steps that produced a kept token)."""

    def cond(inner):
        t, state, _ = inner
        return (t < settings.refill_every) & ~jnp.all(state.done)

    def body(inner):
        t, state, useful = inner
        useful = useful + jnp.sum(~state.done, dtype=jnp.int32)
        return t + 1, decode_step(params, state, sampling, settings), useful

    zero = jnp.zeros((), jnp.int32)
    steps, state, useful = jax.lax.while_loop(cond, body, (zero, state, zero))
    return state, steps, useful


def chunk(params, state: Slots, queue: Queue, table, next_rollout, sampling, num_samples, settings):
    """One host-free round of the engine: harvest finished slots into the output table,
    refill the free ones from the queue, decode up to K steps. Returns (slots, table,
    next_rollout, EngineStats of this round)."""
    num_queued = queue.uniforms.shape[0]
    state, table = harvest(state, table, settings)
    state, next_rollout, admitted = refill(
        state, queue, next_rollout, num_queued, num_samples, settings
    )
    state, steps, useful = decode_chunk(params, state, sampling, settings)
    return state, table, next_rollout, EngineStats(steps, useful, admitted.astype(jnp.int32))


def empty_table(total: int, settings: Settings):
    n = settings.max_new_tokens
    return {
        "tokens": jnp.full((total, n), settings.pad_id, jnp.int32),
        "logprobs": jnp.zeros((total, n), jnp.float32),
        "lengths": jnp.zeros((total,), jnp.int32),
    }


def run(
    params,
    prompt_ids,
    prompt_mask,
    rng,
    sampling: SamplingConfig,
    num_samples: int,
    row_block: tuple[int, int],
    settings: Settings,
) -> tuple[SampleOutput, EngineStats]:
    """The traced engine over one batch: prompt_ids int32[B, P], prompt_mask bool[B, P]
    (left-padded), G = num_samples rollouts of each, R = B x G, queued prompt by prompt;
    row_block (i, n): these are rollouts [i R, (i + 1) R) of a batch of n R (the indices
    of their keys). Prefill, then chunks until the queue is empty and every slot stopped."""
    b, p = prompt_ids.shape
    total = b * num_samples
    n = settings.max_new_tokens
    # PREFILL each prompt once.
    queue = prefill_queue(
        params, prompt_ids, prompt_mask, rng, row_block[0] * total, num_samples, settings
    )

    # CHUNKS of K decode steps, the slots refilled between them.
    def more(carry):
        state, _, next_rollout, _ = carry
        return (next_rollout < total) | ~jnp.all(state.done)

    def body(carry):
        state, table, next_rollout, stats = carry
        state, table, next_rollout, new = chunk(
            params, state, queue, table, next_rollout, sampling, num_samples, settings
        )
        stats = jax.tree_util.tree_map(jnp.add, stats, new)
        return state, table, next_rollout, stats

    zero = jnp.zeros((), jnp.int32)
    carry = (
        empty_slots(settings, p),
        empty_table(total, settings),
        zero,
        EngineStats(zero, zero, zero),
    )
    state, table, _, stats = jax.lax.while_loop(more, body, carry)
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


class Engine:
    """A compiled rollout engine over a `Sampler`'s model, mesh, dtype and settings.

    `generate` takes what `Sampler.generate` takes and returns the same SampleOutput, the
    rollouts being those of `Sampler.generate(..., rollout_keys=True)`."""

    def __init__(self, sampler, *, slots: int, refill_every: int):
        _check(sampler, slots, refill_every)
        self.sampler = sampler
        self.slots = int(slots)
        self.refill_every = int(refill_every)
        self.max_new_tokens = sampler.max_new_tokens
        self.stop_ids, self.pad_id = sampler.stop_ids, sampler.pad_id
        self.mesh, self.rules = sampler.mesh, sampler.rules
        self.settings = Settings(
            model=sampler.model,
            slots=self.slots,
            refill_every=self.refill_every,
            max_new_tokens=sampler.max_new_tokens,
            stop_ids=sampler.stop_ids,
            pad_id=sampler.pad_id,
            vocab_size=sampler.vocab_size,
            cache_dtype=sampler._cache_dtype,
            data_shards=sampler.data_shards,
        )
        traced = functools.partial(run, settings=self.settings)
        if self.mesh is None:
            self._jitted = jax.jit(traced, static_argnums=(4, 5, 6))
        else:
            replicated = sharding.replicated(self.mesh)
            table = sharding.named(self.mesh, ("batch", None), self.rules)
            self._jitted = jax.jit(
                traced,
                static_argnums=(4, 5, 6),
                in_shardings=(sampler._decode_shardings, replicated, replicated, replicated),
                out_shardings=(
                    SampleOutput(
                        tokens=table,
                        mask=table,
                        logprobs=table,
                        lengths=sharding.named(self.mesh, ("batch",), self.rules),
                    ),
                    EngineStats(replicated, replicated, replicated),
                ),
            )

    def generate_with_stats(
        self,
        params,
        prompt_ids,
        prompt_mask,
        rng,
        *,
        num_samples: int = 1,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        row_block: tuple[int, int] = (0, 1),
    ) -> tuple[SampleOutput, EngineStats]:
        sampler = self.sampler
        sampling = sampler.sampling
        overrides = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if overrides:
            sampling = dataclasses.replace(sampling, **overrides)
            sampler._check_sampling(sampling, sampler.model_config)
        prompt_ids, prompt_mask = sampler._inputs(prompt_ids, prompt_mask, num_samples)
        params = sampler.prepare_params(params)
        row_block = (int(row_block[0]), int(row_block[1]))
        args = (params, prompt_ids, prompt_mask, rng, sampling, int(num_samples), row_block)
        if self.mesh is None:
            return self._jitted(*args)
        with sharding.activation_rules(self.mesh, self.rules):
            return self._jitted(*args)

    def lower_programs(self, abstract_params, num_prompts: int, num_samples: int) -> dict:
        """name -> a zero-argument function lowering that program of the engine from
        abstract inputs (nothing allocated; `.compile()` it for the sampler mesh's devices,
        a TPU slice's on any host): engine_generate, the whole program `generate` runs for
        num_prompts x num_samples rollouts; engine_prefill, the prompts into the queue's
        prefix table; engine_refill_decode_chunk, one round of harvest, refill and K
        decode steps over the S slots; engine_decode_step, one decode step of the S slots
        alone (the chunk's loop body), whose bytes are the decode step's."""
        from replax.sampling import lowering

        params, ids, mask, key = lowering.abstract_inputs(
            self.sampler, num_prompts, abstract_params
        )
        sampling, g, settings = self.sampler.sampling, int(num_samples), self.settings
        replicated = sharding.replicated(self.mesh)

        def under_rules(lower):
            def lowered():
                with sharding.activation_rules(self.mesh, self.rules):
                    return lower()

            return lowered

        def prefill(params, ids, mask, key):
            return prefill_queue(params, ids, mask, key, 0, g, settings)

        def one_chunk(params, state, queue, table):
            zero = jnp.zeros((), jnp.int32)
            return chunk(params, state, queue, table, zero, sampling, g, settings)

        def abstract(tree):
            return jax.tree_util.tree_map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), tree
            )

        def abstract_slots():
            # The slots split over the data shards, their caches by the cache's axes.
            state = jax.eval_shape(lambda: empty_slots(settings, self.sampler.max_prompt_len))
            cache_axes = model_lib.cache_axes(self.sampler.model_config)
            place = lambda x, axes: jax.ShapeDtypeStruct(
                x.shape, x.dtype, sharding=sharding.named(self.mesh, axes, self.rules)
            )
            cache = jax.tree_util.tree_map(lambda x: place(x, cache_axes), state.cache)
            rows = state.replace(cache=None)
            rows = jax.tree_util.tree_map(
                lambda x: place(x, ("batch",) + (None,) * (x.ndim - 1)), rows
            )
            return rows.replace(cache=cache)

        def lower_chunk():
            queue = abstract(jax.eval_shape(prefill, params, ids, mask, key))
            table = abstract(jax.eval_shape(lambda: empty_table(num_prompts * g, settings)))
            jitted = jax.jit(one_chunk, donate_argnums=(1,))
            return jitted.lower(params, abstract_slots(), queue, table)

        def lower_step():
            step = lambda params, state: decode_step(params, state, sampling, settings)
            return jax.jit(step, donate_argnums=(1,)).lower(params, abstract_slots())

        args = (params, ids, mask, key)
        return {
            "engine_generate": under_rules(lambda: self._jitted.lower(*args, sampling, g, (0, 1))),
            "engine_prefill": under_rules(lambda: jax.jit(prefill).lower(*args)),
            "engine_refill_decode_chunk": under_rules(lower_chunk),
            "engine_decode_step": under_rules(lower_step),
        }

    def generate(self, params, prompt_ids, prompt_mask, rng, **kwargs) -> SampleOutput:
        """As `Sampler.generate`; the rollouts of `rollout_keys=True`."""
        return self.generate_with_stats(params, prompt_ids, prompt_mask, rng, **kwargs)[0]

    def __getattr__(self, name):
        # Everything else (params_shardings, prepare_params, cast_params, ...) is the
        # sampler's: the engine stands wherever a sampler does.
        return getattr(self.sampler, name)


def _check(sampler, slots, refill_every) -> None:
    for name, value in (("rollout.slots", slots), ("rollout.refill_every", refill_every)):
        if not (isinstance(value, int | np.integer) and value >= 1):
            raise ValueError(f"{name}={value}: allowed is an integer >= 1")
    if refill_every > sampler.max_new_tokens:
        raise ValueError(
            f"rollout.refill_every={refill_every} exceeds the length cap "
            f"rollout.max_new_tokens={sampler.max_new_tokens}: allowed is 1 <= refill_every "
            f"<= {sampler.max_new_tokens}"
        )
    if sampler.mesh is not None and slots % sampler.data_shards:
        raise ValueError(
            f"rollout.slots={slots} is not divisible by the sampler's {sampler.data_shards} "
            "data shards: allowed are multiples of them"
        )


def make_engine(sampler, *, slots: int, refill_every: int = 4) -> Engine:
    """Validates the settings and returns an `Engine` of `slots` decoding slots that
    refill every `refill_every` decode steps, over the sampler's model and settings."""
    return Engine(sampler, slots=slots, refill_every=refill_every)
