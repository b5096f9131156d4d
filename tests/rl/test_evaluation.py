"""Tests for replax/rl/evaluation.py: scoring (a reward function that raises scores 0 and is
counted), pass@k against enumeration, and the Evaluator's bookkeeping over scripted
samplers."""

import itertools

import numpy as np
import pytest

from replax.model import transformer as model_lib
from replax.rl import evaluation
from replax.sampling import sampler as sampler_lib
from replax.tasks import Example, Task
from replax.tasks.arith import EASY, ArithTask
from replax.text.tokenizer import ByteTokenizer, encode_prompts


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


def brute_force_pass_at_k(n, c, k):
    """Fraction of the k-subsets of n samples (c correct) that hold a correct one."""
    outcomes = [1] * c + [0] * (n - c)
    return np.mean([max(s) for s in itertools.combinations(outcomes, k)])


@pytest.mark.parametrize("n, k", [(1, 1), (4, 1), (4, 2), (4, 4), (5, 2), (7, 5)])
def test_pass_at_k_matches_enumeration_for_every_count(n, k):
    correct = np.arange(n + 1)  # one prompt per possible count, in one call
    expected = [brute_force_pass_at_k(n, c, k) for c in correct]
    np.testing.assert_allclose(evaluation.pass_at_k(n, correct, k), expected, rtol=1e-12)


def test_pass_at_k_by_hand():
    # pass@1 is the fraction correct; 4 samples, 1 correct, k = 2: 1 - C(3,2)/C(4,2) = 1/2.
    np.testing.assert_allclose(evaluation.pass_at_k(4, np.array([0, 1, 3]), 1), [0, 0.25, 0.75])
    np.testing.assert_allclose(evaluation.pass_at_k(4, np.array([1]), 2), [0.5])


# ---------------------------------------------------------------- Evaluator


class ScriptedSampler:
    """Stands in for a compiled sampler: returns fixed completions and records its inputs.
    Row i's generated tokens (text + EOS) have log-prob -(i + 1) each."""

    def __init__(self, tokenizer, completions):
        self.tokenizer, self.completions, self.calls = tokenizer, completions, []

    def generate(self, params, prompt_ids, prompt_mask, rng, num_samples=1, row_block=(0, 1)):
        self.calls.append((np.asarray(prompt_ids), np.asarray(prompt_mask), num_samples))
        rows = len(prompt_ids) * num_samples
        assert rows * row_block[1] == len(self.completions)
        completions = self.completions[row_block[0] * rows : (row_block[0] + 1) * rows]
        width = 4
        tokens = np.zeros((len(completions), width), np.int32)
        mask = np.zeros((len(completions), width), bool)
        for i, text in enumerate(completions):
            ids = self.tokenizer.encode(text) + [self.tokenizer.eos_id]
            tokens[i, : len(ids)], mask[i, : len(ids)] = ids, True
        logprobs = np.where(mask, -(np.arange(len(tokens))[:, None] + 1.0), 0.0)
        return sampler_lib.SampleOutput(
            tokens=tokens, mask=mask, logprobs=logprobs.astype(np.float32), lengths=mask.sum(1)
        )


TOKENIZER = ByteTokenizer()
# The Evaluator's own samplers are replaced by scripted ones: this model never runs.
CONFIG = model_lib.ModelConfig(
    vocab_size=TOKENIZER.vocab_size,
    num_layers=1,
    d_model=8,
    num_heads=1,
    num_kv_heads=1,
    head_dim=8,
    mlp_dim=16,
    max_len=12,
)


def scripted_evaluator(examples, greedy, sampled, **kwargs):
    evaluator = evaluation.Evaluator(
        CONFIG, TOKENIZER, ArithTask(EASY), examples, max_prompt_len=6, max_new_tokens=4, **kwargs
    )
    evaluator.greedy = ScriptedSampler(TOKENIZER, greedy)
    evaluator.sample = ScriptedSampler(TOKENIZER, sampled)
    return evaluator


