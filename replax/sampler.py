"""Jitted sampler: one prefill call, then the whole decode loop inside `lax.while_loop`.

Prompts come left-padded (`prompt_ids int32[B, P]`, `prompt_mask bool[B, P]`), so every
row's last prompt token sits in slot P - 1 and the t-th new token goes to slot P + t of
the KV cache for every row alike; positions continue from each row's prompt length. The
prefill writes slots [0, P - 1); iteration t of the loop feeds the token in slot P - 1 + t
(the last prompt token, then each sampled one), samples token t and stops early once
every row has produced a stop token. The loop runs in up to four segments, each over a cache just
long enough for it, so that early steps do not read slots that are not written yet.

    sampler = make_sampler(model_config, max_prompt_len=16, max_new_tokens=64,
                           stop_ids=(1,), pad_id=0, temperature=1.0, mesh=mesh)
    out = sampler.generate(params, prompt_ids, prompt_mask, rng)  # SampleOutput

`out.logprobs` are the behaviour log-probs that replay needs: the log-probability of each
sampled token under the distribution it was drawn from (logits / temperature, top-k and
top-p filtered and renormalised; for greedy decoding the log-softmax of the raw logits).
The first stop token (any of `stop_ids`: Qwen2.5-Instruct ends a turn with <|im_end|> or
<|endoftext|>) is part of the completion (and of the mask, so that the policy learns to
stop); everything after it is `pad_id` with mask False and log-prob 0. With
`vocab_size` below the model's vocabulary (checkpoints pad their embedding past the
tokenizer's ids), the rows past it are never sampled.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from replax import categorical, sharding
from replax import model as model_lib


@flax.struct.dataclass
class SampleOutput:
    tokens: jax.Array  # int32[B, N] completion; pad_id after EOS (EOS itself kept)
    mask: jax.Array  # bool[B, N] generated tokens, up to and including EOS
    logprobs: jax.Array  # float32[B, N] behaviour log-probs; 0 where mask is False
    lengths: jax.Array  # int32[B] number of generated tokens (= mask.sum(-1))


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """The sampling distribution. temperature 0 is greedy (top_k / top_p then unused)."""

    temperature: float = 1.0
    # Keep the k most likely tokens; 0 keeps all.
    top_k: int = 0
    # Keep the smallest set of most likely tokens whose probability reaches top_p.
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"sampler.temperature={self.temperature}: must be >= 0 (0 = greedy)")
        if not (isinstance(self.top_k, int | np.integer) and self.top_k >= 0):
            raise ValueError(f"sampler.top_k={self.top_k}: must be an integer >= 0 (0 = off)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampler.top_p={self.top_p}: must be in (0, 1] (1 = off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sampling_logits(logits, config: SamplingConfig):
    """Logits of the sampling distribution: scaled by 1/temperature, then filtered.

    logits: float32[..., V]. Filtered-out tokens get -inf, so `log_softmax` of the result
    is the renormalised distribution. Greedy decoding returns the raw logits.
    """
    if config.greedy:
        return logits
    logits = logits / config.temperature
    if config.top_k and config.top_k < logits.shape[-1]:
        kth_largest = jax.lax.top_k(logits, config.top_k)[0][..., -1:]  # [..., 1]
        logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
    if config.top_p < 1.0:
        # A token is kept when the probability of the strictly more likely tokens is below
        # top_p; the most likely token is always kept.
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]  # [..., V] descending
        sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        num_kept = jnp.sum(mass_before < config.top_p, axis=-1, keepdims=True)  # [..., 1]
        threshold = jnp.take_along_axis(sorted_logits, num_kept - 1, axis=-1)
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return logits


def _argmax(x):
    """First index of the maximum over the last axis: two plain reductions, which XLA:CPU
    runs several times faster than argmax's (value, index) reduction."""
    is_max = x == jnp.max(x, axis=-1, keepdims=True)
    return jnp.min(jnp.where(is_max, jnp.arange(x.shape[-1]), x.shape[-1]), axis=-1)


