"""Held-out evaluation: greedy pass@1, pass@k at temperature 1, and mean token entropy.

The prompts are encoded once; each call runs two compiled samplers (greedy and
temperature 1) over fixed shapes, so evaluation never recompiles.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from replax.core import processes, sharding
from replax.sampling import sampler as sampler_lib
from replax.tasks import Example, Task
from replax.text import tokenizer as tokenizer_lib


def score(
    task: Task,
    tokenizer,
    completion_ids: np.ndarray,
    answers: Sequence[str],
    prompts: Sequence[str] | None = None,
):
    """Rewards of completions [B, N] against answers (with their prompts, when given, for
    `Task.score`); a reward function that raises scores 0 and is counted. Returns (rewards
    float32[B], number of reward errors)."""
    rewards = np.zeros(len(answers), np.float32)
    errors = 0
    for i, (ids, answer) in enumerate(zip(completion_ids, answers)):
        try:
            completion = tokenizer_lib.decode_completion(tokenizer, ids)
            if prompts is None:
                rewards[i] = float(task.reward(completion, answer))
            else:
                rewards[i] = float(task.score(str(prompts[i]), completion, str(answer)))
        except Exception:  # noqa: BLE001 - a reward bug must not crash a run.
            errors += 1
    return rewards, errors


def pass_at_k(num_samples: int, num_correct: np.ndarray, k: int) -> np.ndarray:
    """Unbiased pass@k estimate per prompt (Chen et al. 2021) from n samples, c correct."""
    n = num_samples
    out = np.ones(num_correct.shape, np.float64)
    for i, c in enumerate(np.asarray(num_correct)):
        if n - c >= k:
            out[i] = 1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1))
    return out


def make_samplers(model_config, tokenizer, **kwargs):
    """(greedy, temperature-1) samplers of held-out evaluation: greedy pass@1 and the
    pass@k / entropy samples. kwargs: `sampler.make_sampler`'s lengths, mesh, rules and
    numerics."""
    common = dict(
        stop_ids=tokenizer.stop_ids,
        vocab_size=tokenizer.sample_limit,
        pad_id=tokenizer.pad_id,
        **kwargs,
    )
    greedy = sampler_lib.make_sampler(
        model_config, sampler_lib.SamplingConfig(temperature=0.0), **common
    )
    return greedy, sampler_lib.make_sampler(
        model_config, sampler_lib.SamplingConfig(temperature=1.0), **common
    )


class Evaluator:
    def __init__(
        self,
        model_config,
        tokenizer,
        task: Task,
        examples: Sequence[Example],
        *,
        max_prompt_len: int,
        max_new_tokens: int,
        pass_k: int = 8,
        pass_k_prompts: int = 64,
        num_samples: int = 0,
        max_rows: int = 0,
        mesh=None,
        rules=None,
        dtype: str | None = None,
        cache_dtype: str | None = None,
    ):
        """num_samples: held-out prompts whose greedy completions `evaluate` returns as
        text. max_rows: rows decoded per call (0: every prompt of a kind at once); the
        blocks are decoded as rows of the whole batch (`Sampler.generate`'s row_block), so
        the samples are those of one call. mesh, rules, dtype, cache_dtype: the samplers'
        (see `sampler.make_sampler`)."""
        self.task = task
        self.tokenizer = tokenizer
        self.examples = list(examples)
        self.answers = [e.answer for e in self.examples]
        self.prompts = np.asarray([e.prompt for e in self.examples], dtype=object)
        self.prompt_ids, self.prompt_mask = tokenizer_lib.encode_prompts(
            tokenizer, [e.prompt for e in self.examples], max_prompt_len
        )
        self.pass_k = pass_k
        self.mesh, self.rules = mesh, sharding.validate_rules(rules or sharding.DEFAULT_RULES)
        self.pass_k_prompts = min(pass_k_prompts, len(self.examples))
        self.num_samples = num_samples
        self.max_rows = max_rows
        self.greedy, self.sample = make_samplers(
            model_config,
            tokenizer,
            max_prompt_len=max_prompt_len,
            max_new_tokens=max_new_tokens,
            mesh=mesh,
            rules=rules,
            dtype=dtype,
            cache_dtype=cache_dtype,
        )

    def accuracy(self, params, rng) -> float:
        return float(self._greedy(params, rng)[0].mean())

    def __call__(self, params, rng) -> dict[str, float]:
        return self.evaluate(params, rng)[0]

    def evaluate(self, params, rng) -> tuple[dict[str, float], list[dict]]:
        """(metrics, samples): the metrics of `__call__`, and the first num_samples
        held-out prompts (of this process's rows) with their greedy completions, rewards
        and reference answers."""
        greedy_rewards, tokens, first = self._greedy(params, rng)
        metrics = {"eval_accuracy": float(greedy_rewards.mean())}
        if self.pass_k > 0 and self.pass_k_prompts > 0:
            k, p = self.pass_k, self.pass_k_prompts
            # k rows per prompt, adjacent; each prompt prefilled once.
            answers = np.repeat(np.asarray(self.answers[:p], dtype=object), k)
            prompts = np.repeat(self.prompts[:p], k)
            rewards, logprobs = [], []
            for rows, out in self._blocks(self.sample, params, p, rng, k):
                rewards.append(self._rewards(out, answers[rows], prompts[rows])[0])
                mask_out = processes.to_host(out.mask).astype(bool)
                logprobs.append(processes.to_host(out.logprobs)[mask_out])
            correct = np.concatenate(rewards).reshape(p, k).sum(axis=1)
            metrics[f"eval_pass_at_{k}"] = float(pass_at_k(k, correct, k).mean())
            metrics["eval_pass_at_k"] = metrics[f"eval_pass_at_{k}"]
            # Mean per-token entropy of the policy at temperature 1, estimated by the
            # mean negative log-probability of its own samples.
            metrics["entropy"] = float(-np.concatenate(logprobs).mean())
        return metrics, self._samples(greedy_rewards, tokens, first)

    def _blocks(self, sampler, params, num_prompts: int, rng, k: int = 1):
        """(row slice, SampleOutput) of each call that decodes k rows of each of the first
        num_prompts prompts, at most max_rows rows a call: block i of n draws the random
        numbers of rows i R / n ... of the one call of R rows (row_block)."""
        n = 1
        if self.max_rows and num_prompts * k > self.max_rows:
            n = num_prompts * k // self.max_rows
        size = num_prompts // n
        for i in range(n):
            ids = self.prompt_ids[i * size : (i + 1) * size]
            mask = self.prompt_mask[i * size : (i + 1) * size]
            out = sampler.generate(params, ids, mask, rng, num_samples=k, row_block=(i, n))
            yield slice(i * size * k, (i + 1) * size * k), out

    def _greedy(self, params, rng):
        """(rewards float32[prompts], this process's rows of the first block's greedy
        completions int32[rows, T] on the host, the index of the first of those rows)."""
        answers = np.asarray(self.answers, dtype=object)
        rewards, first_block = [], None
        for rows, out in self._blocks(self.greedy, params, len(self.examples), rng):
            scored = self._rewards(out, answers[rows], self.prompts[rows])
            rewards.append(scored[0])
            first_block = first_block or scored[1:]
        return (np.concatenate(rewards), *first_block)

    def _samples(self, rewards, tokens, first: int) -> list[dict]:
        """The completions already scored, as text: nothing is generated again."""
        samples = []
        for i, ids in enumerate(tokens[: self.num_samples]):
            example = self.examples[first + i]
            samples.append(
                {
                    "index": first + i,
                    "prompt": example.prompt,
                    "completion": tokenizer_lib.decode_completion(self.tokenizer, ids),
                    "reward": float(rewards[first + i]),
                    "answer": example.answer,
                }
            )
        return samples

    def _rewards(self, out: sampler_lib.SampleOutput, answers, prompts):
        """(rewards of all rows of a sampler output, this process's rows of out.tokens on
        the host, the first of them): each process scores the completions its devices
        hold, and every process gets all the rewards."""
        if self.mesh is None or jax.process_count() == 1:
            tokens = np.asarray(out.tokens)
            return score(self.task, self.tokenizer, tokens, answers, prompts)[0], tokens, 0
        tokens = processes.local_rows(out.tokens)
        rows = sharding.named(self.mesh, ("batch",), self.rules)
        mine = processes.process_rows(rows, out.lengths.shape)
        local = score(self.task, self.tokenizer, tokens, answers[mine], prompts[mine])[0]
        rewards = processes.to_host(processes.global_batch(local, rows, len(answers)))
        return rewards, tokens, mine.start


def rollout_entropy(completion):
    """float32[]: the mean per-token entropy of the sampling distribution over R fresh
    completions (mask bool[R, T], logprobs float32[R, T]), estimated as the held-out
    `entropy` is (above): minus the mean behaviour log-prob of the sampled
    completion tokens, all R rows' tokens weighing alike. 0 with no completion tokens."""
    mask = completion["mask"]
    total = jnp.sum(jnp.where(mask, completion["logprobs"], 0.0))
    return -total / jnp.maximum(jnp.sum(mask), 1)
