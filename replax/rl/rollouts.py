"""The stored rollout: its layout, how fresh completions become one, and the jitted
add-and-sample that feeds the train step.

A rollout is stored as one row of fixed length L = P + T (P prompt tokens, left-padded;
T completion tokens, padded after the stop token), so that the train step reads it back
with the log-probs of each completion token aligned to the token itself:

  tokens              int32[L]    prompt + completion
  attention_mask      bool[L]     real tokens of either
  loss_mask           float32[L]  1 on completion tokens (those trained on)
  behaviour_logprobs  float32[L]  log-prob of each completion token under the policy
                                  that sampled it (0 on the prompt)
  reward, advantage, baseline  float32[]  frozen at generation (group advantages)
  token_version       int32[L]    streaming only: the policy version (train step) each
                                  completion token was sampled under (-1 elsewhere)

`rollout_spec` is that layout as ShapeDtypeStructs, the one definition the replay store,
the train step's batch and the benchmark are built from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from replax.core import processes, sharding
from replax.replay import store as replay_lib
from replax.rl import evaluation, objectives, scoring

# Per-rollout fields the sampler adds to a stored rollout when it is drawn for training:
# the replay strategy's importance weight, its age in steps and how often it was drawn.
SAMPLE_FIELDS = {"importance_weights": jnp.float32, "age": jnp.int32, "times_sampled": jnp.int32}


def rollout_spec(seq_len: int, token_versions: bool = False) -> dict[str, jax.ShapeDtypeStruct]:
    """One stored rollout of seq_len = P + T tokens, as ShapeDtypeStructs; token_versions:
    with each token's policy version (a stream's rollouts, whose tokens span versions)."""
    row = lambda dtype: jax.ShapeDtypeStruct((seq_len,), dtype)
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    versions = {"token_version": row(jnp.int32)} if token_versions else {}
    return {
        **versions,
        "tokens": row(jnp.int32),
        "attention_mask": row(jnp.bool_),
        "loss_mask": row(jnp.float32),
        "behaviour_logprobs": row(jnp.float32),
        "reward": scalar,
        "advantage": scalar,
        "baseline": scalar,
    }


def batch_spec(
    batch_size: int, seq_len: int, token_versions: bool = False
) -> dict[str, jax.ShapeDtypeStruct]:
    """A training batch: B stored rollouts plus the sampler's fields."""
    rows = {
        **rollout_spec(seq_len, token_versions),
        **{k: jax.ShapeDtypeStruct((), t) for k, t in SAMPLE_FIELDS.items()},
    }
    return {k: jax.ShapeDtypeStruct((batch_size, *v.shape), v.dtype) for k, v in rows.items()}


@dataclasses.dataclass
class Fresh:
    """One step's completions, scored: R = prompts x G rows. With several processes the
    arrays are global, each process holding (and having scored) its own rows."""

    prompt_ids: Any  # int32[R, P]
    prompt_mask: Any  # bool[R, P]
    # tokens int32[R, T], mask bool[R, T], logprobs f32[R, T]; a stream's versions int32[R, T]
    completion: dict[str, Any]
    rewards: Any  # float32[R]
    reward_mean: float | None  # over all R; None: nothing generated
    reward_errors: int  # reward functions that raised, on all processes
    lengths: np.ndarray | None  # int[R] completion lengths, all of them; None: nothing generated
    # The scoring.FRESH_KEYS statistics of the completions (each None: nothing generated).
    diagnostics: dict[str, Any] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(scoring.FRESH_KEYS)
    )
    # Row-steps decoded for them, all processes' (R x the longest for the static sampler,
    # decode steps x slots for the engine; None: nothing generated): what generation cost.
    decoded_row_steps: int | None = None
    useful_row_steps: int | None = None  # of those, ones with a kept token (None: lengths')


def _all_processes(rows: jax.sharding.NamedSharding | None, *local):
    """Every process's block of each host array of rows, in block order (the arrays
    themselves with one process)."""
    if rows is None or jax.process_count() == 1:
        return [np.asarray(x) for x in local]
    return scoring.blocks_in_order(processes.process_block(rows)[0], *local)


