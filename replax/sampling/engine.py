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


def run(
    params,
    prompt_ids,
    prompt_mask,
    rng,
    sampling: SamplingConfig,
    num_samples: int,
    row_block: tuple[int, int] = (0, 1),
    *,
    model: model_lib.Transformer,
    slots: int,
    refill_every: int,
    max_new_tokens: int,
    stop_ids: tuple[int, ...],
    pad_id: int,
    vocab_size: int | None,
    cache_dtype,
    data_shards: int,
) -> tuple[SampleOutput, EngineStats]:
    """The traced engine. prompt_ids int32[B, P], prompt_mask bool[B, P] (left-padded):
    G = num_samples rollouts of each, R = B x G, queued prompt by prompt; row_block (i, n):
    these are rollouts [i R, (i + 1) R) of a batch of n R (their keys' indices)."""
    b, p = prompt_ids.shape
    g, n, s = num_samples, max_new_tokens, slots
    total = b * g
    cache_len = p - 1 + n
    cfg = model.config
    is_stop = lambda tokens: jnp.isin(tokens, jnp.asarray(stop_ids, jnp.int32))

    # PREFILL each prompt once: its keys and values at slots [0, P - 1), kept in a table
    # every device holds whole (a slot may take any prompt's sample).
    positions = model_lib.positions_from_mask(prompt_mask)  # [B, P]
    kv_mask = decode_lib._kv_mask(prompt_mask, n)  # [B, C]
    prefix = None
    if p > 1:
        prefix = decode_lib._prefill(
            {"params": params},
            prompt_ids,
            positions,
            kv_mask[:, : p - 1],
            model=model,
            cache_len=p - 1,
            cache_dtype=cache_dtype,
            num_samples=1,
            data_shards=data_shards,
        )
        prefix = jax.tree_util.tree_map(lambda x: layers.constrain(x, (None,) * x.ndim), prefix)
    block = row_block[0]
    uniforms_table = decode_lib.rollout_uniforms(rng, block * total + jnp.arange(total), n)

    def constrain(cache):
        return decode_lib._constrain_cache(cache, cfg)

    # REFILL: finished slots hand their completion to the output table, free slots take
    # the next queued rollouts in order.
    def harvest(slots_state: Slots, table):
        finished = slots_state.done & (slots_state.rollout >= 0)
        index = jnp.where(finished, slots_state.rollout, total)  # total: dropped
        lengths = jnp.minimum(slots_state.step, n)
        table = {
            "tokens": table["tokens"].at[index].set(slots_state.tokens, mode="drop"),
            "logprobs": table["logprobs"].at[index].set(slots_state.logprobs, mode="drop"),
            "lengths": table["lengths"].at[index].set(lengths, mode="drop"),
        }
        rollout = jnp.where(finished, -1, slots_state.rollout)
        return slots_state.replace(rollout=rollout), table

    def admit(slots_state: Slots, next_rollout):
        free = slots_state.done
        rank = jnp.cumsum(free.astype(jnp.int32)) - 1
        new_id = next_rollout + rank
        take = free & (new_id < total)
        new_id = jnp.where(take, new_id, 0)
        prompt = new_id // g

        def fill(state: Slots) -> Slots:
            cache = state.cache
            if prefix is not None:

                def copy(slot_cache, prompt_cache):
                    head = jax.lax.slice_in_dim(slot_cache, 0, p - 1, axis=slot_cache.ndim - 2)
                    head = _where_rows(take, _rows(prompt_cache, prompt), head)
                    start = [0] * slot_cache.ndim
                    return jax.lax.dynamic_update_slice(slot_cache, head, start)

                cache = constrain(jax.tree_util.tree_map(copy, cache, prefix))
            pick = lambda new, old: jnp.where(take.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
            return state.replace(
                cache=cache,
                kv_mask=pick(kv_mask[prompt], state.kv_mask),
                last_tokens=pick(prompt_ids[prompt, -1], state.last_tokens),
                last_positions=pick(positions[prompt, -1], state.last_positions),
                step=pick(0, state.step),
                rollout=pick(new_id, state.rollout),
                done=pick(False, state.done),
                uniforms=pick(uniforms_table[new_id], state.uniforms),
                tokens=pick(pad_id, state.tokens),
                logprobs=pick(0.0, state.logprobs),
            )

        slots_state = jax.lax.cond(jnp.any(take), fill, lambda x: x, slots_state)
        return slots_state, next_rollout + jnp.sum(take, dtype=jnp.int32), jnp.any(take)

    # DECODE one step of every slot; stopped and empty slots compute and keep nothing.
    def decode_step(state: Slots, variables):
        logits, cache = model.apply(
            variables,
            state.last_tokens[:, None],
            (state.last_positions + state.step)[:, None],
            cache=state.cache,
            cache_index=jnp.minimum(p - 1 + state.step, cache_len - 1),
            kv_mask=state.kv_mask,
        )
        logits = mask_vocab(logits[:, 0], vocab_size)
        column = jnp.minimum(state.step, n - 1)
        uniform = jnp.take_along_axis(state.uniforms, column[:, None], axis=1)[:, 0]
        tokens, logprobs = sample_tokens(uniform, logits, sampling)
        live = ~state.done
        write = live[:, None] & (jnp.arange(n) == column[:, None])  # [S, N]
        step = state.step + live
        return state.replace(
            cache=cache,
            last_tokens=jnp.where(live, tokens, state.last_tokens),
            step=step,
            done=state.done | (live & (is_stop(tokens) | (step >= n))),
            tokens=jnp.where(write, tokens[:, None], state.tokens),
            logprobs=jnp.where(write, logprobs[:, None], state.logprobs),
        )

    variables = {"params": params}

    def chunk(carry):
        state, table, next_rollout, stats = carry
        state, table = harvest(state, table)
        state, next_rollout, admitted = admit(state, next_rollout)

        def cond(inner):
            t, state, _ = inner
            return (t < refill_every) & ~jnp.all(state.done)

        def body(inner):
            t, state, useful = inner
            useful = useful + jnp.sum(~state.done, dtype=jnp.int32)
            return t + 1, decode_step(state, variables), useful

        steps, state, useful = jax.lax.while_loop(
            cond, body, (jnp.zeros((), jnp.int32), state, jnp.zeros((), jnp.int32))
        )
        stats = EngineStats(
            decode_steps=stats.decode_steps + steps,
            useful_row_steps=stats.useful_row_steps + useful,
            refills=stats.refills + admitted,
        )
        return state, table, next_rollout, stats

    def more(carry):
        state, _, next_rollout, _ = carry
        return (next_rollout < total) | ~jnp.all(state.done)

    empty = Slots(
        cache=constrain(model_lib.init_cache(cfg, s, cache_len, cache_dtype)),
        kv_mask=jnp.zeros((s, cache_len), bool),
        last_tokens=jnp.zeros((s,), jnp.int32),
        last_positions=jnp.zeros((s,), jnp.int32),
        step=jnp.zeros((s,), jnp.int32),
        rollout=jnp.full((s,), -1, jnp.int32),
        done=jnp.ones((s,), bool),
        uniforms=jnp.zeros((s, n), jnp.float32),
        tokens=jnp.full((s, n), pad_id, jnp.int32),
        logprobs=jnp.zeros((s, n), jnp.float32),
    )
    table = {
        "tokens": jnp.full((total, n), pad_id, jnp.int32),
        "logprobs": jnp.zeros((total, n), jnp.float32),
        "lengths": jnp.zeros((total,), jnp.int32),
    }
    zero = jnp.zeros((), jnp.int32)
    carry = (empty, table, zero, EngineStats(zero, zero, zero))
    state, table, _, stats = jax.lax.while_loop(more, chunk, carry)
    _, table = harvest(state, table)

    # OUTPUT in queue order, as the static sampler lays it out.
    mask = jnp.arange(n) < table["lengths"][:, None]  # [R, N]
    out = SampleOutput(
        tokens=jnp.where(mask, table["tokens"], pad_id),
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
        traced = functools.partial(
            run,
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
