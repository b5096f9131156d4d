"""Test set-up: 8 simulated CPU devices so that sharding tests run anywhere."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

from replax.model.config import ModelConfig  # noqa: E402

# The tiny policy most model-level tests run: 2 layers, grouped kv heads (4 query heads
# over 2), heads x head_dim = d_model. Tests that need another shape say why beside it.
TINY = ModelConfig(
    vocab_size=64,
    num_layers=2,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    max_len=16,
)


@pytest.fixture
def tiny_config() -> ModelConfig:
    return TINY


def numpy_params(model, seed: int, scale: float):
    """Random params of `model` drawn in numpy (no compile): weights ~ N(0, scale^2), norm
    scales ~ 1 + N(0, scale^2)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    dummy = jnp.zeros((1, 1), jnp.int32)
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), dummy, dummy))["params"]
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: (
            (1.0 if path[-1].key == "scale" else 0.0) + scale * rng.normal(size=x.shape)
        ).astype(x.dtype),
        shapes,
    )
