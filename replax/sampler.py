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
    group = sampler.generate(params, prompt_ids, prompt_mask, rng, num_samples=8)

With num_samples = G each of the B prompts is prefilled once and its cache repeated to
G consecutive rows; the B x G rows then decode as B x G repeated prompts would, drawing
the same random numbers. The sampler has its own mesh, rule table and dtype (e.g.
tensor-parallel bfloat16 weights while training keeps float32 FSDP ones): each call casts
and reshards the params once, in one jitted program, before the loop.

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

from replax import model as model_lib
from replax import sharding
from replax.sampling import SamplingConfig, mask_vocab, sample_tokens


@flax.struct.dataclass
class SampleOutput:
    tokens: jax.Array  # int32[B, N] completion; pad_id after EOS (EOS itself kept)
    mask: jax.Array  # bool[B, N] generated tokens, up to and including EOS
    logprobs: jax.Array  # float32[B, N] behaviour log-probs; 0 where mask is False
    lengths: jax.Array  # int32[B] number of generated tokens (= mask.sum(-1))


# Decode-loop segments: at most this many, each at least this many steps long.
_MAX_SEGMENTS = 4
_MIN_SEGMENT_STEPS = 16


def _segment_ends(num_steps: int) -> tuple[int, ...]:
    """Exclusive end step of each segment of the decode loop, e.g. 64 -> (16, 32, 48, 64)."""
    length = max(_MIN_SEGMENT_STEPS, -(-num_steps // _MAX_SEGMENTS))
    return tuple(range(length, num_steps, length)) + (num_steps,)


def _cache_axes(config: model_lib.ModelConfig, leaf):
    """Logical axes of a KV-cache leaf: [B, KV, S, D] per layer, or [L, B, KV, S, D] with
    the layers stacked. Either way batch is axis -4 and length axis -2."""
    if hasattr(model_lib, "cache_axes"):
        return tuple(model_lib.cache_axes(config))
    return (None,) * (leaf.ndim - 4) + tuple(model_lib.CACHE_AXES)


def _constrain_cache(cache, config: model_lib.ModelConfig):
    leaf_axes = lambda x: _cache_axes(config, x)
    return jax.tree_util.tree_map(lambda x: model_lib.constrain(x, leaf_axes(x)), cache)


def _grow_cache(cache, config: model_lib.ModelConfig, length: int):
    """Zero-pads the length axis (-2) of every key and value array to `length` slots."""

    def grow(x):
        pad = length - x.shape[-2]
        return jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pad), (0, 0)]) if pad else x

    return _constrain_cache(jax.tree_util.tree_map(grow, cache), config)


@flax.struct.dataclass
class _LoopState:
    step: jax.Array  # int32[] index t of the token sampled in this iteration
    last_tokens: jax.Array  # int32[R] token fed in this iteration (at slot P - 1 + t)
    tokens: jax.Array  # int32[R, N]
    logprobs: jax.Array  # float32[R, N]
    done: jax.Array  # bool[R] EOS already sampled
    # KV cache: keys and values [R, KV, S, D] (per layer, or stacked [L, R, KV, S, D]);
    # S grows per segment up to P + N - 1.
    cache: Any