def sample_tokens(uniform, logits, config: SamplingConfig):
    """Draws one token per row by inverting the CDF of the sampling distribution.

    uniform: float32[B] in [0, 1) (unused when greedy); logits: float32[B, V].
    Returns (int32[B] tokens, float32[B] their log-probs under the sampling distribution).
    """
    logits = sampling_logits(logits, config)
    if config.greedy:
        tokens = _argmax(logits)
    else:
        probs = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))  # [B, V]
        tokens = categorical.inverse_cdf(probs, uniform[:, None])[:, 0]
        # Rounding can land on a zero-probability (filtered) token: take the mode instead.
        picked = jnp.take_along_axis(probs, tokens[:, None], axis=-1)[:, 0]
        tokens = jnp.where(picked > 0, tokens, _argmax(logits))
    picked_logits = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
    token_logprobs = picked_logits - jax.nn.logsumexp(logits, axis=-1)
    return tokens.astype(jnp.int32), token_logprobs


# Decode-loop segments: at most this many, each at least this many steps long.
_MAX_SEGMENTS = 4
_MIN_SEGMENT_STEPS = 16


def _segment_ends(num_steps: int) -> tuple[int, ...]:
    """Exclusive end step of each segment of the decode loop, e.g. 64 -> (16, 32, 48, 64)."""
    length = max(_MIN_SEGMENT_STEPS, -(-num_steps // _MAX_SEGMENTS))
    return tuple(range(length, num_steps, length)) + (num_steps,)


def _grow_cache(cache, length: int | None = None):
    """Zero-pads every layer's [B, KV, S, D] keys and values to `length` slots."""

    def grow(x):
        pad = 0 if length is None else length - x.shape[2]
        if pad:
            x = jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0)))
        return model_lib.constrain(x, model_lib.CACHE_AXES)

    return jax.tree_util.tree_map(grow, cache)


@flax.struct.dataclass
class _LoopState:
    step: jax.Array  # int32[] index t of the token sampled in this iteration
    last_tokens: jax.Array  # int32[B] token fed in this iteration (at slot P - 1 + t)
    tokens: jax.Array  # int32[B, N]
    logprobs: jax.Array  # float32[B, N]
    done: jax.Array  # bool[B] EOS already sampled
    # KV cache, one {'k', 'v': [B, KV, S, D]} per layer (S grows per segment up to
    # P + N - 1).
    cache: Any


def mask_vocab(logits, vocab_size: int | None):
    """logits [..., V] with the ids >= vocab_size (None: none) far below any other: their
    probability is exactly 0, and p log p stays finite (0, where -inf would give NaN)."""
    if vocab_size is None or vocab_size >= logits.shape[-1]:
        return logits
    return jnp.where(jnp.arange(logits.shape[-1]) < vocab_size, logits, -1e9)


