"""The two sides scripts/bench_tunix.py times back to back, at one `Shape`: replax's
sampler and train step (`Replax`) and Tunix's vanilla sampler and GRPO actor step
(`Tunix`), with the workload both run (random prompts and tokens, GRPO advantages, the
same AdamW). bench_tunix.py's docstring says what each side runs and how it is timed;
the Tunix side needs google-tunix (its virtualenv: the same docstring).
"""

import dataclasses
import inspect

PAD_ID = 0
LEARNING_RATE = 1e-6


@dataclasses.dataclass(frozen=True)
class Shape:
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    mlp: int
    vocab: int
    prompts: int
    group: int
    prompt_len: int
    new_tokens: int
    train_batch: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def rollouts(self) -> int:
        return self.prompts * self.group

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.new_tokens

    @property
    def stop_id(self) -> int:
        """Never sampled on either side, so every rollout runs to full length."""
        return self.vocab - 1

    def num_params(self) -> int:
        attention = self.d_model * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.d_model * self.mlp
        return self.vocab * self.d_model + self.layers * (attention + mlp + 2 * self.d_model)


def random_prompts(shape: Shape, seed: int):
    """int32[prompts, prompt_len], ids in [1, stop_id): no pad, no stop token."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(1, shape.stop_id, (shape.prompts, shape.prompt_len)).astype(np.int32)


def train_tokens(shape: Shape, seed: int):
    """int32[train_batch, seq_len] prompt + completion, every token valid, no pad."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(1, shape.stop_id, (shape.train_batch, shape.seq_len)).astype(np.int32)


def group_advantages(shape: Shape, seed: int):
    """float32[train_batch]: a GRPO advantage per sequence (0/1 rewards, normalised per
    group of G)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rewards = (rng.random((shape.train_batch // shape.group, shape.group)) < 0.5).astype(np.float32)
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    return (centred / (rewards.std(axis=1, keepdims=True) + 1e-6)).reshape(-1)


def optimizer():
    from replax.rl import train_step as train_step_lib

    return train_step_lib.make_optimizer(
        train_step_lib.OptimizerConfig(learning_rate=LEARNING_RATE, grad_clip=1.0)
    )


# REPLAX


class Replax:
    """Replax's sampler and train step at `shape`."""

    def __init__(self, shape: Shape):
        import jax

        from replax.core import sharding
        from replax.model import transformer as model_lib
        from replax.sampling import sampler as sampler_lib

        self.shape = shape
        self.config = model_lib.ModelConfig(
            vocab_size=shape.vocab,
            num_layers=shape.layers,
            d_model=shape.d_model,
            num_heads=shape.heads,
            num_kv_heads=shape.kv_heads,
            head_dim=shape.head_dim,
            mlp_dim=shape.mlp,
            max_len=shape.seq_len,
        )
        self.model = model_lib.Transformer(self.config)
        self.mesh = sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])
        self.rules = sharding.validate_rules(sharding.DEFAULT_RULES)
        self.sampler = sampler_lib.make_sampler(
            self.config,
            sampler_lib.SamplingConfig(temperature=1.0),
            max_prompt_len=shape.prompt_len,
            max_new_tokens=shape.new_tokens,
            stop_ids=(shape.stop_id,),
            pad_id=PAD_ID,
            vocab_size=shape.stop_id,
        )
        self.shared_prefill = "num_samples" in inspect.signature(self.sampler.generate).parameters
        self.state = None
        self.step = None

    @property
    def rollout_path(self) -> str:
        return "generate(num_samples=G)" if self.shared_prefill else "sample_k (prompts repeated)"

    def build_train(self):
        import jax

        from replax.rl import objectives
        from replax.rl import train_step as train_step_lib

        self.state, state_shardings = train_step_lib.init_train_state(
            self.model, optimizer(), jax.random.key(0), self.mesh, self.rules
        )
        self.batch = self._train_batch()
        batch_sharding = train_step_lib.batch_shardings(self.mesh, self.rules, self.batch)
        self.batch = jax.device_put(self.batch, batch_sharding)
        self.step = train_step_lib.make_train_step(
            self.model,
            optimizer(),
            objectives.LossConfig(name="ppo", aggregation="sequence_mean"),
            self.mesh,
            self.rules,
            state_shardings,
            batch_sharding,
        )

    def _train_batch(self):
        import numpy as np

        s = self.shape
        tokens = train_tokens(s, seed=1)
        completion = np.arange(s.seq_len)[None, :] >= s.prompt_len  # [1, L]
        loss_mask = np.broadcast_to(completion, tokens.shape).astype(np.float32)
        b = s.train_batch
        return {
            "tokens": tokens,
            "attention_mask": np.ones(tokens.shape, bool),
            "loss_mask": loss_mask,
            # About the uniform policy's log-prob: ratios near 1, as on fresh rollouts.
            "behaviour_logprobs": loss_mask * -np.log(s.vocab).astype(np.float32),
            "advantage": group_advantages(s, seed=2),
            "reward": np.zeros(b, np.float32),
            "baseline": np.zeros(b, np.float32),
            "importance_weights": np.ones(b, np.float32),
            "age": np.zeros(b, np.int32),
            "times_sampled": np.zeros(b, np.int32),
        }

    def rollout(self, seed: int) -> int:
        """Generates prompts x G completions; returns the number of tokens generated."""
        import jax
        import numpy as np

        if self.state is None:
            self.build_train()
        prompts = random_prompts(self.shape, seed)
        mask = np.ones(prompts.shape, bool)
        rng = jax.random.key(seed)
        if self.shared_prefill:
            out = self.sampler.generate(
                self.state.params, prompts, mask, rng, num_samples=self.shape.group
            )
        else:
            out = self.sampler.sample_k(self.state.params, prompts, mask, rng, self.shape.group)
        return int(np.asarray(out.lengths).sum())

    def train_step(self) -> None:
        if self.step is None:
            self.build_train()
        self.state, metrics = self.step(self.state, self.batch)
        return metrics["loss"]


