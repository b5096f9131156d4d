"""Streaming through the rollout engine: the slots stay full across generations.

The engine (`replax.sampling.engine`) runs one generation to its end, so its last chunks
decode a few long rows while the other slots idle. A `Stream` keeps the same S slots
decoding across successive generations: the queue holds the rollouts of up to `depth`
generations, a slot freed by any of them takes the next queued rollout whatever its
generation, and each group (the G samples of one prompt) is handed out as soon as its G
rollouts have stopped, without waiting for the rest of its generation:

    stream = make_stream(engine, prompts=B, num_samples=G, depth=2)
    stream.set_params(params, version=0)
    stream.submit(prompt_ids, prompt_mask, rng)  # generation 0: B G rollouts queued
    stream.submit(next_ids, next_mask, next_rng)  # generation 1, queued behind it
    while stream.busy:
        for group in stream.advance():  # one compiled chunk: refill, K steps, harvest
            ...

- **One host exchange per chunk.** `advance` starts one compiled program (refill the free
  slots, up to K = refill_every decode steps, harvest the stopped slots into the output
  table), then reads back the previous one's S rollout numbers and four counters while
  it decodes; the tokens stay on the device until a group is complete. Static shapes:
  one compile, whatever the generation.
- **A rollout does not depend on its slot or its neighbours.** Rollout i of a generation
  submitted with rng draws from fold_in(rng, i), as in the engine: under one set of
  weights the stream's rollouts are the engine's and the static sampler's with rollout
  keys (tests/sampling/test_stream.py checks them token for token).
- **Weights change while rows are in flight.** `set_params(params, version)` takes effect
  at the next chunk; rows in flight keep decoding under the new weights (their prompt's and
  earlier tokens' keys and values stay those computed under the older ones). Every token
  records the version it was sampled under (`Group.versions`), and its behaviour log-prob
  is that of the distribution it was drawn from, whichever version that was, so the
  importance ratio against the learner stays exact. A group's `version` is the version
  its generation was submitted (and its prompts prefilled) under: the oldest policy any
  of its tokens depends on, the one its policy lag counts from.
- **Resume.** `state_dict` holds everything in flight (the slots with their caches, the
  queue, the output table and the host's counts) as host arrays; `load_state_dict` puts
  them back, and the stream goes on exactly as the uninterrupted one, given the same
  weights (`version` says which).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from replax.core import sharding
from replax.sampling import decode as decode_lib
from replax.sampling import slots as slots_lib


@dataclasses.dataclass(frozen=True)
class Group:
    """The G rollouts of prompt `index` of generation `generation`, on the sampler's
    devices, in sample order."""

    generation: int
    index: int
    version: int  # the version the generation was submitted (prefilled) under
    tokens: jax.Array  # int32[G, N] (pad past the length)
    mask: jax.Array  # bool[G, N]
    logprobs: jax.Array  # float32[G, N] behaviour log-probs (0 past the length)
    lengths: jax.Array  # int32[G]
    versions: jax.Array  # int32[G, N] the version each token was sampled under; -1 past


def _harvest(state, versions, table, version_table, settings):
    """Stopped slots write their rollout into the output ring (row: entry mod its rows)
    and become free. Returns (slots, table, version_table, emitted int32[S]: the entry
    each slot handed over, -1 for none)."""
    rows = table["lengths"].shape[0]
    finished = state.done & (state.rollout >= 0)
    index = jnp.where(finished, state.rollout % rows, rows)  # rows: dropped
    version_table = version_table.at[index].set(versions, mode="drop")
    emitted = jnp.where(finished, state.rollout, -1)
    state, table = slots_lib.harvest(state, table, settings)
    return state, table, version_table, emitted


def _chunk(params, head, carry, queue, submitted, version, sampling, num_samples, settings):
    """One round: refill the free slots from the queue, up to K decode steps (each live
    row's token stamped with `version`), harvest the stopped slots."""
    state, versions, table, version_table, next_rollout = carry
    state, next_rollout, _ = slots_lib.refill(
        state, queue, next_rollout, submitted, num_samples, settings
    )
    live_after_refill = jnp.sum(~state.done, dtype=jnp.int32)
    n = settings.max_new_tokens

    def cond(inner):
        t, state, _, _ = inner
        return (t < settings.refill_every) & ~jnp.all(state.done)

    def body(inner):
        t, state, versions, useful = inner
        live = ~state.done
        column = jnp.minimum(state.step, n - 1)
        write = live[:, None] & (jnp.arange(n) == column[:, None])  # [S, N]
        versions = jnp.where(write, version, versions)
        useful = useful + jnp.sum(live, dtype=jnp.int32)
        state = slots_lib.decode_step(params, head, state, sampling, settings)
        return t + 1, state, versions, useful

    zero = jnp.zeros((), jnp.int32)
    steps, state, versions, useful = jax.lax.while_loop(cond, body, (zero, state, versions, zero))
    state, table, version_table, emitted = _harvest(state, versions, table, version_table, settings)
    counts = jnp.stack([next_rollout, steps, useful, live_after_refill])
    return (state, versions, table, version_table, next_rollout), emitted, counts


def _put_generation(queue, new, position):
    """The ring `queue` with generation `new` (a Queue of B prompts) at ring position
    `position` (its prompts at rows position B ..., its rollouts at position R ...)."""

    def put(ring, part):  # every queue leaf has its prompts (or rollouts) on axis 0
        start = [position * part.shape[0]] + [0] * (ring.ndim - 1)
        return jax.lax.dynamic_update_slice(ring, part.astype(ring.dtype), start)

    return jax.tree_util.tree_map(put, queue, new)


class Stream:
    """S slots decoding the rollouts of successive generations of B prompts x G samples
    (see the module docstring). Not thread-safe: one thread drives it."""

    def __init__(self, engine, *, prompts: int, num_samples: int, depth: int = 2, record=False):
        _check(engine, prompts, num_samples, depth)
        self.engine, self.sampler = engine, engine.sampler
        self.prompts, self.num_samples, self.depth = int(prompts), int(num_samples), int(depth)
        self.rollouts = self.prompts * self.num_samples  # R, per generation
        settings = engine.settings
        n, p = settings.max_new_tokens, self.sampler.max_prompt_len
        g, sampling = self.num_samples, self.sampler.sampling

        def prefill(params, ids, mask, rng, first):
            return slots_lib.prefill_queue(params, ids, mask, rng, first, g, settings)

        def init(params, ids, mask, rng):
            # The empty rings: `depth` generations' prompts and rollouts.
            one = prefill(params, ids, mask, rng, jnp.zeros((), jnp.int32))

            def ring(x):
                return jnp.zeros((x.shape[0] * self.depth, *x.shape[1:]), x.dtype)

            queue = jax.tree_util.tree_map(ring, one)
            rows = self.rollouts * self.depth
            carry = (
                slots_lib.empty_slots(settings, p),
                jnp.full((settings.slots, n), -1, jnp.int32),
                slots_lib.empty_table(rows, settings),
                jnp.full((rows, n), -1, jnp.int32),
                jnp.zeros((), jnp.int32),
            )
            return queue, carry

        def submit(params, queue, ids, mask, rng, first, position):
            return _put_generation(queue, prefill(params, ids, mask, rng, first), position)

        def group(table, version_table, start):
            take = lambda x: jax.lax.dynamic_slice_in_dim(x, start, g, axis=0)
            lengths = take(table["lengths"])
            mask = jnp.arange(n) < lengths[:, None]
            return (
                jnp.where(mask, take(table["tokens"]), settings.pad_id),
                mask,
                jnp.where(mask, take(table["logprobs"]), 0.0),
                lengths,
                jnp.where(mask, take(version_table), -1),
            )

        # The compiled programs are kept on the engine, per shape: every stream of the
        # same engine and shape (one restored from a checkpoint, say) reuses them.
        programs = engine.__dict__.setdefault("_stream_programs", {})
        shape = (self.prompts, g, self.depth)
        if shape not in programs:
            chunk = functools.partial(_chunk, sampling=sampling, num_samples=g, settings=settings)
            head = lambda params: decode_lib.decode_head(params, settings.model.config)
            programs[shape] = (
                jax.jit(init),
                jax.jit(submit, donate_argnums=(1,)),
                jax.jit(chunk, donate_argnums=(2,)),
                jax.jit(group),
                jax.jit(head),
            )
        self._init, self._submit, self._chunk, self._group, self._head = programs[shape]
        self.record = record
        self.timeline: list[dict[str, Any]] = []  # per chunk, when record is set
        self.decode_steps = self.useful_row_steps = 0
        self._queue = self._carry = self._params = self._head_params = None
        self._pending = None  # (emitted, counts, start) of the chunk in flight, unread
        self.version = None
        self._submitted = 0  # rollouts queued so far, all generations
        self._next = 0  # rollouts admitted to a slot so far
        self._live = 0  # slots holding a rollout after the last chunk
        self._generations: dict[int, int] = {}  # generation in the ring -> its version
        self._done: dict[int, int] = {}  # generation -> rollouts stopped and harvested
        self._per_group: dict[tuple[int, int], int] = {}  # (generation, prompt) -> stopped

    # ---- weights and input

    def set_params(self, params, version: int) -> None:
        """The weights the next chunks (and submissions) decode with, and their version."""
        self._params = self.sampler.prepare_params(params)
        self._head_params = self.sampler.call(self._head, self._params)
        self.version = int(version)

    @property
    def generations(self) -> int:
        return self._submitted // self.rollouts

    def can_submit(self) -> bool:
        """Whether the ring has room: generation g takes the place of g - depth, which
        must have handed out all its groups."""
        return self.generations - self.depth not in self._generations

    def submit(self, prompt_ids, prompt_mask, rng, *, row_block=(0, 1)) -> int:
        """Queues the next generation (prompt_ids int[B, P'], prompt_mask bool[B, P'],
        left-padded), its prompts prefilled now under the current weights; rollout i
        draws from fold_in(rng, row_block[0] R + i). Returns its number."""
        if self._params is None:
            raise ValueError("Stream.submit before set_params: no weights to prefill with")
        if not self.can_submit():
            raise ValueError(
                f"Stream.submit: {self.depth} generations already queued or in flight "
                "(depth): allowed once the oldest has handed out all its groups"
            )
        if np.shape(prompt_ids)[0] != self.prompts:
            raise ValueError(
                f"Stream.submit: {np.shape(prompt_ids)[0]} prompts: allowed are exactly "
                f"prompts={self.prompts} (static shapes)"
            )
        ids, mask = self.sampler._inputs(prompt_ids, prompt_mask, self.num_samples)
        first = np.int32(int(row_block[0]) * self.rollouts)
        if self._queue is None:
            self._queue, self._carry = self.sampler.call(self._init, self._params, ids, mask, rng)
        g = self.generations
        self._queue = self.sampler.call(
            self._submit, self._params, self._queue, ids, mask, rng, first, np.int32(g % self.depth)
        )
        self._generations[g] = self.version
        self._done[g] = 0
        self._submitted += self.rollouts
        return g

    # ---- the loop

    @property
    def busy(self) -> bool:
        """Rollouts queued or decoding, or a chunk not yet read."""
        return self._pending is not None or self._has_work()

    def _has_work(self) -> bool:
        return self._next < self._submitted or self._live > 0

    def advance(self) -> list[Group]:
        """Dispatches the next compiled chunk (refill, up to K decode steps, harvest), then
        reads the one before it: the chunk's single host exchange overlaps the next
        chunk's decoding. Returns the groups the chunk read completed, in the order they
        completed (so a group comes out one call after the chunk that ended it)."""
        previous = self._pending
        self._pending = None
        # As read so far (the chunk in flight unread): a chunk with nothing to do would
        # only refill and harvest nothing, so none is started then.
        if self._has_work():
            start = time.time()
            args = (self._queue, np.int32(self._submitted), np.int32(self.version))
            self._carry, emitted, counts = self.sampler.call(
                self._chunk, self._params, self._head_params, self._carry, *args
            )
            self._pending = (emitted, counts, start)
        return [] if previous is None else self._read(*previous)

    def _read(self, emitted, counts, start) -> list[Group]:
        emitted, counts = jax.device_get((emitted, counts))  # the chunk's one exchange
        end = time.time()
        admitted = (self._next, int(counts[0]))
        self._next = int(counts[0])
        self.decode_steps += int(counts[1])
        self.useful_row_steps += int(counts[2])
        emitted = [int(e) for e in emitted if e >= 0]
        self._live = int(counts[3]) - len(emitted)
        if self.record:
            self.timeline.append(
                dict(start=start, end=end, admitted=admitted, emitted=emitted, live=int(counts[3]))
            )
        groups = []
        for e in sorted(emitted):
            g, i = divmod(e, self.rollouts)
            key = (g, i // self.num_samples)
            self._per_group[key] = self._per_group.get(key, 0) + 1
            self._done[g] += 1
            if self._per_group[key] == self.num_samples:
                del self._per_group[key]
                groups.append(self._emit(g, key[1]))
            if self._done[g] == self.rollouts:
                del self._done[g]
                del self._generations[g]
        return groups

    def _emit(self, g, prompt):
        # From the newest table (that of the chunk in flight, if any): a group's rows are
        # written again only by generation g + depth, submitted after this group is out.
        start = (g % self.depth) * self.rollouts + prompt * self.num_samples
        _, _, table, version_table, _ = self._carry
        arrays = self.sampler.call(self._group, table, version_table, np.int32(start))
        return Group(g, prompt, self._generations[g], *arrays)

    # ---- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything in flight as host arrays and plain numbers (the weights excepted:
        `version` names them)."""
        to_host = lambda tree: jax.tree_util.tree_map(np.asarray, jax.device_get(tree))
        return {
            "queue": None if self._queue is None else to_host(self._queue),
            # The prefix table's order (see `slots.Queue`): states saved before it was
            # prompt-major have no such key and hold stacked leaves layer-major.
            "prefix_order": "prompt_major",
            "carry": None if self._carry is None else to_host(self._carry),
            "counters": dict(
                submitted=self._submitted,
                next=self._next,
                live=self._live,
                decode_steps=self.decode_steps,
                useful_row_steps=self.useful_row_steps,
            ),
            # The chunk in flight's outputs, read by the next `advance` as they would be.
            "pending": None
            if self._pending is None
            else (*to_host(self._pending[:2]), self._pending[2]),
            "generations": dict(self._generations),
            "done": dict(self._done),
            "per_group": dict(self._per_group),
            "version": self.version,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Puts a `state_dict` back; `set_params` with the weights of its `version` before
        the next chunk."""
        if state["queue"] is not None:
            # Whole on every device of the sampler's mesh; the chunk's program lays them
            # out as it needs.
            if self.sampler.mesh is None:
                place = jnp.asarray
            else:
                place = lambda x: jax.device_put(x, sharding.replicated(self.sampler.mesh))
            queue = state["queue"]
            if state.get("prefix_order") != "prompt_major" and queue.prefix is not None:
                queue = queue.replace(prefix=slots_lib.row_major(queue.prefix, np))
            self._queue = jax.tree_util.tree_map(place, queue)
            self._carry = jax.tree_util.tree_map(place, state["carry"])
        counters = state["counters"]
        self._submitted, self._next, self._live = (
            counters["submitted"],
            counters["next"],
            counters["live"],
        )
        self.decode_steps = counters.get("decode_steps", 0)
        self.useful_row_steps = counters.get("useful_row_steps", 0)
        self._pending = None if state["pending"] is None else tuple(state["pending"])
        self._generations = dict(state["generations"])
        self._done = dict(state["done"])
        self._per_group = dict(state["per_group"])


def _check(engine, prompts, num_samples, depth) -> None:
    for name, value in (
        ("prompts", prompts),
        ("num_samples", num_samples),
        ("depth", depth),
    ):
        if not (isinstance(value, int | np.integer) and value >= 1):
            raise ValueError(f"{name}={value}: allowed is an integer >= 1")
    if engine.slots > prompts * num_samples * depth:
        raise ValueError(
            f"rollout.slots={engine.slots} exceeds the {prompts * num_samples * depth} "
            f"rollouts the stream can hold ({depth} generations of {prompts} x {num_samples}): "
            "more slots could never fill"
        )


def make_stream(engine, *, prompts: int, num_samples: int, depth: int = 2, record=False):
    """Validates the shapes and returns a `Stream` over the engine's slots and settings."""
    return Stream(engine, prompts=prompts, num_samples=num_samples, depth=depth, record=record)
