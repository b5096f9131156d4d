"""Fresh completions scored on the host, and what a generating step reports of them:
shared by a step's whole generation (`rollouts.decode_and_score`) and a stream's group at
a time (`replax.run.streaming`)."""

from __future__ import annotations

import numpy as np
from jax.experimental import multihost_utils

from replax.rl import evaluation

# What a generating step reports of its fresh completions (`completion_stats`).
FRESH_KEYS = (
    "completion_len_mean",
    "completion_len_max",
    "truncated_frac",
    "reward_std",
    "zero_spread_groups_frac",
)


def score_completions(task, tokenizer, stop_ids, prompts, tokens, lengths, group_size: int):
    """Rewards of R = prompts x G completions (tokens int[R, T], lengths int[R]; each
    prompt's G rows in a row) against `prompts`' answers, with their prompt texts when the
    task has them (`prompt_text`). Returns (rewards float32[R], reward functions that
    raised, rows cut at max_new_tokens)."""
    answers = np.repeat(prompts["answer"], group_size)
    texts = prompts.get("prompt_text")
    texts = None if texts is None else np.repeat(texts, group_size)
    rewards, errors = evaluation.score(task, tokenizer, tokens, answers, texts)
    return rewards, int(errors), int(truncated_rows(tokens, lengths, stop_ids).sum())


def truncated_rows(tokens: np.ndarray, lengths: np.ndarray, stop_ids) -> np.ndarray:
    """bool[R]: completions (tokens int[R, T], lengths int[R]) cut at T = max_new_tokens.
    The sampler keeps the first stop token in the completion and pads after it, so a row
    stopped unless it holds all T tokens and the last of them is no stop token."""
    last_is_stop = np.isin(tokens[:, -1], np.asarray(stop_ids))
    return (lengths == tokens.shape[1]) & ~last_is_stop


def completion_stats(rewards: np.ndarray, lengths: np.ndarray, truncated: int, group_size: int):
    """The FRESH_KEYS of R = prompts x G completions: rewards float32[R] and lengths
    int[R] of all of them, `truncated` of them cut at max_new_tokens. A group whose G
    rewards are all equal has zero advantage: no signal for the policy."""
    groups = rewards.reshape(-1, group_size)
    return {
        "completion_len_mean": float(lengths.mean()),
        "completion_len_max": int(lengths.max()),
        "truncated_frac": truncated / len(lengths),
        "reward_std": float(rewards.std()),
        "zero_spread_groups_frac": float(np.mean(np.ptp(groups, axis=1) == 0)),
    }


def blocks_in_order(block: int, *local):
    """Every process's rows of each `local` array (this one's the block-th block), in
    block order; the block order is exchanged once for all of them."""
    order = np.argsort(multihost_utils.process_allgather(np.int32(block)))
    gathered = (multihost_utils.process_allgather(np.asarray(x)) for x in local)
    return [np.concatenate(list(blocks[order])) for blocks in gathered]  # [processes, b, ...]
