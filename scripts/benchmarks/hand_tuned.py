"""The hand-written pieces against their plain jax forms, back to back: the inverse-CDF
categorical draw (jax.random.categorical), `sampling._argmax` (jnp.argmax), the 2-D
`layers.dense` (jnp.tensordot) and the custom-VJP `layers.swiglu` (silu(gate) * up under
autodiff).

Each piece is swapped for its plain form by replacing the module attribute the library
calls before the program is traced, so that the two programs differ in that piece alone.
The RL step's parts are timed interleaved, tuned then plain, --repeats times each:
  sampler   one `generate` call of the reference model, B = 64, 64 new tokens, sampling
            at temperature 1 (and, for argmax, greedy: evaluation's decode);
  sampler_v152k  the same at B = 8, 16 new tokens with the 151,936-token vocabulary
            (Qwen's), where a per-token draw over the vocabulary costs the most;
  train     the PPO train step of the `train` group (B = 64 x 160 tokens);
  replay    the replay buffer's sample call (N = 4096; the draw of the slots).
and the train step's compiled temporary bytes (memory_analysis) with and without.
Keys: hand_tuned_{piece}_{part}_ratio = median plain seconds / median tuned seconds
(> 1: the piece pays), hand_tuned_{piece}_{part}_seconds = [tuned, plain] medians, and
hand_tuned_{piece}_train_temp_bytes = [tuned, plain].
"""

import contextlib
import dataclasses
import statistics

from benchmarks.common import NEW_TOKENS, PROMPT_LEN, reference_model_config, timed
from benchmarks.replay import REPLAY_BATCH, replay_items


def _plain_sample_tokens(uniform, logits, config):
    """sampling.sample_tokens with jax.random.categorical (a Gumbel-max draw) in place of
    the inverse CDF and jnp.argmax for greedy; the key comes from the uniform numbers."""
    import jax
    import jax.numpy as jnp

    from replax.sampling import distributions as sampling

    logits = sampling.sampling_logits(logits, config)
    if config.greedy:
        tokens = jnp.argmax(logits, axis=-1)
    else:
        seed = jax.lax.bitcast_convert_type(uniform[0], jnp.int32)
        tokens = jax.random.categorical(jax.random.fold_in(jax.random.key(0), seed), logits)
    picked = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
    return tokens.astype(jnp.int32), picked - jax.nn.logsumexp(logits, axis=-1)


def _plain_inverse_cdf(weights, uniform, inner_uniform=None):
    """categorical.inverse_cdf's contract through jax.random.categorical."""
    import jax
    import jax.numpy as jnp

    seed = jax.lax.bitcast_convert_type(uniform.reshape(-1)[0], jnp.int32)
    key = jax.random.fold_in(jax.random.key(0), seed)
    logits = jnp.log(weights)[..., None, :]  # [..., 1, n] against [..., k] draws
    shape = jnp.broadcast_shapes(weights.shape[:-1], uniform.shape[:-1]) + uniform.shape[-1:]
    return jax.random.categorical(key, logits, shape=shape).astype(jnp.int32)


def _plain_dense(x, w, in_dims: int = 1):
    import jax.numpy as jnp

    return jnp.tensordot(x, w, axes=in_dims)


def _plain_swiglu(gate, up):
    import jax

    return jax.nn.silu(gate) * up


def _plain_argmax(x):
    import jax.numpy as jnp

    return jnp.argmax(x, axis=-1)


def _patches():
    from replax.model import transformer as model
    from replax.replay import pools as replay_pool
    from replax.sampling import decode
    from replax.sampling import distributions as sampling

    return {
        # The sampler's draw (decode calls sample_tokens) and the replay pool's.
        "categorical": [
            (decode, "sample_tokens", _plain_sample_tokens),
            (replay_pool.categorical, "inverse_cdf", _plain_inverse_cdf),
        ],
        "argmax": [(sampling, "_argmax", _plain_argmax)],
        "dense": [(model, "dense", _plain_dense)],
        "swiglu": [(model, "swiglu", _plain_swiglu)],
    }


@contextlib.contextmanager
def plain(piece: str):
    patches = _patches()
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches[piece]]
    try:
        for module, name, fn in patches[piece]:
            setattr(module, name, fn)
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


