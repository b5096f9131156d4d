"""Replay buffer for RL post-training: a first-in-first-out ring of rollouts on the devices.

Pure functions over a frozen `ReplayState`, bound to a checked `ReplayConfig` by
`make_replay_buffer` (in the style of flashbax). Nothing here is jitted: the caller jits
`add` and `sample` with the state donated.

Shapes: N = capacity, S = num_shards, n = N / S (slots per shard), R = items per `add`,
B = batch size. Items are any pytree; each leaf is stored with a leading N axis.

Sharding. The item axis is split into S contiguous slices of n slots, one per data shard.
`add` gives shard s the contiguous chunk s of the R incoming items, written at that
shard's own head. With `sample_mode='local'` shard s draws B / S items from its own
slice and the batch comes back shard-major, so a batch sharded along its leading axis
over the same data axes needs no communication. The per-pool logic is written for one
slice and vmapped over the [S, n] view of the buffer, which XLA's partitioner keeps local
when the item axis is sharded over the data axes (`ReplayBuffer.state_sharding`).
`sample_mode='global'` draws B from the whole buffer as one pool.

Eligibility. `sample` only draws valid (written) items. Items older than `max_age` steps
or already drawn `max_reuse` times are ineligible, and `positive_bias` narrows the set
further. If nothing in a pool is eligible the pool falls back to all its valid items
(keeping the strategy's weights); a pool with no valid item at all draws uniformly over
its zero-filled slots, so add before sampling.

Cost. `add` writes its R rows in place (donate the state) and `sample` gathers its B rows
and updates their bookkeeping in place: O(R) and O(B) rows moved. Choosing the B slots
takes O(B) work whatever the capacity for `uniform` with no age or reuse limit, since a
pool's written slots are always its first `count` (slots fill in order from 0 and are
never emptied). The other strategies make a pass over the pool's N slots
(`positive_bias` sorts them by freshness) and draw by inverting the pool's CDF in two
levels (`categorical.inverse_cdf`, O(N + B sqrt(N))).
"""

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from replax.core.config_utils import number, one_of, positive
from replax.replay import pools as replay_pool
from replax.replay.pools import merge as _merge_pools
from replax.replay.pools import split as _split_pools

STRATEGIES = ("uniform", "uniform_no_replacement", "recency", "positive_bias", "priority")
SAMPLE_MODES = ("local", "global")


# Columns of `ReplayState.meta`: the bookkeeping of a slot, one int32 row.
INSERT_STEP, TIMES_SAMPLED = replay_pool.INSERT_STEP, replay_pool.TIMES_SAMPLED
VALID, SERIAL = replay_pool.VALID, replay_pool.SERIAL


@flax.struct.dataclass
class ReplayState:
    """The buffer's arrays. Bookkeeping is packed, one int32 row of `meta` per slot and one
    row of `cursor` per shard, so that `add` writes it with one scatter and `sample` reads
    it with one gather. The properties below read the columns by name."""

    items: Any  # pytree, each leaf [N, ...]
    # int32[N, 4], columns INSERT_STEP (train step of the add), TIMES_SAMPLED (draws so
    # far), VALID (1 when the slot holds an item), SERIAL (arrival order over the whole
    # buffer, larger is fresher).
    meta: jax.Array
    cursor: jax.Array  # int32[S, 2]: head (next slot each shard writes, an index into its
    # slice) and count (valid items of the shard)
    num_offered: jax.Array  # int32[] rows ever passed to add, kept or not: the next serial

    @property
    def insert_step(self) -> jax.Array:  # int32[N]
        return self.meta[:, INSERT_STEP]

    @property
    def times_sampled(self) -> jax.Array:  # int32[N]
        return self.meta[:, TIMES_SAMPLED]

    @property
    def valid(self) -> jax.Array:  # bool[N]
        return self.meta[:, VALID] > 0

    @property
    def serial(self) -> jax.Array:  # int32[N]
        return self.meta[:, SERIAL]

    @property
    def head(self) -> jax.Array:  # int32[S]
        return self.cursor[:, 0]

    @property
    def count(self) -> jax.Array:  # int32[S]
        return self.cursor[:, 1]


@flax.struct.dataclass
class SampleInfo:
    indices: jax.Array  # int32[B] slots drawn, indices into the whole buffer
    probs: jax.Array  # float32[B] probability of the slot in one draw from its pool
    importance_weights: jax.Array  # float32[B] 1 except for `priority`
    age: jax.Array  # int32[B] step - insert_step
    times_sampled: jax.Array  # int32[B] draws of the item before this sample


