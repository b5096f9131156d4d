"""Jitted sampler: validates its settings, binds them to the decode loop of
`replax.sampling.decode` (one prefill call, then the whole loop inside `lax.while_loop`) and
casts and reshards the params it is given.

    sampler = make_sampler(model_config, SamplingConfig(temperature=1.0), max_prompt_len=16,
                           max_new_tokens=64, stop_ids=(1,), pad_id=0, mesh=mesh)
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

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from replax.core import processes, sharding
from replax.model import lora
from replax.model import transformer as model_lib
from replax.sampling import decode as decode_lib
from replax.sampling.decode import SampleOutput
from replax.sampling.distributions import SamplingConfig


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
        # LoRA with a decode dtype of its own: the adapters are folded into the weights as
        # they are cast (W + A B alpha / r), so decoding costs what the base's does and the
        # cast copy, made anyway, holds them. Without one, decoding applies the adapters
        # on the fly: no copy of the weights, and the train step's computation exactly.
        self.merges_adapters = lora.enabled(cfg) and dtype is not None
        self.max_prompt_len = int(max_prompt_len)
        self.max_new_tokens = int(max_new_tokens)
        self.stop_ids, self.pad_id = stop_ids, int(pad_id)
        # Rows of the model's vocabulary past the tokenizer's are never sampled.
        self.vocab_size = None if vocab_size in (None, cfg.vocab_size) else int(vocab_size)
        self.sampling = sampling
        self.mesh, self.rules = mesh, rules
        self._stages = {}  # compiled reshards of weights from a trainer on every process
        self.data_shards = 1 if mesh is None else sharding.data_parallel_size(mesh, rules)
        self._cache_dtype = model_lib.DTYPES[cache_dtype] if cache_dtype else None

        decode = functools.partial(
            decode_lib.decode,
            model=self.model,
            max_new_tokens=self.max_new_tokens,
            stop_ids=self.stop_ids,
            pad_id=self.pad_id,
            vocab_size=self.vocab_size,
            cache_dtype=self._cache_dtype,
            data_shards=self.data_shards,
        )
        if mesh is None:
            self._params_shardings = self._decode_shardings = self._prompt_sharding = None
            self._jitted = jax.jit(decode, static_argnums=(5, 6, 7, 8))
            self._prepare = jax.jit(self._cast)
        else:
            dummy = jnp.zeros((1, 1), jnp.int32)
            abstract = jax.eval_shape(self.model.init, jax.random.key(0), dummy, dummy)
            self._params_shardings = sharding.params_shardings(mesh, abstract, rules)["params"]
            sharding.check_divisible(
                "sampler mesh", mesh, nn.unbox(abstract)["params"], self._params_shardings
            )
            # What the decode loop reads: without the adapters when they are merged.
            self._decode_shardings = self._params_shardings
            if self.merges_adapters:
                self._decode_shardings = lora.without_adapters(self._params_shardings)
            # Prompts are small integers: every device holds all of them, and the prefill
            # splits them over the data shards (padded when these do not divide them).
            self._prompt_sharding = sharding.replicated(mesh)
            table = sharding.named(mesh, ("batch", None), rules)
            self._jitted = jax.jit(
                decode,
                static_argnums=(5, 6, 7, 8),
                in_shardings=(
                    self._decode_shardings,
                    self._prompt_sharding,
                    self._prompt_sharding,
                    sharding.replicated(mesh),
                    sharding.replicated(mesh),
                ),
                out_shardings=SampleOutput(
                    tokens=table,
                    mask=table,
                    logprobs=table,
                    lengths=sharding.named(mesh, ("batch",), rules),
                ),
            )
            self._prepare = jax.jit(self._cast, out_shardings=self._decode_shardings)

    def _cast(self, params):
        """The params in the sampler's dtype (floating leaves; unchanged without one), the
        adapters merged when `merges_adapters`."""
        if self.merges_adapters and lora.has_adapters(params):
            params = lora.merged(params, self.model_config)
        if self.dtype is None:
            return params
        cast = lambda x: x.astype(self.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
        return jax.tree_util.tree_map(cast, params)

    @property
    def params_shardings(self):
        """The decode loop's shardings of the params (None without a mesh)."""
        return self._params_shardings

    def cast_params(self, params):
        """params (any subtree of the model's) in the sampler's dtype, where they are."""
        return self._cast(params)

    def prepare_params(self, params):
        """The params as the decode loop reads them: in the sampler's dtype and layout.
        One jitted cast-and-reshard; nothing at all when they already are."""
        params = nn.unbox(params)
        leaves = jax.tree_util.tree_leaves(params)
        if self._params_shardings is None:
            targets = [None] * len(leaves)
        else:
            targets = jax.tree_util.tree_leaves(self._decode_shardings)
            devices = set(self.mesh.devices.flat)
            if any(isinstance(x, jax.Array) and x.sharding.device_set != devices for x in leaves):
                # Weights on other devices (a disjoint trainer's): one transfer of the whole
                # tree into the decode layout; a jitted program spans one set of devices.
                if all(x.is_fully_addressable for x in leaves):
                    params = jax.device_put(params, self._input_shardings(params))
                    leaves = jax.tree_util.tree_leaves(params)
                else:  # a trainer over every process, this process's sampler mesh
                    leaves = processes.copy_to_process_mesh(
                        leaves,
                        jax.tree_util.tree_leaves(self._input_shardings(params)),
                        self._stages,
                    )
                    params = jax.tree_util.tree_unflatten(
                        jax.tree_util.tree_structure(params), leaves
                    )

        def ready(x, target):
            if not isinstance(x, jax.Array) or self.dtype not in (None, x.dtype):
                return False
            return target is None or x.sharding.is_equivalent_to(target, x.ndim)

        if len(leaves) == len(targets) and all(map(ready, leaves, targets)):
            return params
        return self._prepare(params)

    def _input_shardings(self, params):
        """The sampler's layout of params as given: with or without adapters."""
        if lora.enabled(self.model_config) and not lora.has_adapters(params):
            return lora.without_adapters(self._params_shardings)
        return self._params_shardings

    @staticmethod
    def _check_sampling(sampling: SamplingConfig, cfg: model_lib.ModelConfig):
        if sampling.top_k > cfg.vocab_size:
            raise ValueError(
                f"sampler.top_k={sampling.top_k} exceeds model.vocab_size={cfg.vocab_size}: "
                f"allowed is 0 <= top_k <= {cfg.vocab_size}"
            )
        if any(token >= cfg.vocab_size for token, _ in sampling.logit_bias):
            raise ValueError(
                f"sampler.logit_bias={sampling.logit_bias}: allowed are ids < {cfg.vocab_size}"
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
        row_block: tuple[int, int] = (0, 1),
        rollout_keys: bool = False,
        first_rollout: int = 0,
    ) -> SampleOutput:
        """Samples max_new_tokens per row (fewer when every row has hit EOS).

        params: the model's 'params' collection (boxed or not), in any dtype and layout;
        prompt_ids int[B, P'] and prompt_mask bool[B, P'], left-padded, P' <=
        max_prompt_len; rng: a PRNG key. num_samples: G completions of each prompt, rows
        i G ... i G + G - 1 those of prompt i (each prompt is prefilled once; the tokens
        are those of B x G repeated prompts under the same rng). temperature / top_k /
        top_p override the sampler's setting for this call (e.g. temperature=0 for greedy
        evaluation); each setting compiles once. row_block (i, n): the prompts are the
        i-th of n equal blocks of a batch, sampled as they would be in the whole batch.
        rollout_keys: each row draws from its own key, fold_in(rng, rollout index), with
        rollout index first_rollout + i R + r for row r of block (i, n): the rollout the
        engine (`replax.sampling.engine`) generates under the same rng, wherever it runs.
        first_rollout numbers the batch's rollouts within a run (a traced value: no
        recompilation), so that a rollout's key is its index in the run's whole stream.
        Returns [B x G, ...] fields.
        """
        args = self.call_args(
            params, prompt_ids, prompt_mask, rng, num_samples, row_block, temperature, top_k, top_p
        )
        return self.call(self._jitted, *args, bool(rollout_keys), first_rollout=first_rollout)

    def call_args(
        self, params, prompt_ids, prompt_mask, rng, num_samples, row_block, *sampling_overrides
    ) -> tuple:
        """A decode program's checked, placed arguments; sampling_overrides: temperature,
        top_k, top_p (None keeps the sampler's)."""
        names = zip(("temperature", "top_k", "top_p"), sampling_overrides)
        overrides = {k: v for k, v in names if v is not None}
        sampling = self.sampling
        if overrides:
            sampling = dataclasses.replace(sampling, **overrides)
            self._check_sampling(sampling, self.model_config)
        prompt_ids, prompt_mask = self._inputs(prompt_ids, prompt_mask, num_samples)
        params = self.prepare_params(params)
        row_block = (int(row_block[0]), int(row_block[1]))
        return params, prompt_ids, prompt_mask, rng, sampling, int(num_samples), row_block

    def call(self, jitted, *args, first_rollout=None):
        """jitted(*args) under the sampler mesh's activation rules; first_rollout: a
        decode program's (`call_args`, then the statics): an int32 argument after the key."""
        if first_rollout is not None:
            args = (*args[:4], np.int32(first_rollout), *args[4:])
        if self.mesh is None:
            return jitted(*args)
        with sharding.activation_rules(self.mesh, self.rules):
            return jitted(*args)

    def sample_k(self, params, prompt_ids, prompt_mask, rng, k: int, **overrides) -> SampleOutput:
        """k completions per prompt (for pass@k and group rollouts): fields are [B, k, ...]."""
        if not (isinstance(k, int | np.integer) and k >= 1):
            raise ValueError(f"sample_k k={k}: must be an integer >= 1")
        batch = jnp.shape(prompt_ids)[0]
        out = self.generate(params, prompt_ids, prompt_mask, rng, num_samples=k, **overrides)
        return jax.tree_util.tree_map(lambda x: x.reshape((batch, k) + x.shape[1:]), out)


