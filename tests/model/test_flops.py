"""Tests for replax/model/flops.py: parameter counts and matmul FLOPs of the transformer."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from replax.model import flops
from replax.model import transformer as model_lib

TINY = model_lib.ModelConfig(
    vocab_size=64, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=48
)


@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_param_count_is_the_initialised_model_size(tie_embeddings):
    config = dataclasses.replace(TINY, tie_embeddings=tie_embeddings)
    dummy = jnp.zeros((1, 1), jnp.int32)
    shapes = jax.eval_shape(
        lambda: model_lib.Transformer(config).init(jax.random.key(0), dummy, dummy)
    )
    size = sum(x.size for x in jax.tree_util.tree_leaves(nn.unbox(shapes["params"])))
    assert flops.param_count(config) == size
    embedding = 64 * 32 * (1 if tie_embeddings else 2)
    assert flops.param_count(config, include_embedding=False) == size - embedding


def test_forward_flops_per_token_by_hand():
    # Per layer: q, k, v, o projections 2 * 32 * (2 * 4 * 16 + 2 * 2 * 16) = 12288, the
    # SwiGLU MLP 2 * 3 * 32 * 48 = 9216, attention over 10 keys 2 * 2 * 4 * 16 * 10 = 2560;
    # the head 2 * 32 * 64 = 4096.
    assert flops.forward_flops_per_token(TINY, 10) == 2 * (12288 + 9216 + 2560) + 4096


def test_train_and_generate_flops_from_the_forward():
    per_token = flops.forward_flops_per_token
    assert flops.train_flops(TINY, 8, 24) == 3 * 8 * 24 * per_token(TINY, 24)
    assert flops.generate_flops(TINY, 8, 10, 6, 32) == 8 * (10 + 6) * per_token(TINY, 32)


def test_train_flops_count_every_pass():
    """A step's passes in whole batches, a backward at two forwards: a KL reference's and a
    covariance option's extra forward make 5 forwards' FLOPs; a forward and backward of a
    quarter of the rows more cost 1.25 plain steps."""
    per_pass = 8 * 24 * flops.forward_flops_per_token(TINY, 24)
    two_more = flops.TrainPasses(forward=3.0, backward=1.0)
    assert flops.train_flops(TINY, 8, 24, two_more) == 5 * per_pass
    assert two_more.relative_cost == 5 / 3
    quarter_more = flops.TrainPasses(forward=1.25, backward=1.25)
    assert flops.train_flops(TINY, 8, 24, quarter_more) == 3.75 * per_pass
    assert quarter_more.relative_cost == 1.25 and flops.TrainPasses().relative_cost == 1.0