def _shape_dtype(leaf) -> jax.ShapeDtypeStruct:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return leaf
    return jax.ShapeDtypeStruct(np.shape(leaf), jnp.result_type(leaf))


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    """A replay store's settings, checked (messages name a run's config key, replay.*).

    capacity: N slots in all (split over the buffer's data shards, N / S each).
    strategy: `uniform` (with replacement, the paper's), `uniform_no_replacement` (within
      a batch), `recency` (p ~ exp(-age / recency_tau), age in train steps), `positive_bias`
      (uniform over the freshest (1 - delta) K items plus the freshest delta K correct ones
      not already kept, K = positive_bias_size, 0: the pool size; correct means
      items[correct_key] > correct_threshold; a capacity above K lets correct items outlive
      the FIFO horizon K, as in the paper), `priority` (p ~ |items[advantage_key]|^alpha
      + eps, importance weights with exponent priority_beta).
    sample_mode: `local` (each shard draws B / S from its own slice) or `global`.
    max_age: items older than this many steps are ineligible; max_reuse: items drawn this
      many times are ineligible (0: no limit, either).
    The fields after max_reuse are no keys of a run's config: they keep these defaults.
    """

    capacity: int
    strategy: str = "uniform"
    sample_mode: str = "local"
    delta: float = 0.3
    recency_tau: float = 8.0
    priority_alpha: float = 0.6
    priority_beta: float = 0.4
    max_age: int = 0
    max_reuse: int = 0
    positive_bias_size: int = 0
    priority_eps: float = 1e-3
    correct_key: str = "reward"
    correct_threshold: float = 0.5
    advantage_key: str = "advantage"

    def __post_init__(self):
        positive("replay.capacity", self.capacity)
        one_of("replay.strategy", self.strategy, STRATEGIES)
        one_of("replay.sample_mode", self.sample_mode, SAMPLE_MODES)
        number("replay.delta", self.delta, low=0, high=1)
        for key in ("recency_tau", "priority_eps"):
            number(f"replay.{key}", getattr(self, key), low=0, low_open=True)
        number("replay.priority_alpha", self.priority_alpha, low=0)
        number("replay.priority_beta", self.priority_beta, low=0, high=1)
        for key in ("max_age", "max_reuse", "positive_bias_size"):
            number(f"replay.{key}", getattr(self, key), low=0, integer=True)


