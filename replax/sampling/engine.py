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
- The first fill admits every slot; a later refill at most `max_admit` (0: every free
  one). A refill's prefix copies are bounded by it, and a few slots free up every K steps.
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

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.layout import Format, Layout
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from replax.core import sharding
from replax.model import transformer as model_lib
from replax.sampling import decode as decode_lib
from replax.sampling import generation
from replax.sampling import slots as slots_lib
from replax.sampling.decode import SampleOutput
from replax.sampling.slots import EngineStats


class Engine:
    """A compiled rollout engine over a `Sampler`'s model, mesh, dtype and settings.

    `generate` takes what `Sampler.generate` takes and returns the same SampleOutput, the
    rollouts being those of `Sampler.generate(..., rollout_keys=True)`."""

    def __init__(
        self,
        sampler,
        *,
        slots: int,
        refill_every: int,
        drain_halvings: int = 0,
        max_admit: int = 0,
    ):
        _check(sampler, slots, refill_every, drain_halvings, max_admit)
        self.sampler = sampler
        self.slots = int(slots)
        self.refill_every = int(refill_every)
        self.drain_halvings = int(drain_halvings)
        self.max_admit = int(max_admit)
        self.max_new_tokens = sampler.max_new_tokens
        self.stop_ids, self.pad_id = sampler.stop_ids, sampler.pad_id
        self.mesh, self.rules = sampler.mesh, sampler.rules
        self.settings = slots_lib.Settings(
            model=sampler.model,
            slots=self.slots,
            refill_every=self.refill_every,
            max_new_tokens=sampler.max_new_tokens,
            stop_ids=sampler.stop_ids,
            pad_id=sampler.pad_id,
            vocab_size=sampler.vocab_size,
            cache_dtype=sampler._cache_dtype,
            data_shards=sampler.data_shards,
            drain_halvings=self.drain_halvings,
            max_admit=self.max_admit,
        )
        traced = functools.partial(generation.run, settings=self.settings)
        if self.mesh is None:
            self._jitted = jax.jit(traced, static_argnums=(5, 6, 7))
        else:
            replicated = sharding.replicated(self.mesh)
            table = sharding.named(self.mesh, ("batch", None), self.rules)
            self._jitted = jax.jit(
                traced,
                static_argnums=(5, 6, 7),
                in_shardings=(
                    sampler._decode_shardings,
                    replicated,
                    replicated,
                    replicated,
                    replicated,
                ),
                out_shardings=(
                    SampleOutput(
                        tokens=table,
                        mask=table,
                        logprobs=table,
                        lengths=sharding.named(self.mesh, ("batch",), self.rules),
                    ),
                    EngineStats(replicated, replicated, replicated, replicated),
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
        first_rollout: int = 0,
    ) -> tuple[SampleOutput, EngineStats]:
        args = self.sampler.call_args(
            params, prompt_ids, prompt_mask, rng, num_samples, row_block, temperature, top_k, top_p
        )
        return self.sampler.call(self._jitted, *args, first_rollout=first_rollout)

    def lower_programs(self, abstract_params, num_prompts: int, num_samples: int) -> dict:
        """name -> a zero-argument function lowering that program of the engine from
        abstract inputs (nothing allocated; `.compile()` it for the sampler mesh's devices,
        a TPU slice's on any host): engine_generate, the whole program `generate` runs for
        num_prompts x num_samples rollouts; engine_prefill, the prompts into the queue's
        prefix table; engine_refill_decode_chunk, one round of harvest, refill and K
        decode steps over the S slots; engine_decode_step, one decode step of the S slots
        alone (the chunk's loop body), whose bytes are the decode step's."""
        from replax.sampling import lowering

        params, ids, mask, key, first = lowering.abstract_inputs(
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
            return slots_lib.prefill_queue(params, ids, mask, key, 0, g, settings)

        def one_chunk(params, head, state, queue, table):
            zero = jnp.zeros((), jnp.int32)
            return slots_lib.chunk(params, head, state, queue, table, zero, sampling, g, settings)

        def abstract_head():
            # As `run` lays it out once a generation, before its chunks.
            head = lambda params: decode_lib.decode_head(params, settings.model.config)
            shape = jax.eval_shape(head, params)
            axes = decode_lib.vocab_axes(shape.shape[1])
            split = None if axes is None else NamedSharding(self.mesh, P(None, axes))
            return jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=split)

        def abstract(tree):
            return jax.tree_util.tree_map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), tree
            )

        def abstract_slots():
            # The slots split over the data shards, their caches by the cache's axes.
            state = jax.eval_shape(
                lambda: slots_lib.empty_slots(settings, self.sampler.max_prompt_len)
            )
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
            table = abstract(
                jax.eval_shape(lambda: slots_lib.empty_table(num_prompts * g, settings))
            )
            state = abstract_slots()
            state_in = free_layouts(state)
            table_out = jax.tree_util.tree_map(lambda x: x.sharding, table)
            jitted = jax.jit(
                one_chunk,
                donate_argnums=(2,),
                in_shardings=(None, None, state_in, None, None),
                out_shardings=(state_in, table_out, replicated, replicated),
            )
            return jitted.lower(params, abstract_head(), state, queue, table)

        def free_layouts(state):
            # Inside engine_generate the slots' cache is made in the program and its
            # layout is the compiler's choice; lowered alone, a program taking it as an
            # argument would otherwise pin the default layout and transpose on the way in
            # and out (a whole-cache copy each way that the real loop never makes).
            # The same for every row array: the donated state comes back in the layouts it
            # went in with, whatever the compiler picks for them.
            return jax.tree_util.tree_map(lambda x: Format(Layout.AUTO, x.sharding), state)

        def lower_step():
            def step(params, head, state):
                return slots_lib.decode_step(params, head, state, sampling, settings)

            state = abstract_slots()
            layouts = free_layouts(state)
            jitted = jax.jit(
                step,
                donate_argnums=(2,),
                in_shardings=(None, None, layouts),
                out_shardings=layouts,
            )
            return jitted.lower(params, abstract_head(), state)

        args = (params, ids, mask, key)
        return {
            "engine_generate": under_rules(
                lambda: self._jitted.lower(*args, first, sampling, g, (0, 1))
            ),
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


def _check(sampler, slots, refill_every, drain_halvings, max_admit) -> None:
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
    shards = sampler.data_shards
    if not (isinstance(max_admit, int | np.integer) and 0 <= max_admit <= slots) or (
        max_admit % shards
    ):
        raise ValueError(
            f"rollout.max_admit={max_admit}: allowed is 0 (every free slot) or a multiple of "
            f"the sampler's {shards} data shards up to rollout.slots={slots}"
        )
    if not isinstance(drain_halvings, int | np.integer):
        raise ValueError(f"rollout.drain_halvings={drain_halvings}: allowed is an integer >= 0")
    generation.drain_sizes(slots, drain_halvings, sampler.data_shards)


def make_engine(
    sampler, *, slots: int, refill_every: int = 4, drain_halvings: int = 0, max_admit: int = 0
) -> Engine:
    """Validates the settings and returns an `Engine` of `slots` decoding slots that
    refill every `refill_every` decode steps, at most `max_admit` of them at a refill after
    the first fill (0: every free one), over the sampler's model and settings; once its
    queue is empty the slots halve up to `drain_halvings` times as the last rollouts come
    to fit (`replax.sampling.generation.drain`)."""
    return Engine(
        sampler,
        slots=slots,
        refill_every=refill_every,
        drain_halvings=drain_halvings,
        max_admit=max_admit,
    )