def _decode(
    params,
    prompt_ids,
    prompt_mask,
    rng,
    sampling: SamplingConfig,
    *,
    model: model_lib.Transformer,
    max_new_tokens: int,
    stop_ids: tuple[int, ...],
    pad_id: int,
    vocab_size: int | None,
    cache_dtype,
) -> SampleOutput:
    """The traced sampler. prompt_ids int32[B, P], prompt_mask bool[B, P] (left-padded)."""
    b, p = prompt_ids.shape
    is_stop = lambda tokens: jnp.isin(tokens, jnp.asarray(stop_ids, jnp.int32))
    n = max_new_tokens
    variables = {"params": params}
    prompt_positions = model_lib.positions_from_mask(prompt_mask)  # [B, P]
    # Completion slots are always valid keys: the causal mask hides those not yet written.
    kv_mask = jnp.concatenate([prompt_mask, jnp.ones((b, n - 1), bool)], axis=1)  # [B, S]

    # Prefill: slots [0, P - 1) of the cache. The last prompt token is fed by the first
    # loop iteration, so the prefill's logits are unused and compiled away.
    first_length = p - 1 + _segment_ends(n)[0]  # cache slots of the first segment
    cache = _grow_cache(model_lib.init_cache(model.config, b, first_length, cache_dtype))
    if p > 1:
        _, cache = model.apply(
            variables,
            prompt_ids[:, :-1],
            prompt_positions[:, :-1],
            cache=cache,
            cache_index=0,
            kv_mask=kv_mask[:, :first_length],
        )

    def next_logits(cache, last_tokens, step, kv_mask):
        """Logits for the token at `step`, fed the token before it at slot P - 1 + step."""
        positions = (prompt_positions[:, -1] + step)[:, None]  # [B, 1]
        logits, cache = model.apply(
            variables,
            last_tokens[:, None],
            positions,
            cache=cache,
            cache_index=p - 1 + step,
            kv_mask=kv_mask,
        )
        return logits[:, 0], cache

    def cond(state: _LoopState, end: int):
        return (state.step < end) & ~jnp.all(state.done)

    def body(state: _LoopState, kv_mask):
        logits, cache = next_logits(state.cache, state.last_tokens, state.step, kv_mask)
        logits = mask_vocab(logits, vocab_size)
        tokens, logprobs = sample_tokens(uniforms[state.step], logits, sampling)
        tokens = jnp.where(state.done, pad_id, tokens)
        logprobs = jnp.where(state.done, 0.0, logprobs)
        return _LoopState(
            step=state.step + 1,
            last_tokens=tokens,
            tokens=jax.lax.dynamic_update_slice(state.tokens, tokens[:, None], (0, state.step)),
            logprobs=jax.lax.dynamic_update_slice(
                state.logprobs, logprobs[:, None], (0, state.step)
            ),
            done=state.done | is_stop(tokens),
            cache=cache,
        )

    # Decode. The random numbers of every step are drawn at once, outside the loop (on
    # CPU each draw inside it would be a loop of its own).
    uniforms = jax.random.uniform(rng, (n, b), jnp.float32)  # [N, B]
    state = _LoopState(
        step=jnp.zeros((), jnp.int32),
        last_tokens=prompt_ids[:, -1],
        tokens=jnp.full((b, n), pad_id, jnp.int32),
        logprobs=jnp.zeros((b, n), jnp.float32),
        done=jnp.zeros((b,), bool),
        cache=cache,
    )
    # The loop runs in a few segments, each over a cache just long enough for its last
    # step, so that early steps do not attend over (read) slots not yet written. Between
    # segments the cache grows by zero padding: one copy per segment, not per step.
    for end in _segment_ends(n):
        length = p - 1 + end
        state = state.replace(cache=_grow_cache(state.cache, length))
        state = jax.lax.while_loop(
            functools.partial(cond, end=end),
            functools.partial(body, kv_mask=kv_mask[:, :length]),
            state,
        )

    # Output: each row up to and including its first stop token; when every row stopped
    # early, the columns never visited stay pad.
    stopped = is_stop(state.tokens)
    mask = (jnp.cumsum(stopped, axis=1) - stopped < 1) & (jnp.arange(n) < state.step)  # [B, N]
    return SampleOutput(
        tokens=jnp.where(mask, state.tokens, pad_id),
        mask=mask,
        logprobs=jnp.where(mask, state.logprobs, 0.0),
        lengths=jnp.sum(mask, axis=1, dtype=jnp.int32),
    )


