"""Scoring and pass@k: a reward function that raises scores 0 and is counted."""

import itertools

import numpy as np

from replax import evaluation
from replax.tasks import Task
from replax.tokenizer import ByteTokenizer


class RaisingTask(Task):
    name = "raising"

    def examples(self, split, num, seed=0):
        return []

    def reward(self, completion, answer):
        if completion == "boom":
            raise RuntimeError("odd completion")
        return float(completion == answer)


def test_reward_that_raises_scores_zero_and_is_counted():
    tok = ByteTokenizer()
    rows = ["42", "boom", "41", "boom"]
    ids = np.zeros((4, 6), np.int32)
    for i, text in enumerate(rows):
        enc = tok.encode(text) + [tok.eos_id]
        ids[i, : len(enc)] = enc
    rewards, errors = evaluation.score(RaisingTask(), tok, ids, ["42"] * 4)
    np.testing.assert_array_equal(rewards, [1.0, 0.0, 0.0, 0.0])
    assert errors == 2


def test_pass_at_k_matches_enumeration():
    n, k = 6, 3
    for c in range(n + 1):
        outcomes = [1] * c + [0] * (n - c)
        subsets = list(itertools.combinations(outcomes, k))
        exact = np.mean([max(s) for s in subsets])
        np.testing.assert_allclose(evaluation.pass_at_k(n, np.array([c]), k)[0], exact)