@dataclasses.dataclass(frozen=True)
class ReplayBuffer(ReplayConfig):
    """A ReplayConfig bound to S = num_shards data shards, and its pure functions. Build
    with `make_replay_buffer`."""

    num_shards: int = 1

    def __post_init__(self):
        super().__post_init__()
        S, N = self.num_shards, self.capacity
        if S < 1 or N % S:
            raise ValueError(f"capacity={N} does not split over num_shards={S}")
        if self.bias_size % self.num_pools:
            raise ValueError(
                f"positive_bias_size={self.bias_size} must split over {self.num_pools} "
                "sampling pools"
            )

    @property
    def num_pools(self) -> int:
        return self.num_shards if self.sample_mode == "local" else 1

    @property
    def bias_size(self) -> int:
        """K, positive_bias' horizon (positive_bias_size, 0: the capacity)."""
        return self.positive_bias_size or self.capacity

    @property
    def shard_capacity(self) -> int:
        return self.capacity // self.num_shards

    def init(self, example_item) -> ReplayState:
        """Empty state for items shaped like `example_item` (one item, no leading axis;
        arrays or ShapeDtypeStructs)."""
        spec = jax.tree.map(_shape_dtype, example_item)
        key = {"positive_bias": self.correct_key, "priority": self.advantage_key}
        if self.strategy in key:
            name = key[self.strategy]
            if not isinstance(spec, Mapping) or name not in spec or spec[name].shape != ():
                raise ValueError(
                    f"strategy {self.strategy!r} reads items[{name!r}], a scalar per item; "
                    f"the item has {jax.tree.map(lambda s: s.shape, spec)}"
                )
        N, S = self.capacity, self.num_shards
        return ReplayState(
            items=jax.tree.map(lambda s: jnp.zeros((N, *s.shape), s.dtype), spec),
            meta=jnp.zeros((N, 4), jnp.int32),
            cursor=jnp.zeros((S, 2), jnp.int32),
            num_offered=jnp.zeros((), jnp.int32),
        )

    def add(self, state: ReplayState, items, step, keep=None) -> ReplayState:
        """Writes items (pytree, leaves [R, ...]) added at train `step`, first in first out.

        keep: optional bool[R]; only kept items are written (compacted) and each shard's
        head advances by the number it kept.
        """
        num_rows = self._check_items(state.items, items)
        S = self.num_shards
        if num_rows % S:
            raise ValueError(f"add: {num_rows} items do not split over num_shards={S}")
        if keep is not None and jnp.shape(keep) != (num_rows,):
            raise ValueError(f"add: keep has shape {jnp.shape(keep)}, expected ({num_rows},)")
        step = jnp.asarray(step, jnp.int32)
        columns = {
            INSERT_STEP: jnp.full(num_rows, step),
            TIMES_SAMPLED: jnp.zeros(num_rows, jnp.int32),
            VALID: jnp.ones(num_rows, jnp.int32),
            SERIAL: state.num_offered + jnp.arange(num_rows, dtype=jnp.int32),
        }
        meta = jnp.stack([columns[c] for c in range(4)], axis=1)  # [R, 4]
        keep = jnp.ones(num_rows, bool) if keep is None else jnp.asarray(keep, bool)
        slots, head, num_kept = jax.vmap(replay_pool.write_shard)(
            _split_pools((state.items, state.meta), S),
            state.head,
            _split_pools((items, meta), S),
            keep.reshape(S, -1),
        )
        items, meta = _merge_pools(slots)
        count = jnp.minimum(state.count + num_kept, self.shard_capacity)
        return ReplayState(
            items=items,
            meta=meta,
            cursor=jnp.stack([head, count], axis=1),
            num_offered=state.num_offered + num_rows,
        )

    def sample(self, state: ReplayState, rng, batch_size: int, step, max_age=None, once=None):
        """Draws batch_size items (static). Returns (state with times_sampled updated,
        batch pytree with leaves [B, ...] shard-major in local mode, SampleInfo).

        max_age: optional int (may be traced) that replaces the static `max_age` for this
        draw (here 0 is a limit: this step's items only), so a controller can move the
        staleness limit without recompiling. once: optional bool[] (may be traced); when
        true only never-drawn items are eligible, drawn without replacement (auto mode's
        on-policy steps: each trained on once)."""
        num_pools = self.num_pools
        pool_size = self.capacity // num_pools
        if batch_size % num_pools:
            raise ValueError(
                f"sample: batch_size={batch_size} does not split over num_shards={num_pools}"
            )
        per_pool = batch_size // num_pools
        if self.strategy == "uniform_no_replacement" and per_pool > pool_size:
            raise ValueError(
                f"sample: uniform_no_replacement needs batch per pool ({per_pool}) <= "
                f"slots per pool ({pool_size})"
            )
        step = jnp.asarray(step, jnp.int32)
        age = step - state.insert_step  # int32[N]

        # Eligibility and the strategy's unnormalised log-probability, per slot [N].
        eligible = state.valid
        if self.strategy == "positive_bias":
            correct = state.items[self.correct_key] > self.correct_threshold
            keep_size = self.bias_size // num_pools
            pool_eligible = functools.partial(
                replay_pool.positive_bias_eligible, keep_size, self.delta
            )
            pooled = _split_pools((state.valid, state.serial, correct), num_pools)
            eligible = _merge_pools(jax.vmap(pool_eligible)(*pooled))
        max_age = (self.max_age or None) if max_age is None else max_age
        if max_age is not None:
            eligible &= age <= max_age
        if self.max_reuse:
            eligible &= state.times_sampled < self.max_reuse
        if once is not None:
            eligible &= ~jnp.asarray(once, bool) | (state.times_sampled == 0)
        log_weight = jnp.zeros(self.capacity, jnp.float32)
        if self.strategy == "recency":
            log_weight = -age.astype(jnp.float32) / self.recency_tau
        elif self.strategy == "priority":
            advantage = jnp.abs(state.items[self.advantage_key].astype(jnp.float32))
            log_weight = jnp.log(advantage**self.priority_alpha + self.priority_eps)

        # Draw B / P per pool, gather and count the draws within each pool.
        keys = jax.random.split(rng, num_pools)
        every_written_slot = self.strategy == "uniform" and max_age is None and once is None
        if every_written_slot and not self.max_reuse and num_pools == self.num_shards:
            # Each pool is a shard whose written slots all are drawable: no [N]-sized work.
            written = functools.partial(
                replay_pool.draw_written, batch_size=per_pool, pool_size=pool_size
            )
            local_index, prob = jax.vmap(written)(keys, state.count)
            probs = jnp.broadcast_to(prob[:, None], local_index.shape)
        else:
            draw = functools.partial(
                replay_pool.draw_from_pool,
                batch_size=per_pool,
                replace=self.strategy != "uniform_no_replacement",
                without=once,
            )
            pooled = _split_pools((log_weight, eligible, state.valid), num_pools)
            local_index, log_prob, num_drawable, min_log_prob = jax.vmap(draw)(keys, *pooled)
            # A draw without replacement is a set: its rows go in the order they were
            # added, so that the same rollouts make the same batch (to the last bit)
            # whichever ring holds them (on-policy's 64 slots, auto mode's whole ring).
            if self.strategy == "uniform_no_replacement" or once is not None:
                serial = _split_pools(state.serial, num_pools)
                added = jnp.argsort(jnp.take_along_axis(serial, local_index, 1), axis=1)
                ordered = lambda x: jnp.take_along_axis(x, added, 1)
                sort = self.strategy == "uniform_no_replacement" or jnp.asarray(once, bool)
                local_index, log_prob = jax.tree.map(
                    lambda x: jnp.where(sort, ordered(x), x), (local_index, log_prob)
                )
            probs = jnp.exp(log_prob)
        gather = lambda tree, index: jax.tree.map(lambda x: x[index], tree)
        batch, drawn_meta = jax.vmap(gather)(
            _split_pools((state.items, state.meta), num_pools), local_index
        )
        meta = jax.vmap(replay_pool.count_draws)(
            _split_pools(state.meta, num_pools), local_index, drawn_meta[..., TIMES_SAMPLED]
        )
        batch, drawn_meta = _merge_pools((batch, drawn_meta))

        # Priority: w = (m p)^-beta with m the drawable items of the pool, normalised by
        # the largest weight any drawable item of the buffer could get.
        if self.strategy == "priority":
            beta, log_m = self.priority_beta, jnp.log(num_drawable)[:, None]
            log_w = -beta * (log_m + log_prob)  # [P, b]
            log_w_max = jnp.max(-beta * (log_m[:, 0] + min_log_prob))
            importance_weights = jnp.exp(log_w - log_w_max).reshape(-1)
        else:
            importance_weights = jnp.ones(batch_size, jnp.float32)
        pool_start = jnp.arange(num_pools, dtype=jnp.int32)[:, None] * pool_size
        info = SampleInfo(
            indices=(pool_start + local_index).reshape(-1),
            probs=probs.reshape(-1),
            importance_weights=importance_weights,
            age=step - drawn_meta[:, INSERT_STEP],
            times_sampled=drawn_meta[:, TIMES_SAMPLED],
        )
        return state.replace(meta=_merge_pools(meta)), batch, info

    def state_sharding(self, state: ReplayState, mesh, data_axes="data") -> ReplayState:
        """NamedShardings for `state` (or its eval_shape): the item axis over `data_axes`,
        the per-shard head and count too when they divide evenly, the rest replicated."""
        items_axis = NamedSharding(mesh, P(data_axes))
        replicated = NamedSharding(mesh, P())
        axes = (data_axes,) if isinstance(data_axes, str) else tuple(data_axes)
        data_size = int(np.prod([mesh.shape[a] for a in axes]))
        per_shard = items_axis if self.num_shards % data_size == 0 else replicated
        return ReplayState(
            items=jax.tree.map(lambda _: items_axis, state.items),
            meta=items_axis,
            cursor=per_shard,
            num_offered=replicated,
        )

    def _check_items(self, stored, items) -> int:
        """Checks incoming items against the stored ones; returns R."""
        stored_leaves, stored_def = jax.tree_util.tree_flatten_with_path(stored)
        leaves, treedef = jax.tree_util.tree_flatten(items)
        if treedef != stored_def:
            raise ValueError(f"add: items have structure {treedef}, expected {stored_def}")
        num_rows = {jnp.shape(x)[0] if jnp.ndim(x) else None for x in leaves}
        if len(num_rows) != 1 or None in num_rows:
            raise ValueError(f"add: leaves need one common leading axis R, got {num_rows}")
        for (path, want), got in zip(stored_leaves, leaves):
            name = jax.tree_util.keystr(path)
            if jnp.shape(got)[1:] != want.shape[1:] or jnp.result_type(got) != want.dtype:
                raise ValueError(
                    f"add: leaf {name}: expected [R, {', '.join(map(str, want.shape[1:]))}] "
                    f"{want.dtype}, got {list(jnp.shape(got))} {jnp.result_type(got)}"
                )
        return num_rows.pop()


def make_replay_buffer(config: ReplayConfig, num_shards: int = 1) -> ReplayBuffer:
    """The replay store of `config` over num_shards data shards, S, each owning N / S
    slots: the settings checked and bound to the store's pure functions."""
    settings = {f.name: getattr(config, f.name) for f in dataclasses.fields(ReplayConfig)}
    return ReplayBuffer(**settings, num_shards=num_shards)
