"""A sampler without a KV cache, the baseline scripts/bench.py times replax's sampler against.

Every new token re-runs the full forward over the whole token buffer (the prompt and every
slot a completion can fill, P + N - 1 tokens), all in one jitted `lax.while_loop`. It draws
its tokens with replax's `sample_tokens` from the same uniform numbers as
`replax.sampling.sampler` (one per row and step, drawn up front), so for the same key it generates
what the KV-cache sampler does, up to float rounding in the logits.

    generate = make_generate(model_config, max_new_tokens=64, eos_id=1, pad_id=0)
    out = generate(params, prompt_ids, prompt_mask, rng)  # replax.sampling.sampler.SampleOutput
"""

import jax
import jax.numpy as jnp

from replax.model import transformer as model_lib
from replax.sampling import distributions as sampling_lib
from replax.sampling import sampler as sampler_lib


def make_generate(
    model_config: model_lib.ModelConfig,
    *,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    temperature: float = 1.0,
):
    """Returns a jitted generate(params, prompt_ids int32[B, P], prompt_mask bool[B, P],
    rng) -> SampleOutput over left-padded prompts, P + max_new_tokens - 1 <= max_len."""
    model = model_lib.Transformer(model_config)
    sampling = sampling_lib.SamplingConfig(temperature=temperature)
    n = max_new_tokens

    @jax.jit
    def generate(params, prompt_ids, prompt_mask, rng):
        b, p = prompt_ids.shape
        prompt_positions = model_lib.positions_from_mask(prompt_mask)  # [B, P]
        positions = jnp.concatenate(  # [B, P + N - 1]
            [prompt_positions[:, :-1], prompt_positions[:, -1:] + jnp.arange(n)], axis=1
        )
        # Completion slots are always valid keys: the causal mask hides those not yet written.
        mask = jnp.concatenate([prompt_mask, jnp.ones((b, n - 1), bool)], axis=1)
        uniforms = jax.random.uniform(rng, (n, b), jnp.float32)  # [N, B]

        def cond(state):
            return (state["step"] < n) & ~jnp.all(state["done"])

        def body(state):
            step, done = state["step"], state["done"]
            # Feed the token sampled last (at step 0 the last prompt token) at its slot.
            slot = p - 1 + step
            context = jax.lax.dynamic_update_slice(
                state["context"], state["last"][:, None], (0, slot)
            )
            logits = model.apply({"params": params}, context, positions, mask)  # [B, S, V]
            logits = jax.lax.dynamic_index_in_dim(logits, slot, axis=1, keepdims=False)
            tokens, logprobs = sampling_lib.sample_tokens(uniforms[step], logits, sampling)
            tokens = jnp.where(done, pad_id, tokens)
            logprobs = jnp.where(done, 0.0, logprobs)
            return {
                "step": step + 1,
                "last": tokens,
                "context": context,
                "tokens": jax.lax.dynamic_update_slice(state["tokens"], tokens[:, None], (0, step)),
                "logprobs": jax.lax.dynamic_update_slice(
                    state["logprobs"], logprobs[:, None], (0, step)
                ),
                "done": done | (tokens == eos_id),
            }

        state = {
            "step": jnp.zeros((), jnp.int32),
            "last": prompt_ids[:, -1],  # int32[B]
            # int32[B, P + N - 1]: the prompt, then the tokens fed so far
            "context": jnp.concatenate(
                [prompt_ids, jnp.full((b, n - 1), pad_id, jnp.int32)], axis=1
            ),
            "tokens": jnp.full((b, n), pad_id, jnp.int32),  # [B, N]
            "logprobs": jnp.zeros((b, n), jnp.float32),  # [B, N]
            "done": jnp.zeros((b,), bool),  # [B] EOS already sampled
        }
        state = jax.lax.while_loop(cond, body, state)
        step, tokens, logprobs = state["step"], state["tokens"], state["logprobs"]

        # Each row up to and including its first EOS, as replax's sampler returns it.
        is_eos = tokens == eos_id
        mask = (jnp.cumsum(is_eos, axis=1) - is_eos < 1) & (jnp.arange(n) < step)  # [B, N]
        return sampler_lib.SampleOutput(
            tokens=jnp.where(mask, tokens, pad_id),
            mask=mask,
            logprobs=jnp.where(mask, logprobs, 0.0),
            lengths=jnp.sum(mask, axis=1, dtype=jnp.int32),
        )

    return generate