def _prefill(
    variables,
    prompt_ids,
    prompt_positions,
    kv_mask,
    *,
    model,
    cache_len,
    cache_dtype,
    num_samples: int,
    data_shards: int,
):
    """The KV cache of R = B x G rows, each prompt run through the model once.

    prompt_ids, prompt_positions int32[B, P]; kv_mask bool[B, cache_len]. Fills slots
    [0, P - 1) for the B prompts, then repeats each prompt's cache G times along the batch
    axis (rows of one prompt consecutive). When the data shards do not divide B (they
    divide R), the prefill runs on B padded with empty rows up to a multiple of them.
    """
    b, p = prompt_ids.shape
    padded = -(-b // data_shards) * data_shards
    if padded > b:
        pad = ((0, padded - b), (0, 0))
        prompt_ids, prompt_positions = jnp.pad(prompt_ids, pad), jnp.pad(prompt_positions, pad)
        kv_mask = jnp.pad(kv_mask, pad)  # empty rows: no valid key, finite attention
    cache = model_lib.init_cache(model.config, padded, cache_len, cache_dtype)
    cache = _constrain_cache(cache, model.config)
    # The last prompt token is fed by the first loop iteration, so the prefill's logits
    # are unused and compiled away.
    _, cache = model.apply(
        variables,
        prompt_ids[:, :-1],
        prompt_positions[:, :-1],
        cache=cache,
        cache_index=0,
        kv_mask=kv_mask,
    )

    def per_row(x):  # [.., padded, KV, S, D] -> [.., B x G, KV, S, D]
        x = jax.lax.slice_in_dim(x, 0, b, axis=x.ndim - 4)
        return jnp.repeat(x, num_samples, axis=x.ndim - 4)

    return _constrain_cache(jax.tree_util.tree_map(per_row, cache), model.config)


def _decode(
    params,
    prompt_ids,
    prompt_mask,
    rng,
    sampling: SamplingConfig,
    num_samples: int,
    *,
    model: model_lib.Transformer,
    max_new_tokens: int,
    stop_ids: tuple[int, ...],
    pad_id: int,
    vocab_size: int | None,
    cache_dtype,
    data_shards: int,
) -> SampleOutput:
    """The traced sampler. prompt_ids int32[B, P], prompt_mask bool[B, P] (left-padded):
    G = num_samples completions of each, R = B x G rows."""
    b, p = prompt_ids.shape
    rows = b * num_samples
    is_stop = lambda tokens: jnp.isin(tokens, jnp.asarray(stop_ids, jnp.int32))
    n = max_new_tokens
    variables = {"params": params}
    prompt_positions = model_lib.positions_from_mask(prompt_mask)  # [B, P]
    # Completion slots are always valid keys: the causal mask hides those not yet written.
    kv_mask = jnp.concatenate([prompt_mask, jnp.ones((b, n - 1), bool)], axis=1)  # [B, S]
    first_length = p - 1 + _segment_ends(n)[0]  # cache slots of the first segment

    # PREFILL slots [0, P - 1) once per prompt, then broadcast to the R rows.
    if p > 1:
        cache = _prefill(
            variables,
            prompt_ids,
            prompt_positions,
            kv_mask[:, :first_length],
            model=model,
            cache_len=first_length,
            cache_dtype=cache_dtype,
            num_samples=num_samples,
            data_shards=data_shards,
        )
    else:
        cache = model_lib.init_cache(model.config, rows, first_length, cache_dtype)
        cache = _constrain_cache(cache, model.config)
    repeat = lambda x: jnp.repeat(x, num_samples, axis=0)  # [B, ...] -> [R, ...]
    kv_mask, last_positions = repeat(kv_mask), repeat(prompt_positions[:, -1])

    def next_logits(cache, last_tokens, step, kv_mask):
        """Logits for the token at `step`, fed the token before it at slot P - 1 + step."""
        positions = (last_positions + step)[:, None]  # [R, 1]
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

    # DECODE the R rows. The random numbers of every step are drawn at once, outside the
    # loop (on CPU each draw inside it would be a loop of its own), as for R prompts.
    uniforms = jax.random.uniform(rng, (n, rows), jnp.float32)  # [N, R]
    state = _LoopState(
        step=jnp.zeros((), jnp.int32),
        last_tokens=repeat(prompt_ids[:, -1]),
        tokens=jnp.full((rows, n), pad_id, jnp.int32),
        logprobs=jnp.zeros((rows, n), jnp.float32),
        done=jnp.zeros((rows,), bool),
        cache=cache,
    )
    # The loop runs in a few segments, each over a cache just long enough for its last
    # step, so that early steps do not attend over (read) slots not yet written. Between
    # segments the cache grows by zero padding: one copy per segment, not per step.
    for end in _segment_ends(n):
        length = p - 1 + end
        state = state.replace(cache=_grow_cache(state.cache, model.config, length))
        state = jax.lax.while_loop(
            functools.partial(cond, end=end),
            functools.partial(body, kv_mask=kv_mask[:, :length]),
            state,
        )

    # OUTPUT: each row up to and including its first stop token; when every row stopped
    # early, the columns never visited stay pad.
    stopped = is_stop(state.tokens)
    mask = (jnp.cumsum(stopped, axis=1) - stopped < 1) & (jnp.arange(n) < state.step)  # [R, N]
    return SampleOutput(
        tokens=jnp.where(mask, state.tokens, pad_id),
        mask=mask,
        logprobs=jnp.where(mask, state.logprobs, 0.0),
        lengths=jnp.sum(mask, axis=1, dtype=jnp.int32),
    )


def _check_divisible(mesh, abstract_params, shardings) -> None:
    """Raises a one-line error when a mesh axis does not divide the parameter dimension it
    shards (jit would fail on the first call, less clearly)."""
    leaves = jax.tree_util.tree_leaves_with_path(abstract_params)
    for (path, leaf), target in zip(leaves, jax.tree_util.tree_leaves(shardings)):
        for dim, axes in zip(leaf.shape, target.spec):
            axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
            shards = int(np.prod([mesh.shape[a] for a in axes]))
            if dim % shards:
                raise ValueError(
                    f"sampler mesh {dict(mesh.shape)}: parameter "
                    f"{jax.tree_util.keystr(path)} dimension {dim} is not divisible by the "
                    f"{shards} shards of mesh axes {axes}: allowed are meshes whose axes "
                    "divide the dimensions they shard"
                )


class Sampler:
    """A compiled sampler bound to one model shape, prompt length and completion length.

    The sampler decodes on its own mesh, rules and dtype, which may differ from training's
    (e.g. tensor-parallel bfloat16 weights while training keeps FSDP float32): `generate`
    casts and reshards the params once per call, in one jitted program.
    `generate` compiles once per distinct sampling setting (temperature / top_k / top_p
    are static) and number of samples per prompt; calls with the same shapes and setting
    reuse the compiled program.
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
        dtype: str | None = None,
        cache_dtype: str | None = None,
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
        for name, value in (("dtype", dtype), ("cache_dtype", cache_dtype)):
            if value is not None and value not in model_lib.DTYPES:
                raise ValueError(
                    f"sampler.{name}={value!r}: allowed are {sorted(model_lib.DTYPES)} or None"
                )
        if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
            raise ValueError(f"sampler.mesh={mesh!r}: allowed are a jax.sharding.Mesh or None")
        self._check_sampling(sampling, cfg)
        if mesh is not None:
            rules = sharding.validate_rules(sharding.DEFAULT_RULES if rules is None else rules)

        # Decoding in `dtype`: weights stored and computed in it (and the cache, unless
        # cache_dtype says otherwise).
        if dtype is not None:
            cfg = dataclasses.replace(cfg, dtype=dtype, param_dtype=dtype)
        self.model_config = cfg
        self.model = model_lib.Transformer(cfg)
        self.dtype = None if dtype is None else model_lib.DTYPES[dtype]
        self.max_prompt_len = int(max_prompt_len)
        self.max_new_tokens = int(max_new_tokens)
        self.stop_ids, self.pad_id = stop_ids, int(pad_id)
        # Rows of the model's vocabulary past the tokenizer's are never sampled.
        self.vocab_size = None if vocab_size in (None, cfg.vocab_size) else int(vocab_size)
        self.sampling = sampling
        self.mesh, self.rules = mesh, rules
        self.data_shards = 1 if mesh is None else sharding.data_parallel_size(mesh, rules)

        decode = functools.partial(
            _decode,
            model=self.model,
            max_new_tokens=self.max_new_tokens,
            stop_ids=self.stop_ids,
            pad_id=self.pad_id,
            vocab_size=self.vocab_size,
            cache_dtype=model_lib.DTYPES[cache_dtype] if cache_dtype else None,
            data_shards=self.data_shards,
        )
        if mesh is None:
            self._params_shardings = self._prompt_sharding = None
            self._jitted = jax.jit(decode, static_argnums=(4, 5))
            self._prepare = jax.jit(self._cast)
        else:
            dummy = jnp.zeros((1, 1), jnp.int32)
            abstract = jax.eval_shape(self.model.init, jax.random.key(0), dummy, dummy)
            self._params_shardings = sharding.params_shardings(mesh, abstract, rules)["params"]
            _check_divisible(mesh, nn.unbox(abstract)["params"], self._params_shardings)
            # Prompts are small integers: every device holds all of them, and the prefill
            # splits them over the data shards (padded when these do not divide them).
            self._prompt_sharding = sharding.replicated(mesh)
            table = sharding.named(mesh, ("batch", None), rules)
            self._jitted = jax.jit(
                decode,
                static_argnums=(4, 5),
                in_shardings=(
                    self._params_shardings,
                    self._prompt_sharding,
                    self._prompt_sharding,
                    sharding.replicated(mesh),
                ),
                out_shardings=SampleOutput(
                    tokens=table,
                    mask=table,
                    logprobs=table,
                    lengths=sharding.named(mesh, ("batch",), rules),
                ),
            )
            self._prepare = jax.jit(self._cast, out_shardings=self._params_shardings)

    def _cast(self, params):
        """The params in the sampler's dtype (floating leaves; unchanged without one)."""
        if self.dtype is None:
            return params
        cast = lambda x: x.astype(self.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
        return jax.tree_util.tree_map(cast, params)

    def prepare_params(self, params):
        """The params as the decode loop reads them: in the sampler's dtype and layout.
        One jitted cast-and-reshard; nothing at all when they already are."""
        params = nn.unbox(params)
        leaves = jax.tree_util.tree_leaves(params)
        if self._params_shardings is None:
            targets = [None] * len(leaves)
        else:
            targets = jax.tree_util.tree_leaves(self._params_shardings)

        def ready(x, target):
            if not isinstance(x, jax.Array) or self.dtype not in (None, x.dtype):
                return False
            return target is None or x.sharding.is_equivalent_to(target, x.ndim)

        if len(leaves) == len(targets) and all(map(ready, leaves, targets)):
            return params
        return self._prepare(params)

    @staticmethod
    def _check_sampling(sampling: SamplingConfig, cfg: model_lib.ModelConfig):
        if sampling.top_k > cfg.vocab_size:
            raise ValueError(
                f"sampler.top_k={sampling.top_k} exceeds model.vocab_size={cfg.vocab_size}: "
                f"allowed is 0 <= top_k <= {cfg.vocab_size}"
            )

    def _inputs(self, prompt_ids, prompt_mask, num_samples):
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
        if not (isinstance(num_samples, int | np.integer) and num_samples >= 1):
            raise ValueError(f"num_samples={num_samples}: allowed is an integer >= 1")
        batch, prompt_len = jnp.shape(prompt_ids)
        if prompt_len > self.max_prompt_len:
            raise ValueError(
                f"prompt length {prompt_len} exceeds sampler.max_prompt_len="
                f"{self.max_prompt_len}: allowed are prompts of at most {self.max_prompt_len} "
                "tokens (prompts are never truncated)"
            )
        if self.mesh is not None:
            name = "sampler batch size" + (f" (prompts x {num_samples})" if num_samples > 1 else "")
            sharding.check_batch(name, batch * num_samples, self.mesh, self.rules)
        xp = jnp if isinstance(prompt_ids, jax.Array) else np
        if jnp.result_type(prompt_ids) != jnp.int32:
            prompt_ids = xp.asarray(prompt_ids).astype(np.int32)
        if jnp.result_type(prompt_mask) != jnp.bool_:
            prompt_mask = xp.asarray(prompt_mask).astype(bool)
        if prompt_len < self.max_prompt_len:
            left = ((0, 0), (self.max_prompt_len - prompt_len, 0))
            prompt_ids = xp.pad(prompt_ids, left, constant_values=self.pad_id)
            prompt_mask = xp.pad(prompt_mask, left, constant_values=False)
        if self.mesh is not None:
            # A global array split over other processes is taken as it is (rollouts pass
            # every process all prompts, replicated).
            def put(x):
                if isinstance(x, jax.Array) and not x.is_fully_addressable:
                    return x
                return jax.device_put(x, self._prompt_sharding)

            prompt_ids, prompt_mask = put(prompt_ids), put(prompt_mask)
        return prompt_ids, prompt_mask

    def generate(
        self,
        params,
        prompt_ids,
        prompt_mask,
        rng,
        *,
        num_samples: int = 1,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
    ) -> SampleOutput:
        """Samples max_new_tokens per row (fewer when every row has hit EOS).

        params: the model's 'params' collection (boxed or not), in any dtype and layout;
        prompt_ids int[B, P'] and prompt_mask bool[B, P'], left-padded, P' <=
        max_prompt_len; rng: a PRNG key. num_samples: G completions of each prompt, rows
        i G ... i G + G - 1 those of prompt i (each prompt is prefilled once; the tokens
        are those of B x G repeated prompts under the same rng). temperature / top_k /
        top_p override the sampler's setting for this call (e.g. temperature=0 for greedy
        evaluation); each setting compiles once. Returns [B x G, ...] fields.
        """
        sampling = self.sampling
        overrides = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if overrides:
            sampling = dataclasses.replace(sampling, **overrides)
            self._check_sampling(sampling, self.model_config)
        prompt_ids, prompt_mask = self._inputs(prompt_ids, prompt_mask, num_samples)
        params = self.prepare_params(params)
        args = (params, prompt_ids, prompt_mask, rng, sampling, int(num_samples))
        if self.mesh is None:
            return self._jitted(*args)
        with sharding.activation_rules(self.mesh, self.rules):
            return self._jitted(*args)

    def sample_k(self, params, prompt_ids, prompt_mask, rng, k: int, **overrides) -> SampleOutput:
        """k completions per prompt (for pass@k and group rollouts): fields are [B, k, ...]."""
        if not (isinstance(k, int | np.integer) and k >= 1):
            raise ValueError(f"sample_k k={k}: must be an integer >= 1")
        batch = jnp.shape(prompt_ids)[0]
        out = self.generate(params, prompt_ids, prompt_mask, rng, num_samples=k, **overrides)
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
    top_p_candidates: int = 64,
    mesh: jax.sharding.Mesh | None = None,
    rules=None,
    dtype: str | None = None,
    cache_dtype: str | None = None,
    vocab_size: int | None = None,
) -> Sampler:
    """Validates the settings and returns a `Sampler` bound to them.

    stop_ids: the token ids that end a completion (a tokenizer's `stop_ids`).
    vocab_size: the tokenizer's vocabulary, when the model's has rows past it.
    top_p_candidates: top-p looks for its cut among this many most likely tokens, and
      sorts the whole vocabulary only when, for some row, they hold less than top_p.
    mesh, rules: the sampler's own mesh (over the same devices as training's, any shape,
      e.g. (1, 1, 8) for tensor parallelism) and rule table (default
      `sharding.DEFAULT_RULES`); params are sharded by their logical axes, rows over
      `batch`. None: one device.
    dtype: dtype name the sampler casts the weights to and computes in (default: the
      model's); cache_dtype: that of the KV cache (default: the compute dtype).
    """
    return Sampler(
        model_config,
        max_prompt_len=max_prompt_len,
        max_new_tokens=max_new_tokens,
        stop_ids=stop_ids,
        pad_id=pad_id,
        sampling=SamplingConfig(
            temperature=temperature, top_k=top_k, top_p=top_p, top_p_candidates=top_p_candidates
        ),
        mesh=mesh,
        rules=rules,
        dtype=dtype,
        cache_dtype=cache_dtype,
        vocab_size=vocab_size,
    )
