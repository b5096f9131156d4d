"""Tests for replax/model/config.py: defaults (the benchmark's reference model), dtypes
and the checks, each naming its key."""

import jax.numpy as jnp
import pytest

from replax.model.config import DTYPES, REMAT_POLICIES, ModelConfig


def test_defaults_are_the_reference_model():
    c = ModelConfig()
    shape = (c.vocab_size, c.num_layers, c.d_model, c.num_heads, c.num_kv_heads, c.head_dim)
    assert shape == (512, 4, 256, 4, 2, 64) and c.mlp_dim == 1024
    assert c.jnp_dtype == jnp.float32 and c.jnp_param_dtype == jnp.float32


def test_dtypes_and_remat_policies():
    c = ModelConfig(dtype="bfloat16")
    assert c.jnp_dtype == jnp.bfloat16 and c.jnp_param_dtype == jnp.float32
    assert set(DTYPES) == {"float32", "bfloat16", "float16"}
    assert {"none", "full", "save_dots"} <= set(REMAT_POLICIES)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"remat_policy": "x"}, "model.remat_policy='x'"),
        ({"attention": "x"}, "model.attention='x'"),
        ({"scan_layers": 1}, "model.scan_layers=1"),
        ({"dtype": "int8"}, "model.dtype='int8'"),
        ({"d_model": 0}, "model.d_model=0 must be >= 1"),
        ({"rope_type": "x"}, "model.rope_type='x'"),
        ({"head_dim": 7}, "model.head_dim=7 must be even"),
        ({"rope_type": "linear", "rope_factor": 0.0}, "model.rope_factor=0.0 must be > 0"),
        ({"rope_original_max_len": -1}, "model.rope_original_max_len=-1"),
        (
            {"rope_type": "llama3", "rope_original_max_len": 8, "rope_low_freq_factor": 4.0},
            "llama3 RoPE needs high > low > 0",
        ),
        ({"rope_type": "llama3"}, "rope_original_max_len must be >= 1"),
        ({"num_heads": 4, "num_kv_heads": 3}, "model.num_kv_heads=3 must divide"),
    ],
)
def test_bad_fields_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ModelConfig(**kwargs)