def test_evaluator_scores_greedy_and_pass_at_k_rows_per_prompt():
    examples = [Example("1+1=", "2"), Example("2+3=", "5"), Example("9-4=", "5")]
    # Greedy: 2 of 3 right. Sampled, 2 per prompt for the first 2 prompts: prompt "1+1="
    # gets "2" and "3" (1 of 2 right: pass@2 = 1), prompt "2+3=" gets "4", "4" (pass@2 = 0).
    evaluator = scripted_evaluator(
        examples, ["2", "6", "5"], ["2", "3", "4", "4"], pass_k=2, pass_k_prompts=2
    )
    result = evaluator(params=None, rng=None)

    assert result["eval_accuracy"] == pytest.approx(2 / 3)
    assert result["eval_pass_at_2"] == result["eval_pass_at_k"] == pytest.approx(0.5)
    # Every sampled row has 2 generated tokens (digit, EOS) at log-prob -1, -2, -3, -4.
    assert result["entropy"] == pytest.approx(2.5)
    ((greedy_ids, greedy_mask, greedy_k),) = evaluator.greedy.calls
    ((sample_ids, sample_mask, sample_k),) = evaluator.sample.calls
    prompt_ids, prompt_mask = encode_prompts(TOKENIZER, [e.prompt for e in examples], 6)
    np.testing.assert_array_equal(greedy_ids, prompt_ids)
    np.testing.assert_array_equal(greedy_mask, prompt_mask)
    assert greedy_k == 1
    # pass@k: the first 2 prompts once each, k = 2 samples of each (adjacent rows
    # 1+1=, 1+1=, 2+3=, 2+3= of the output).
    np.testing.assert_array_equal(sample_ids, prompt_ids[:2])
    np.testing.assert_array_equal(sample_mask, prompt_mask[:2])
    assert sample_k == 2


def test_evaluator_without_pass_at_k_runs_only_the_greedy_sampler():
    examples = [Example("1+1=", "2"), Example("2+2=", "4")]
    evaluator = scripted_evaluator(examples, ["2", "4"], [], pass_k=0)
    assert evaluator.accuracy(None, None) == 1.0
    assert evaluator(None, None) == {"eval_accuracy": 1.0}
    assert evaluator.sample.calls == []


def test_evaluate_returns_the_scored_greedy_completions_of_the_first_prompts_as_text():
    examples = [Example("1+1=", "2"), Example("2+3=", "5"), Example("9-4=", "5")]
    evaluator = scripted_evaluator(
        examples, ["2", "6", "5"], ["3", "3", "5", "5"], pass_k=2, pass_k_prompts=2, num_samples=2
    )
    metrics, samples = evaluator.evaluate(None, None)
    assert metrics["eval_accuracy"] == pytest.approx(2 / 3)
    # The greedy rewards (1, 0), not the pass@k samples' (0 for "1+1=").
    assert samples == [
        {"index": 0, "prompt": "1+1=", "completion": "2", "reward": 1.0, "answer": "2"},
        {"index": 1, "prompt": "2+3=", "completion": "6", "reward": 0.0, "answer": "5"},
    ]
    assert len(evaluator.greedy.calls) == 1  # the samples are the evaluation's own rows


def test_max_rows_decodes_in_blocks_with_the_samples_of_one_call():
    # A real (random) policy on 4 devices: blocks of 4 rows reproduce the one call's
    # greedy completions and temperature-1 samples (row_block draws the whole batch's
    # random numbers), hence every metric.
    import jax

    from replax.core import sharding

    config = model_lib.ModelConfig(
        vocab_size=TOKENIZER.vocab_size,
        num_layers=1,
        d_model=16,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        mlp_dim=32,
        max_len=12,
    )
    params = model_lib.Transformer(config).init(
        jax.random.key(0), np.zeros((1, 2), np.int32), np.zeros((1, 2), np.int32)
    )["params"]
    examples = [Example(f"{a}+{b}=", str(a + b)) for a in range(2) for b in range(4)]
    mesh = sharding.make_mesh((4, 1, 1), devices=jax.devices()[:4])

    def evaluate(max_rows):
        evaluator = evaluation.Evaluator(
            config,
            TOKENIZER,
            ArithTask(EASY),
            examples,
            max_prompt_len=6,
            max_new_tokens=6,
            pass_k=2,
            pass_k_prompts=8,
            max_rows=max_rows,
            mesh=mesh,
        )
        return evaluator.evaluate(params, jax.random.key(7))

    (whole, whole_samples), (blocks, block_samples) = evaluate(0), evaluate(4)
    assert whole.keys() == blocks.keys()
    for key in whole:
        assert blocks[key] == pytest.approx(whole[key], abs=1e-6), key
    assert whole_samples == block_samples