def generate_and_score(
    sampler, task, tokenizer, group_size: int, params, prompts, rng, first_rollout=None
) -> Fresh:
    """G completions of each prompt of a batch (prompt_ids, prompt_mask, answer) with the
    jitted sampler, scored by the task on the host: the step's one round trip.

    Each prompt is prefilled once and its G rows decoded from that cache. With several
    processes, `prompts` is this process's block of the global batch (`process_rows` of
    the sampler's batch sharding): every process passes the sampler all prompts, and
    scores the completions its devices hold. The three phases are apart so that disjoint
    placement decodes and scores in a thread of its own while only the training thread
    exchanges values between processes (`gather_prompts`, `finish`). first_rollout: an
    int, rollout i draws from fold_in(rng, first_rollout + i), its index in the run."""
    prompts = gather_prompts(sampler, prompts)
    args = (sampler, task, tokenizer, group_size, params, prompts, rng, first_rollout)
    return finish(decode_and_score(*args))


@dataclasses.dataclass
class Scored:
    """A generation decoded and scored on this host, before the exchange between
    processes that makes it Fresh."""

    prompt_ids: np.ndarray  # [B, P]: every process's prompts, or this process's (local)
    prompt_mask: np.ndarray
    out: Any  # SampleOutput, [B x G, ...]
    rewards: np.ndarray  # float32 of this process's rows
    errors: int  # reward functions that raised, this process's
    truncated: int  # this process's rows cut at max_new_tokens
    group_size: int
    rows: jax.sharding.NamedSharding | None  # the sampler's row sharding (None: no mesh)
    table: jax.sharding.NamedSharding | None  # the same for [rows, ...] tables
    local: bool  # decoded on this process's devices alone (`process_local`)
    block: tuple[int, int]  # local: (i, n), these rows are the i-th of n blocks
    engine_row_steps: int | None = None  # the engine's decode steps x slots (None: static)


def process_local(sampler) -> bool:
    """Whether the sampler's mesh is this process's devices alone while other processes
    run: disjoint placement on several processes, each decoding its block by itself."""
    return (
        jax.process_count() > 1
        and sampler.mesh is not None
        and all(d.process_index == jax.process_index() for d in sampler.mesh.devices.flat)
    )


def gather_prompts(sampler, prompts, block=(0, 1)):
    """The prompts the sampler decodes: every process's block in block order (a host
    exchange) when its mesh spans processes; this process's own, with its `row_block`,
    when the mesh is its devices alone (`block` (i, n): its block of the batch)."""
    if process_local(sampler):
        return {**prompts, "row_block": block}
    rows = None if sampler.mesh is None else sharding.named(sampler.mesh, ("batch",), sampler.rules)
    # [B, P], all processes'
    ids, mask = _all_processes(rows, prompts["prompt_ids"], prompts["prompt_mask"])
    local_count = len(prompts["prompt_ids"])
    return {**prompts, "prompt_ids": ids, "prompt_mask": mask, "local_count": local_count}


def decode_and_score(
    sampler, task, tokenizer, group_size: int, params, prompts, rng, first_rollout=None
) -> Scored:
    """Decodes the prompts of `gather_prompts` and scores this process's rows; no value
    crosses processes here. first_rollout: as in `generate_and_score`."""
    local = process_local(sampler)
    rows = table = None
    if sampler.mesh is not None:
        rows = sharding.named(sampler.mesh, ("batch",), sampler.rules)
        table = sharding.named(sampler.mesh, ("batch", None), sampler.rules)
    block = prompts.get("row_block", (0, 1))
    prompt_ids, prompt_mask = prompts["prompt_ids"], prompts["prompt_mask"]
    r = len(prompt_ids) * group_size
    if rows is not None and jax.process_count() > 1 and not local:
        mine = processes.process_rows(rows, (r,))
        if mine.stop - mine.start != prompts["local_count"] * group_size:
            raise ValueError(
                f"sampler mesh {dict(sampler.mesh.shape)}: this process holds rows {mine} "
                f"of {r}, not the completions of its {prompts['local_count']} prompts: "
                "allowed are sampler meshes that split rows over processes as training does"
            )
    args = (params, prompt_ids, prompt_mask, rng)
    kwargs = dict(num_samples=group_size, row_block=block)
    if first_rollout is not None:
        kwargs["first_rollout"] = first_rollout
    if hasattr(sampler, "generate_with_stats"):  # the rollout engine
        out, stats = sampler.generate_with_stats(*args, **kwargs)
        engine_row_steps = int(stats.row_steps)
    else:
        keyed = first_rollout is not None
        out, engine_row_steps = sampler.generate(*args, **kwargs, rollout_keys=keyed), None
    tokens = processes.local_rows(out.tokens)  # [rows of this process, T]
    rewards, errors, truncated = scoring.score_completions(
        task,
        tokenizer,
        sampler.stop_ids,
        prompts,
        tokens,
        processes.local_rows(out.lengths),
        group_size,
    )
    return Scored(
        np.asarray(prompt_ids),
        np.asarray(prompt_mask),
        out,
        rewards,
        errors,
        truncated,
        group_size,
        rows,
        table,
        local,
        block,
        engine_row_steps,
    )


