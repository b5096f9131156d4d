"""Compute accounting of `model.Transformer`: parameter counts and matmul FLOPs, the basis
of MFU and of the generation / training cost (metrics' gen_flops and train_flops)."""

from __future__ import annotations

import dataclasses

from replax.model.transformer import ModelConfig


@dataclasses.dataclass(frozen=True)
class TrainPasses:
    """The passes one train step runs, in whole batches: `forward` forward passes (the
    policy's, a KL reference's, a covariance option's extra one) and `backward` backward
    passes; a pass over part of the batch counts as that part. A backward pass costs two
    forwards (the gradients of the activations and of the weights)."""

    forward: float = 1.0
    backward: float = 1.0

    @property
    def forward_equivalents(self) -> float:
        return self.forward + 2.0 * self.backward

    @property
    def relative_cost(self) -> float:
        """The step's FLOPs over a plain step's (one forward, one backward): what training
        a rollout in this step costs, in units of training one in a plain step."""
        return self.forward_equivalents / TrainPasses().forward_equivalents


def param_count(config: ModelConfig, include_embedding: bool = True) -> int:
    e, h, kv, d, m = (
        config.d_model,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.mlp_dim,
    )
    per_layer = e * h * d * 2 + e * kv * d * 2 + 3 * e * m + 2 * e
    total = config.num_layers * per_layer + e
    if include_embedding:
        total += config.vocab_size * e * (1 if config.tie_embeddings else 2)
    return total


def forward_flops_per_token(config: ModelConfig, context_len: float) -> float:
    """Matmul FLOPs of one token's forward pass attending to `context_len` keys."""
    e, h, kv, d, m = (
        config.d_model,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.mlp_dim,
    )
    proj = 2 * e * (2 * h * d + 2 * kv * d) + 2 * 3 * e * m
    attn = 2 * 2 * h * d * context_len
    return config.num_layers * (proj + attn) + 2 * e * config.vocab_size


def train_flops(
    config: ModelConfig, batch_size: int, seq_len: int, passes: TrainPasses | None = None
) -> float:
    """Matmul FLOPs of one train step on [batch_size, seq_len] that runs `passes` (default
    one forward and one backward: 3x forward; `replax.rl.gradients.train_passes` says what
    a step runs).

    Attention is counted over the full T x T score matrix, as the 'einsum' and 'dot_product'
    kernels compute it ('splash' skips the blocks above the causal diagonal, about half of
    it). Recomputation under model.remat_policy is not counted: these are model FLOPs, the
    numerator of MFU.
    """
    per_pass = batch_size * seq_len * forward_flops_per_token(config, seq_len)
    return (passes or TrainPasses()).forward_equivalents * per_pass


def generate_flops(
    config: ModelConfig, batch_size: int, prompt_len: int, new_tokens: int, cache_len: int
) -> float:
    """FLOPs of prefill + decode with a KV cache of cache_len slots (as implemented)."""
    prefill = batch_size * prompt_len * forward_flops_per_token(config, cache_len)
    decode = batch_size * new_tokens * forward_flops_per_token(config, cache_len)
    return prefill + decode