# TUNIX


class _IdTokenizer:
    """Ids written as decimal text: Tunix's sampler takes and returns strings."""

    def encode(self, text, **kwargs):
        return [int(t) for t in text.split()]

    def decode(self, ids, **kwargs):
        return ""

    def bos_id(self):
        return None

    def eos_id(self):
        return self._eos

    def pad_id(self):
        return PAD_ID

    def __init__(self, eos_id: int):
        self._eos = eos_id


class Tunix:
    """Tunix's Llama3 model, vanilla sampler and GRPO train step at `shape`."""

    def __init__(self, shape: Shape):
        from flax import nnx
        from tunix.generate import sampler as sampler_lib
        from tunix.models.llama3 import model as llama3

        self.shape = shape
        config = llama3.ModelConfig(
            num_layers=shape.layers,
            vocab_size=shape.vocab,
            embed_dim=shape.d_model,
            hidden_dim=shape.mlp,
            num_heads=shape.heads,
            head_dim=shape.head_dim,
            num_kv_heads=shape.kv_heads,
            rope_theta=10_000,
            norm_eps=1e-6,
            weight_tying=True,
        )
        self.model = llama3.Llama3(config, rngs=nnx.Rngs(0))
        self.sampler = sampler_lib.Sampler(
            self.model,
            _IdTokenizer(shape.stop_id),
            sampler_lib.CacheConfig(
                cache_size=shape.seq_len,
                num_layers=shape.layers,
                num_kv_heads=shape.kv_heads,
                head_dim=shape.head_dim,
            ),
        )
        self.step = None

    def build_train(self):
        import jax.numpy as jnp
        from tunix.rl import algo_core, common
        from tunix.rl import trainer as rl_trainer
        from tunix.rl.grpo import grpo_learner
        from tunix.sft import peft_trainer

        s = self.shape
        algo_config = grpo_learner.GRPOConfig(num_generations=s.group, beta=0.0, epsilon=0.2)
        algo_config.temperature = 1.0
        trainer = rl_trainer.Trainer(
            self.model,
            optimizer(),
            peft_trainer.TrainingConfig(eval_every_n_steps=10**9),
            custom_checkpoint_metadata_fn=lambda: {},
        )
        # As GRPOLearner.__init__ binds it.
        trainer.with_loss_fn(
            lambda model, train_example, algo_config: algo_core.grpo_loss_fn(
                model, train_example, algo_config=algo_config, pad_id=PAD_ID, eos_id=s.stop_id
            ),
            has_aux=True,
        )
        trainer.with_gen_model_input_fn(lambda x: {"train_example": x, "algo_config": algo_config})
        self.step, _ = trainer.jit_train_and_eval_step()
        tokens = train_tokens(s, seed=1)
        completion = jnp.asarray(tokens[:, s.prompt_len :])
        self.example = grpo_learner.TrainExample(
            prompt_ids=jnp.asarray(tokens[:, : s.prompt_len]),
            prompt_mask=jnp.ones((s.train_batch, s.prompt_len), jnp.int32),
            completion_ids=completion,
            completion_mask=common.make_completion_mask(completion, eos_tok=s.stop_id),
            advantages=jnp.asarray(group_advantages(s, seed=2)),
            ref_per_token_logps=None,
            old_per_token_logps=None,
        )

    def rollout(self, seed: int) -> int:
        s = self.shape
        prompts = [" ".join(map(str, row)) for row in random_prompts(s, seed)]
        repeated = [p for p in prompts for _ in range(s.group)]
        out = self.sampler(
            repeated,
            max_generation_steps=s.new_tokens,
            max_prompt_length=s.prompt_len,
            echo=False,
            eos_tokens=[s.stop_id],
            forbidden_tokens=[s.stop_id],
            temperature=1.0,
            top_p=1.0,
            seed=seed,
        )
        return sum(len(t) for t in out.tokens)

    def train_step(self):
        if self.step is None:
            self.build_train()
        loss, _, grad_norm = self.step(self.example)
        return loss, grad_norm


# MEASUREMENT