def finish(scored: Scored) -> Fresh:
    """The Fresh rollouts of a Scored generation: the counts and statistics over every
    process (host exchanges). Local (`process_local`): the arrays are this process's rows
    (on its host, completions on its sampler devices), for the trainer to lay out."""
    g, out = scored.group_size, scored.out
    # Both counts in one exchange between processes.
    errors, truncated = processes.sum_over_processes(np.array([scored.errors, scored.truncated]))
    repeat = lambda x: np.repeat(x, g, axis=0)  # each prompt's G rows, laid out as theirs
    completion = {"tokens": out.tokens, "mask": out.mask, "logprobs": out.logprobs}
    if scored.local:
        rewards = scored.rewards
        prompt_ids, prompt_mask = repeat(scored.prompt_ids), repeat(scored.prompt_mask)
        all_rewards, lengths = scoring.blocks_in_order(
            scored.block[0], rewards, np.asarray(out.lengths)
        )
    else:
        r = len(scored.prompt_ids) * g
        rewards = processes.global_batch(scored.rewards, scored.rows, r)
        prompt_ids = processes.global_from_whole(repeat(scored.prompt_ids), scored.table)
        prompt_mask = processes.global_from_whole(repeat(scored.prompt_mask), scored.table)
        all_rewards, lengths = processes.to_host(rewards), processes.to_host(out.lengths)
    if scored.engine_row_steps is None:
        # Every row decodes until the longest stops.
        decoded = int(len(lengths) * np.max(lengths))
    elif scored.local:  # each process ran its own engine over its block
        decoded = int(processes.sum_over_processes(np.array([scored.engine_row_steps]))[0])
    else:
        decoded = scored.engine_row_steps
    return Fresh(
        prompt_ids,
        prompt_mask,
        completion,
        rewards,
        float(all_rewards.mean()),
        int(errors),
        lengths,
        scoring.completion_stats(all_rewards, lengths, int(truncated), g),
        decoded,
    )


def nothing_generated(
    r: int, prompt_len: int, new_tokens: int, mesh=None, rules=None, token_versions=False
) -> Fresh:
    """Zeros of a generating step's shapes: what a step without generation feeds
    add_and_sample, which stores none of it (global arrays on a mesh of several
    processes); token_versions: a stream's, with its tokens' versions."""

    def zeros(shape, dtype):
        whole = np.zeros(shape, dtype)
        if mesh is None:
            return whole
        axes = ("batch",) + (None,) * (len(shape) - 1)
        return processes.global_from_whole(whole, sharding.named(mesh, axes, rules))

    completion = {
        "tokens": zeros((r, new_tokens), np.int32),
        "mask": zeros((r, new_tokens), bool),
        "logprobs": zeros((r, new_tokens), np.float32),
    }
    if token_versions:
        completion["versions"] = zeros((r, new_tokens), np.int32)
    prompt_ids, prompt_mask = zeros((r, prompt_len), np.int32), zeros((r, prompt_len), bool)
    return Fresh(prompt_ids, prompt_mask, completion, zeros((r,), np.float32), None, 0, None)


