"""Tunix vanilla JAX sampler throughput on the replax benchmark reference model.

Baseline venv (kept apart from the project's .venv; CPU jax):
    python3 -m venv "$BASELINE_VENV"  # any directory
    "$BASELINE_VENV"/bin/pip install google-tunix==0.1.7 flashbax==0.1.3 \
        jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 optax==0.2.8
Run:
    "$BASELINE_VENV"/bin/python scripts/baselines/tunix_sampler.py [--repeats=7]

Model: tunix.models.llama3.model.Llama3, randomly initialised, with a ModelConfig
set to the reference shape (vocab 512, 4 layers, d_model 256, 4 heads, 2 kv heads,
head_dim 64, MLP 1024, tied embeddings, fp32). Llama3 is the Tunix family closest
to replax's default (no qkv bias, no q/k norm, RMSNorm, SwiGLU, RoPE).

Timed: `tunix.generate.sampler.Sampler.__call__` exactly as Tunix's
VanillaRollout calls it (echo=False, pad_output=False, return_logprobs=True):
tokenize 16-token prompts, jitted prefill (KV cache of size 16+64=80) + jitted
lax.while_loop decode, device_get and detokenize. Also timed separately: only the
two jitted functions (prefill + decode, block_until_ready). The eos id is 512,
outside the vocabulary, so every row generates exactly 64 new tokens (checked).
tokens/s = batch * 64 / seconds, median over repeats after two warm-up calls;
the median process CPU seconds per call is printed too (less load-sensitive).
Prints one JSON line.
"""

import argparse
import functools
import itertools
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.generate import sampler as sampler_lib
from tunix.models.llama3 import model as llama3

VOCAB, PROMPT, NEW = 512, 16, 64
EOS, PAD = VOCAB, VOCAB + 1  # never sampled: ids outside the vocabulary


class IdTokenizer:
    """'3 17 42' <-> [3, 17, 42]; the adapter's custom-tokenizer protocol."""

    def encode(self, text, **_):
        return [int(t) for t in text.split()]

    def decode(self, ids, **_):
        return " ".join(map(str, ids))

    def bos_id(self):
        return None  # no BOS: prompts stay exactly 16 tokens

    def eos_id(self):
        return EOS

    def pad_id(self):
        return PAD


def make_model(seed=0):
    cfg = llama3.ModelConfig(
        num_layers=4,
        vocab_size=VOCAB,
        embed_dim=256,
        hidden_dim=1024,
        num_heads=4,
        head_dim=64,
        num_kv_heads=2,
        rope_theta=10_000,
        norm_eps=1e-6,
        weight_tying=True,
    )
    return llama3.Llama3(cfg, rngs=nnx.Rngs(seed))


def median_s(fn, repeats, warmup=2):
    """Median wall seconds (and median process CPU seconds) of fn() after warm-up."""
    for _ in range(warmup):
        fn()
    times, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(times), times, statistics.median(cpu)


SEEDS = itertools.count(1)  # a fresh sampling seed per call


def full_call(sampler, prompts, kw):
    """Sampler.__call__ as tunix.rl.rollout.vanilla_rollout.VanillaRollout calls it."""
    return sampler(
        prompts,
        max_generation_steps=NEW,
        max_prompt_length=PROMPT,
        echo=False,
        pad_output=False,
        return_logprobs=True,
        eos_tokens=[EOS],
        seed=next(SEEDS),
        **kw,
    )


def jitted_only(sampler, prompt_ids, kw):
    """Only what __call__ runs on device: init state, jitted prefill, jitted decode."""
    st = sampler.init_sample_state(
        jnp.asarray(prompt_ids),
        include_logits=False,
        total_sampling_steps=PROMPT + NEW,
        forbidden_token_ids=None,
        temperature=kw["temperature"],
        top_p=kw.get("top_p"),
        top_k=kw.get("top_k"),
        seed=jax.random.PRNGKey(1),
        beam_size=None,
        include_logprobs=True,
    )
    params = sampler._flattened_transformer_state
    st = sampler._compiled_prefill_fn(params, st, None, echo=False)
    st = sampler._compiled_decode_fn(params, st)
    jax.block_until_ready(st.token_buffer)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batches", default="8,64")
    args = ap.parse_args()

    model = make_model()
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(model)))
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    sampler = sampler_lib.Sampler(
        model,
        IdTokenizer(),
        sampler_lib.CacheConfig(cache_size=PROMPT + NEW, num_layers=4, num_kv_heads=2, head_dim=64),
    )
    rng = np.random.default_rng(0)
    out = {
        "model": "tunix.models.llama3 Llama3 (weight_tying=True)",
        "n_params": int(n_params),
        "prompt_len": PROMPT,
        "new_tokens": NEW,
        "cache_size": PROMPT + NEW,
        "repeats": args.repeats,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "load_avg_start": os.getloadavg(),
    }
    modes = {
        "": dict(temperature=1.0, top_p=1.0, top_k=None),  # temperature sampling
        "_greedy": dict(temperature=0.0),
    }
    for b in map(int, args.batches.split(",")):
        prompts = [" ".join(map(str, rng.integers(0, VOCAB, PROMPT))) for _ in range(b)]
        for mode, kw in modes.items():
            res = full_call(sampler, prompts, kw)
            lens = {len(t) for t in res.tokens}
            assert lens == {NEW}, f"generated lengths {lens}"
            assert all(np.all((t >= 0) & (t < VOCAB)) for t in res.tokens)
            med, ts, cpu = median_s(
                functools.partial(full_call, sampler, prompts, kw), args.repeats
            )
            med_jit, _, _ = median_s(
                functools.partial(jitted_only, sampler, res.padded_prompt_tokens, kw), args.repeats
            )
            key = f"tunix_sampler{mode}"
            out[f"{key}_tokens_per_s_b{b}"] = b * NEW / med
            out[f"{key}_jitted_only_tokens_per_s_b{b}"] = b * NEW / med_jit
            out[f"{key}_s_b{b}_all"] = [round(t, 4) for t in ts]
            out[f"{key}_cpu_s_b{b}_median"] = round(cpu, 4)  # process CPU seconds
    out["decode_fn_compiles"] = sampler._compiled_decode_fn._cache_size()
    out["prefill_fn_compiles"] = sampler._compiled_prefill_fn._cache_size()
    out["load_avg_end"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