def _sampler_call(config, batch, new_tokens, temperature):
    """A compiled call () -> tokens of a fresh sampler (traced now, under the current
    patches)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    from replax.model import transformer as model_lib
    from replax.sampling import sampler as sampler_lib

    dummy = jnp.zeros((1, 1), jnp.int32)
    params = nn.unbox(jax.jit(model_lib.Transformer(config).init)(jax.random.key(0), dummy, dummy))
    params = params["params"]
    params["final_norm"]["scale"] = params["final_norm"]["scale"] * 8.0  # peaked, as trained
    sampler = sampler_lib.make_sampler(
        config,
        sampler_lib.SamplingConfig(temperature=1.0),
        max_prompt_len=PROMPT_LEN,
        max_new_tokens=new_tokens,
        stop_ids=(1,),
        pad_id=0,
    )
    prompts = np.random.default_rng(batch).integers(2, config.vocab_size, (batch, PROMPT_LEN))
    args = (params, jnp.asarray(prompts, jnp.int32), jnp.ones((batch, PROMPT_LEN), bool))
    call = lambda: sampler.generate(*args, jax.random.key(1), temperature=temperature)
    jax.block_until_ready(call())
    return call


def _train_call():
    """A compiled train step () -> (state, metrics), donating its state, and its compiled
    temporary bytes."""
    import jax

    from benchmarks.train import reference_train_step

    step, state, batch, _ = reference_train_step()
    temp_bytes = step.jitted.lower(state, batch).compile().memory_analysis().temp_size_in_bytes
    holder = {"state": state}

    def call():
        holder["state"], metrics = step(holder["state"], batch)
        return holder["state"], metrics

    jax.block_until_ready(call())
    return call, temp_bytes


def _replay_call():
    import jax
    import jax.numpy as jnp
    import numpy as np

    from replax.replay import store as replay_lib

    items = replay_items(np.random.default_rng(0), REPLAY_BATCH)
    buffer = replay_lib.make_replay_buffer(
        replay_lib.ReplayConfig(capacity=4096, strategy="uniform")
    )
    add = jax.jit(buffer.add, donate_argnums=0)
    sample = jax.jit(buffer.sample, static_argnums=2, donate_argnums=0)
    holder = {"state": buffer.init(jax.tree.map(lambda x: x[0], items))}
    for _ in range(4096 // REPLAY_BATCH + 2):
        holder["state"] = add(holder["state"], items, jnp.int32(7))
    keys = iter(jax.random.split(jax.random.key(1), 100_000))

    def call():
        holder["state"], batch, info = sample(holder["state"], next(keys), REPLAY_BATCH, 7)
        return holder["state"], batch

    jax.block_until_ready(call())
    return call


# Which parts of the RL step each piece is in.
_PARTS = {
    "categorical": ("sampler", "sampler_v152k", "replay"),
    "argmax": ("sampler", "sampler_v152k", "greedy", "greedy_v152k"),
    "dense": ("sampler", "train"),
    "swiglu": ("train",),
}


def _build(part: str):
    big = dataclasses.replace(reference_model_config(), vocab_size=151_936, max_len=PROMPT_LEN + 16)
    if part == "sampler":
        return _sampler_call(reference_model_config(), 64, NEW_TOKENS, 1.0), None
    if part == "greedy":
        return _sampler_call(reference_model_config(), 64, NEW_TOKENS, 0.0), None
    if part == "sampler_v152k":
        return _sampler_call(big, 8, 16, 1.0), None
    if part == "greedy_v152k":
        return _sampler_call(big, 8, 16, 0.0), None
    if part == "train":
        return _train_call()
    return _replay_call(), None


def bench_hand_tuned(repeats: int) -> dict:
    out = {}
    for piece, parts in _PARTS.items():
        for part in parts:
            tuned, tuned_bytes = _build(part)
            with plain(piece):
                plain_call, plain_bytes = _build(part)
            calls = 20 * repeats if part == "replay" else repeats
            seconds = {"tuned": [], "plain": []}
            for _ in range(calls):  # interleaved: each sees the same load
                seconds["tuned"].append(timed(tuned))
                seconds["plain"].append(timed(plain_call))
            medians = [statistics.median(seconds[k]) for k in ("tuned", "plain")]
            out[f"hand_tuned_{piece}_{part}_seconds"] = medians
            out[f"hand_tuned_{piece}_{part}_ratio"] = medians[1] / medians[0]
            if tuned_bytes is not None:
                out[f"hand_tuned_{piece}_{part}_temp_bytes"] = [tuned_bytes, plain_bytes]
    return out