def make_rollouts(
    prompt_ids, prompt_mask, completion, rewards, *, group_size: int, normalize_std: bool
):
    """Stored rollouts of R fresh completions, their advantages frozen.

    prompt_ids int32[R, P], prompt_mask bool[R, P]: the prompts, each repeated G times
    in a row; completion: tokens int32[R, T], mask bool[R, T], logprobs float32[R, T]
    and, from a stream, versions int32[R, T]; rewards float32[R]. Returns a dict of the
    `rollout_spec` fields with leading R.
    """
    zeros = jnp.zeros(prompt_ids.shape, jnp.float32)
    completion_mask = completion["mask"]
    advantage, baseline = objectives.group_advantages(
        rewards, group_size, normalize_std=normalize_std
    )
    versions = {}
    if "versions" in completion:
        unset = jnp.full(prompt_ids.shape, -1, jnp.int32)
        mine = jnp.where(completion_mask, completion["versions"], -1)
        versions["token_version"] = jnp.concatenate([unset, mine], axis=1)
    return {
        **versions,
        "tokens": jnp.concatenate([prompt_ids, completion["tokens"]], axis=1),
        "attention_mask": jnp.concatenate([prompt_mask, completion_mask], axis=1),
        "loss_mask": jnp.concatenate([zeros, completion_mask.astype(jnp.float32)], axis=1),
        "behaviour_logprobs": jnp.concatenate(
            [zeros, jnp.where(completion_mask, completion["logprobs"], 0.0)], axis=1
        ),
        "reward": rewards,
        "advantage": advantage,
        "baseline": baseline,
    }


def make_add_and_sample(
    buffer: replay_lib.ReplayBuffer,
    *,
    group_size: int,
    batch_size: int,
    normalize_std: bool,
    drop_zero_advantage: bool,
) -> Callable:
    """The device half of a step after scoring, to be jitted with the replay state
    donated: freeze advantages, add the fresh rollouts to the store, sample a batch.

    add_and_sample(replay_state, prompt_ids, prompt_mask, completion, rewards, step, rng,
    generated, max_age, version=None) -> (replay_state, batch, stats); stats: replay_size,
    rollouts_kept and rollout_entropy (`rollout_entropy` of the fresh completions, all of
    them, stored or not; meaningless on a step that did not generate). generated (bool[]):
    whether this step generated; a step that did not stores nothing (its inputs are
    placeholders of the same shapes). max_age (int32[]): items older than this many steps
    are not drawn. version (int32[], or int32[R] per row; None: step): the train step of
    the policy that generated the fresh rollouts, stored as their step (their age counts
    from it). A stream's completion also carries each token's version, which is stored,
    and stats then has `replay_token_age_mean`: the mean age of the sampled batch's
    completion tokens, each counted from the version it was sampled under.
    once (bool[]; None: false): auto mode's on-policy step: every fresh rollout stored,
    only never-drawn ones drawn, once each. train (bool[]; None: true): whether the batch
    is trained on (when not, the draw is not counted).
    """

    def add_and_sample(
        replay_state,
        prompt_ids,
        prompt_mask,
        completion,
        rewards,
        step,
        rng,
        generated,
        max_age,
        version=None,
        once=None,
        train=None,
    ):
        # FRESH ROLLOUTS, advantages frozen at generation.
        items = make_rollouts(
            prompt_ids,
            prompt_mask,
            completion,
            rewards,
            group_size=group_size,
            normalize_std=normalize_std,
        )
        # WHAT ENTERS THE STORE: groups whose rewards all agree carry no signal.
        keep = jnp.broadcast_to(generated, rewards.shape)
        if drop_zero_advantage:
            spread = jnp.ptp(rewards.reshape(-1, group_size), axis=1) > 0
            keep = keep & (jnp.repeat(spread, group_size) | (False if once is None else once))
        # ADD, THEN SAMPLE THE TRAINING BATCH.
        replay_state = buffer.add(
            replay_state, items, step if version is None else version, keep=keep
        )
        added = replay_state
        replay_state, sampled, info = buffer.sample(
            replay_state, rng, batch_size, step, max_age=max_age, once=once
        )
        if train is not None:  # a batch not trained on leaves no draws counted
            kept_meta = jnp.where(train, replay_state.meta, added.meta)
            replay_state = replay_state.replace(meta=kept_meta)
        batch = {
            **sampled,
            "importance_weights": info.importance_weights,
            "age": info.age,
            "times_sampled": info.times_sampled,
        }
        stats = {
            "replay_size": jnp.sum(replay_state.count),
            "rollouts_kept": jnp.sum(keep),
            "rollout_entropy": evaluation.rollout_entropy(completion),
        }
        if "token_version" in sampled:  # the batch's tokens, each from its own version
            trained = sampled["loss_mask"] > 0
            age = jnp.where(trained, step - sampled["token_version"], 0).sum()
            stats["replay_token_age_mean"] = age / jnp.maximum(trained.sum(), 1)
        return replay_state, batch, stats

    return add_and_sample