class Sampler:
    """A compiled sampler bound to one model shape, prompt length and completion length.

    `generate` compiles once per distinct sampling setting (temperature / top_k / top_p
    are static); calls with the same shapes and setting reuse the compiled program.
    """

    def __init__(
        self,
        model_config: model_lib.ModelConfig,
        *,
        max_prompt_len: int,
        max_new_tokens: int,
        stop_ids: tuple[int, ...],
        pad_id: int,
        sampling: SamplingConfig,
        mesh: jax.sharding.Mesh | None,
        rules,
        cache_dtype: str | None,
        vocab_size: int | None = None,
    ):
        cfg = model_config
        for name, value in (("max_prompt_len", max_prompt_len), ("max_new_tokens", max_new_tokens)):
            if not (isinstance(value, int | np.integer) and value >= 1):
                raise ValueError(f"sampler.{name}={value}: must be an integer >= 1")
        if max_prompt_len + max_new_tokens > cfg.max_len:
            raise ValueError(
                f"sampler.max_prompt_len + max_new_tokens = {max_prompt_len} + {max_new_tokens}"
                f" exceeds model.max_len={cfg.max_len}: allowed is a sum <= {cfg.max_len}"
            )
        stop_ids = tuple(int(i) for i in stop_ids)
        if not stop_ids:
            raise ValueError("sampler.stop_ids is empty: a completion needs a stop token")
        for name, value in (*(("stop_ids", i) for i in stop_ids), ("pad_id", pad_id)):
            if not (isinstance(value, int | np.integer) and 0 <= value < cfg.vocab_size):
                raise ValueError(f"sampler.{name}={value}: allowed is 0 <= id < {cfg.vocab_size}")
        if vocab_size is not None and not 0 < vocab_size <= cfg.vocab_size:
            raise ValueError(
                f"sampler.vocab_size={vocab_size}: allowed is 0 < size <= {cfg.vocab_size}"
            )
        if cache_dtype is not None and cache_dtype not in model_lib.DTYPES:
            raise ValueError(
                f"sampler.cache_dtype={cache_dtype!r}: allowed are {sorted(model_lib.DTYPES)}"
            )
        self._check_sampling(sampling, cfg)
        if mesh is not None:
            rules = sharding.validate_rules(sharding.DEFAULT_RULES if rules is None else rules)

        self.model_config = cfg
        self.model = model_lib.Transformer(cfg)
        self.max_prompt_len = int(max_prompt_len)
        self.max_new_tokens = int(max_new_tokens)
        self.stop_ids, self.pad_id = stop_ids, int(pad_id)
        # Rows of the model's vocabulary past the tokenizer's are never sampled.
        self.vocab_size = None if vocab_size in (None, cfg.vocab_size) else int(vocab_size)
        self.sampling = sampling
        self.mesh, self.rules = mesh, rules

        decode = functools.partial(
            _decode,
            model=self.model,
            max_new_tokens=self.max_new_tokens,
            stop_ids=self.stop_ids,
            pad_id=self.pad_id,
            vocab_size=self.vocab_size,
            cache_dtype=model_lib.DTYPES[cache_dtype] if cache_dtype else None,
        )
        if mesh is None:
            self._params_shardings = self._batch_sharding = None
            self._jitted = jax.jit(decode, static_argnums=(4,))
        else:
            dummy = jnp.zeros((1, 1), jnp.int32)
            abstract = jax.eval_shape(self.model.init, jax.random.key(0), dummy, dummy)
            self._params_shardings = sharding.params_shardings(mesh, abstract, rules)["params"]
            self._batch_sharding = sharding.named(mesh, ("batch", None), rules)
            rows = sharding.named(mesh, ("batch",), rules)
            self._jitted = jax.jit(
                decode,
                static_argnums=(4,),
                in_shardings=(
                    self._params_shardings,
                    self._batch_sharding,
                    self._batch_sharding,
                    sharding.replicated(mesh),
                ),
                out_shardings=SampleOutput(
                    tokens=self._batch_sharding,
                    mask=self._batch_sharding,
                    logprobs=self._batch_sharding,
                    lengths=rows,
                ),
            )

    @staticmethod
    def _check_sampling(sampling: SamplingConfig, cfg: model_lib.ModelConfig):
        if sampling.top_k > cfg.vocab_size:
            raise ValueError(
                f"sampler.top_k={sampling.top_k} exceeds model.vocab_size={cfg.vocab_size}: "
                f"allowed is 0 <= top_k <= {cfg.vocab_size}"
            )

    def _inputs(self, params, prompt_ids, prompt_mask):
        """Checks shapes and dtypes before anything compiles; pads prompts to max_prompt_len."""
        if jnp.ndim(prompt_ids) != 2 or jnp.shape(prompt_mask) != jnp.shape(prompt_ids):
            raise ValueError(
                f"prompt_ids {jnp.shape(prompt_ids)} and prompt_mask {jnp.shape(prompt_mask)}: "
                "allowed are two arrays of the same shape [batch, prompt_len]"
            )
        if not jnp.issubdtype(jnp.result_type(prompt_ids), jnp.integer):
            raise ValueError(
                f"prompt_ids dtype {jnp.result_type(prompt_ids)}: allowed are integer dtypes"
            )
        batch, prompt_len = jnp.shape(prompt_ids)
        if prompt_len > self.max_prompt_len:
            raise ValueError(
                f"prompt length {prompt_len} exceeds sampler.max_prompt_len="
                f"{self.max_prompt_len}: allowed are prompts of at most {self.max_prompt_len} "
                "tokens (prompts are never truncated)"
            )
        if self.mesh is not None:
            sharding.check_batch("sampler batch size", batch, self.mesh, self.rules)
        xp = jnp if isinstance(prompt_ids, jax.Array) else np
        if jnp.result_type(prompt_ids) != jnp.int32:
            prompt_ids = xp.asarray(prompt_ids).astype(np.int32)
        if jnp.result_type(prompt_mask) != jnp.bool_:
            prompt_mask = xp.asarray(prompt_mask).astype(bool)
        if prompt_len < self.max_prompt_len:
            left = ((0, 0), (self.max_prompt_len - prompt_len, 0))
            prompt_ids = xp.pad(prompt_ids, left, constant_values=self.pad_id)
            prompt_mask = xp.pad(prompt_mask, left, constant_values=False)
        params = nn.unbox(params)
        if self.mesh is not None:
            params = jax.device_put(params, self._params_shardings)
            prompt_ids = jax.device_put(prompt_ids, self._batch_sharding)
            prompt_mask = jax.device_put(prompt_mask, self._batch_sharding)
        return params, prompt_ids, prompt_mask

    def generate(
        self,
        params,
        prompt_ids,
        prompt_mask,
        rng,
        *,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
    ) -> SampleOutput:
        """Samples max_new_tokens per row (fewer when every row has hit EOS).

        params: the model's 'params' collection (boxed or not); prompt_ids int[B, P'] and
        prompt_mask bool[B, P'], left-padded, P' <= max_prompt_len; rng: a PRNG key.
        temperature / top_k / top_p override the sampler's setting for this call
        (e.g. temperature=0 for greedy evaluation); each setting compiles once.
        """
        sampling = self.sampling
        overrides = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if overrides:
            sampling = dataclasses.replace(sampling, **overrides)
            self._check_sampling(sampling, self.model_config)
        params, prompt_ids, prompt_mask = self._inputs(params, prompt_ids, prompt_mask)
        if self.mesh is None:
            return self._jitted(params, prompt_ids, prompt_mask, rng, sampling)
        with sharding.activation_rules(self.mesh, self.rules):
            return self._jitted(params, prompt_ids, prompt_mask, rng, sampling)

    def sample_k(self, params, prompt_ids, prompt_mask, rng, k: int, **overrides) -> SampleOutput:
        """k completions per prompt (for pass@k and group rollouts): fields are [B, k, ...]."""
        if not (isinstance(k, int | np.integer) and k >= 1):
            raise ValueError(f"sample_k k={k}: must be an integer >= 1")
        xp = np if isinstance(prompt_ids, np.ndarray) else jnp
        batch = jnp.shape(prompt_ids)[0]
        out = self.generate(
            params,
            xp.repeat(prompt_ids, k, axis=0),
            xp.repeat(prompt_mask, k, axis=0),
            rng,
            **overrides,
        )
        return jax.tree_util.tree_map(lambda x: x.reshape((batch, k) + x.shape[1:]), out)


def make_sampler(
    model_config: model_lib.ModelConfig,
    *,
    max_prompt_len: int,
    max_new_tokens: int,
    stop_ids: tuple[int, ...],
    pad_id: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    mesh: jax.sharding.Mesh | None = None,
    rules=None,
    cache_dtype: str | None = None,
    vocab_size: int | None = None,
) -> Sampler:
    """Validates the settings and returns a `Sampler` bound to them.

    stop_ids: the token ids that end a completion (a tokenizer's `stop_ids`).
    vocab_size: the tokenizer's vocabulary, when the model's has rows past it.
    cache_dtype: dtype name of the KV cache (default: the model's activation dtype).
    With a mesh, params are sharded by their logical axes and the batch over `batch`
    (rules default to `sharding.DEFAULT_RULES`).
    """
    return Sampler(
        model_config,
        max_prompt_len=max_prompt_len,
        max_new_tokens=max_new_tokens,
        stop_ids=stop_ids,
        pad_id=pad_id,
        sampling=SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p),
        mesh=mesh,
        rules=rules,
        cache_dtype=cache_dtype,
        vocab_size=vocab_size,
    )