def make_sampler(
    model_config: model_lib.ModelConfig,
    sampling: SamplingConfig | None = None,
    *,
    max_prompt_len: int,
    max_new_tokens: int,
    stop_ids: tuple[int, ...],
    pad_id: int,
    mesh: jax.sharding.Mesh | None = None,
    rules=None,
    dtype: str | None = None,
    cache_dtype: str | None = None,
    vocab_size: int | None = None,
) -> Sampler:
    """Validates the settings and returns a `Sampler` bound to them.

    sampling: the distribution (`SamplingConfig`, or a type that inherits it, such as a
      run's rollout section: the sampler keeps the SamplingConfig's fields alone); None:
      SamplingConfig(), temperature 1 and no filter.
    stop_ids: the token ids that end a completion (a tokenizer's `stop_ids`).
    vocab_size: the tokenizer's vocabulary, when the model's has rows past it.
    mesh, rules: the sampler's own mesh (over the same devices as training's, any shape,
      e.g. (1, 1, 8) for tensor parallelism) and rule table (default
      `sharding.DEFAULT_RULES`); params are sharded by their logical axes, rows over
      `batch`. None: one device.
    dtype: dtype name the sampler casts the weights to and computes in (default: the
      model's); cache_dtype: that of the KV cache (default: the compute dtype).
    """
    sampling = SamplingConfig() if sampling is None else sampling
    fields = {f.name: getattr(sampling, f.name) for f in dataclasses.fields(SamplingConfig)}
    return Sampler(
        model_config,
        max_prompt_len=max_prompt_len,
        max_new_tokens=max_new_tokens,
        stop_ids=stop_ids,
        pad_id=pad_id,
        sampling=SamplingConfig(**fields),
        mesh=mesh,
        rules=rules,
        dtype=dtype,
        cache_dtype=cache_dtype,
        vocab_size=vocab_size,
    )
