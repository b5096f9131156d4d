"""The decoder's building blocks: parameters with logical axes, dense projections (with
their LoRA adapters), RMSNorm, SwiGLU, sharding constraints."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from replax.model.config import ModelConfig


def _param(module: nn.Module, name: str, init, shape, axes, config: ModelConfig):
    return module.param(
        name, nn.with_logical_partitioning(init, axes), shape, config.jnp_param_dtype
    )


def _weight(module: nn.Module, name: str, init, shape, axes, config: ModelConfig):
    """A matmul weight in the compute dtype. When compute is narrower than storage (fp32
    master weights, bf16 compute) the cast is pinned to the weight's own sharding: it runs
    on each device's shard inside the layer (the scan body), so the FSDP all-gather moves
    bf16 and no bf16 copy of the whole model is held."""
    w = _param(module, name, init, shape, axes, config)
    if w.dtype == config.jnp_dtype:
        return w
    return constrain(w.astype(config.jnp_dtype), axes)


# Kept over jnp.tensordot: the train step is 1.6x faster with it on XLA:CPU
# (scripts/bench.py --only=hand_tuned).
def dense(x, w, in_dims: int = 1):
    """x [..., *in] times w [*in, *out] (the last in_dims axes of x contracted with the
    first in_dims of w) as one 2-D matmul [rows, in] @ [in, out], reshaped back.

    The same contraction written over [B, T, ...] activations makes XLA:CPU transpose the
    activations for the weight gradient, fused with the elementwise ops that produce them
    (strided, several times the matmul's own cost); 2-D matmuls keep every operand of the
    forward and backward pass in its row-major layout.
    """
    lead, contracted = x.shape[: x.ndim - in_dims], x.shape[x.ndim - in_dims :]
    k = math.prod(contracted)
    y = x.reshape(-1, k) @ w.reshape(k, -1)
    return y.reshape(*lead, *w.shape[in_dims:])


def project(module: nn.Module, name: str, x, w, in_axes, out_axes, config: ModelConfig):
    """x times the projection w [*in, *out] (`dense`), plus its LoRA adapter's
    x A B * lora_alpha / lora_rank when `name` is in model.lora_targets.

    A [*in, rank] starts random and B [rank, *out] at zero, so the adapted projection equals
    the base one exactly until B moves. They carry w's logical axes on the matching
    dimensions (so they shard with the layer they adapt) and none on the rank, which is
    replicated. Params without the adapters (`replax.model.lora.without_adapters`) give the base
    model: the KL reference, with no copy of its weights."""
    in_dims = len(in_axes)
    out = dense(x, w.astype(config.jnp_dtype), in_dims=in_dims)
    if not config.lora_rank or name not in config.lora_targets:
        return out
    a_name, b_name = f"{name}_lora_a", f"{name}_lora_b"
    if not module.is_initializing() and not module.has_variable("params", a_name):
        return out  # adapters off
    in_shape, out_shape = w.shape[:in_dims], w.shape[in_dims:]
    rank = config.lora_rank
    fan_in = math.prod(in_shape)
    a = _weight(
        module,
        a_name,
        nn.initializers.normal(stddev=fan_in**-0.5),
        (*in_shape, rank),
        (*in_axes, None),
        config,
    )
    b = _weight(
        module, b_name, nn.initializers.zeros, (rank, *out_shape), (None, *out_axes), config
    )
    delta = dense(dense(x, a, in_dims=in_dims), b)  # [..., rank] -> [..., *out]
    return out + delta * jnp.asarray(config.lora_scale, delta.dtype)


def constrain(x, axes):
    """Activation sharding by logical axis names; a no-op outside a rules context."""
    return nn.with_logical_constraint(x, axes)


class RMSNorm(nn.Module):
    config: ModelConfig
    axis_name: str = "embed"

    @nn.compact
    def __call__(self, x):
        dim = x.shape[-1]
        scale = _param(self, "scale", nn.initializers.ones, (dim,), (self.axis_name,), self.config)
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(
            jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.config.norm_eps
        )
        return (x32 * scale.astype(jnp.float32)).astype(self.config.jnp_dtype)


# Kept over plain autodiff: one [B, T, mlp] activation a layer less in the backward pass
# (tests/model/test_transformer.py checks the bytes), and a step 2-5% faster.
@jax.custom_vjp
def swiglu(gate, up):
    """silu(gate) * up, differentiated by hand: the backward pass keeps only gate and up
    (recomputing the sigmoid), so the forward is one elementwise pass instead of three
    that each store an intermediate [B, T, mlp] array for the backward."""
    return jax.nn.silu(gate) * up


def _swiglu_forward(gate, up):
    return swiglu(gate, up), (gate, up)


def _swiglu_backward(residuals, grad):
    gate, up = residuals
    sigmoid = jax.nn.sigmoid(gate)
    # d silu(g) / dg = sigmoid(g) (1 + g (1 - sigmoid(g))).
    return grad * up * sigmoid * (1 + gate * (1 - sigmoid)), grad * gate * sigmoid


swiglu.defvjp(_swiglu_forward, _swiglu_backward)
