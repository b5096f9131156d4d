"""Tests for replax/rl/scoring.py: a generation scored whole or a group at a time, the
rows cut at the length cap, and the statistics a generating step reports."""

import numpy as np

from replax.rl import scoring
from replax.tasks import Task
from replax.text.tokenizer import ByteTokenizer


class PromptTask(Task):
    """Rewards a completion that repeats its prompt's last word and equals the answer;
    raises on "boom"."""

    name = "prompted"

    def examples(self, split, num, seed=0):
        return []

    def reward(self, completion, answer):
        raise AssertionError("scored without its prompt")

    def score(self, prompt, completion, answer):
        if completion == "boom":
            raise RuntimeError("odd completion")
        return float(completion == answer == prompt.split()[-1])


def _rows(tok, texts, width, stop=True):
    ids = np.zeros((len(texts), width), np.int32)
    lengths = np.zeros(len(texts), np.int32)
    for i, text in enumerate(texts):
        enc = (tok.encode(text) + [tok.eos_id] * stop)[:width]
        ids[i, : len(enc)], lengths[i] = enc, len(enc)
    return ids, lengths


def test_a_group_at_a_time_scores_as_the_whole_generation():
    """Two prompts x G = 3, each row scored with its own prompt's answer and text; the
    stream's slice of one prompt gives that prompt's rows of the whole."""
    tok = ByteTokenizer()
    prompts = {"answer": np.array(["ab", "cd"]), "prompt_text": np.array(["say ab", "say xy"])}
    texts = ["ab", "boom", "abcdefgh", "cd", "cd", "zz"]
    ids, lengths = _rows(tok, texts, 6)
    whole = scoring.score_completions(PromptTask(), tok, (tok.eos_id,), prompts, ids, lengths, 3)
    # "ab" answers "say ab"; "cd" is prompt 1's answer but not its prompt's last word;
    # "boom" raised; "abcdefgh" filled the 6 tokens without a stop: cut.
    np.testing.assert_array_equal(whole[0], [1, 0, 0, 0, 0, 0])
    assert whole[1:] == (1, 1)
    for i in range(2):
        one = {k: v[i : i + 1] for k, v in prompts.items()}
        rows = slice(3 * i, 3 * i + 3)
        got = scoring.score_completions(
            PromptTask(), tok, (tok.eos_id,), one, ids[rows], lengths[rows], 3
        )
        np.testing.assert_array_equal(got[0], whole[0][rows])
    assert got[1:] == (0, 0)


def test_truncated_rows_are_full_length_without_a_stop_token_at_the_end():
    stop = 1  # rows of T = 3 tokens; 0 pads after the stop token
    tokens = np.array([[5, 1, 0], [5, 6, 1], [5, 6, 7], [1, 0, 0]])
    lengths = np.array([2, 3, 3, 1])
    cut = scoring.truncated_rows(tokens, lengths, (stop, 2))
    np.testing.assert_array_equal(cut, [False, False, True, False])


def test_completion_stats_by_hand():
    # Two groups of 4: (1, 1, 0, 0) has spread, (1, 1, 1, 1) none.
    rewards = np.array([1, 1, 0, 0, 1, 1, 1, 1], np.float32)
    lengths = np.array([2, 6, 6, 3, 1, 1, 4, 1])
    stats = scoring.completion_stats(rewards, lengths, truncated=2, group_size=4)
    assert stats == {
        "completion_len_mean": 3.0,
        "completion_len_max": 6,
        "truncated_frac": 0.25,
        "reward_std": float(np.std(rewards)),  # sqrt(0.75 x 0.25) = 0.433
        "zero_spread_groups_frac": 0.5,
    }
    assert abs(stats["reward_std"] - 0.4330127) < 1e-6
    # G = 2: (1, 0) and (1, 0) have spread, (1, 1) and (0, 0) none.
    pairs = np.array([1, 0, 1, 1, 0, 0, 1, 0], np.float32)
    assert scoring.completion_stats(pairs, lengths, 0, 2)["zero_spread_groups_frac"] == 0.5
    eights = np.array([0, 1, 0, 1, 0, 1, 0, 1], np.float32)
    assert scoring.completion_stats(eights, lengths, 0, 8)["zero_spread_groups_frac"] == 0.0
