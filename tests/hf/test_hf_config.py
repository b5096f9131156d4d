"""config.json <-> ModelConfig: the fields read and written, what is rejected, and RoPE
scaling in both the transformers 4.x (rope_scaling) and 5.x (rope_parameters) forms."""

import dataclasses

import numpy as np
import pytest
from test_hf_checkpoint import HF_CONFIGS, TINY

from replax.hf import config as hf_config
from replax.model import transformer as model_lib


def test_config_from_hf_fields():
    config = hf_config.config_from_hf(HF_CONFIGS["qwen2"], max_len=16, dtype="bfloat16")
    assert config == model_lib.ModelConfig(
        vocab_size=64,
        num_layers=2,
        d_model=32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        mlp_dim=48,
        max_len=16,
        tie_embeddings=True,
        qkv_bias=True,
        qk_norm=False,
        rope_theta=1000.0,
        norm_eps=1e-6,
        dtype="bfloat16",
    )
    assert hf_config.config_from_hf(HF_CONFIGS["qwen3"]).qk_norm
    assert hf_config.config_from_hf(HF_CONFIGS["llama"]).norm_eps == 1e-5


@pytest.mark.parametrize(
    "change, message",  # one line naming the field and what is allowed
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "architectures"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn'"),
        ({"rope_parameters": {"rope_type": "longrope"}}, "rope_parameters type 'longrope'"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
        ({"rope_scaling": {"type": "linear"}}, "factor"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"vocab_size": None}, "vocab_size"),
    ],
)
def test_config_from_hf_rejects(change, message):
    c = {**HF_CONFIGS["llama"], **change}
    if c["vocab_size"] is None:
        del c["vocab_size"]
    with pytest.raises(ValueError, match=message) as info:
        hf_config.config_from_hf(c)
    assert "\n" not in str(info.value)


def test_config_from_hf_rejects_unknown_override():
    with pytest.raises(ValueError, match="num_layer"):
        hf_config.config_from_hf(HF_CONFIGS["llama"], num_layer=3)


def test_config_to_hf_rejects_bias_and_norm():
    with pytest.raises(ValueError, match="qkv_bias"):
        hf_config.config_to_hf(dataclasses.replace(TINY, qkv_bias=True, qk_norm=True))


# ---------------------------------------------------------------------------------------
# RoPE scaling.


def test_rope_fields_from_both_config_forms():
    llama3 = hf_config.config_from_hf(HF_CONFIGS["llama3_rope"])
    assert (llama3.rope_type, llama3.rope_theta, llama3.rope_factor) == ("llama3", 1e4, 8.0)
    assert (llama3.rope_low_freq_factor, llama3.rope_high_freq_factor) == (1.0, 4.0)
    assert llama3.rope_original_max_len == 64 and llama3.max_len == 32
    # transformers 4.x: rope_theta at the top, the scaling in rope_scaling.
    v4 = {**HF_CONFIGS["llama3_rope"], "rope_theta": 10000.0, "rope_parameters": None}
    v4["rope_scaling"] = {
        k: v for k, v in HF_CONFIGS["llama3_rope"]["rope_parameters"].items() if k != "rope_theta"
    }
    assert hf_config.config_from_hf(v4) == llama3
    # Without original_max_position_embeddings, transformers uses max_position_embeddings.
    del v4["rope_scaling"]["original_max_position_embeddings"]
    assert hf_config.config_from_hf(v4).rope_original_max_len == 32
    linear = hf_config.config_from_hf(HF_CONFIGS["qwen2_linear"])
    assert (linear.rope_type, linear.rope_factor, linear.rope_theta) == ("linear", 4.0, 1000.0)
    dynamic = hf_config.config_from_hf(HF_CONFIGS["qwen3_dynamic"])
    assert (dynamic.rope_type, dynamic.rope_original_max_len) == ("dynamic", 8)
    plain = hf_config.config_from_hf(
        {**HF_CONFIGS["qwen3"], "rope_parameters": {"rope_theta": 5.0}}
    )
    assert (plain.rope_type, plain.rope_theta) == ("default", 5.0)


@pytest.mark.parametrize("arch", ["llama3_rope", "qwen2_linear", "qwen3_dynamic"])
def test_rope_scaling_round_trips_through_export(arch):
    config = hf_config.config_from_hf(HF_CONFIGS[arch])
    exported = hf_config.config_to_hf(config)
    assert exported["rope_parameters"]["rope_type"] == config.rope_type
    assert exported["rope_scaling"]["rope_type"] == config.rope_type
    assert hf_config.config_from_hf(exported) == config
    # Read as transformers 4.x would (no rope_parameters), the same config.
    assert hf_config.config_from_hf({**exported, "rope_parameters": None}) == config


def test_rope_inv_freq_by_hand():
    # head_dim 8, theta 1e4: inv_freq 1, 0.1, 0.01, 0.001, wavelengths 2 pi x 1, 10, 100,
    # 1000. llama3 with original 64, low 1, high 4: wavelength < 16 kept, > 64 divided by
    # factor 8, 62.8 in between: smooth = (64 / 62.83 - 1) / 3, mixing f / 8 and f.
    base = dict(head_dim=8, num_heads=2, num_kv_heads=2, rope_theta=1e4)
    plain = model_lib.rope_inv_freq(model_lib.ModelConfig(**base))
    np.testing.assert_allclose(plain, [1.0, 0.1, 0.01, 0.001], rtol=1e-6)
    llama3 = model_lib.ModelConfig(
        **base, rope_type="llama3", rope_factor=8.0, rope_original_max_len=64
    )
    smooth = (64 / (2 * np.pi * 10) - 1) / 3
    expected = [1.0, (1 - smooth) * 0.1 / 8 + smooth * 0.1, 0.01 / 8, 0.001 / 8]
    np.testing.assert_allclose(model_lib.rope_inv_freq(llama3), expected, rtol=1e-6)
    linear = model_lib.ModelConfig(**base, rope_type="linear", rope_factor=4.0)
    np.testing.assert_allclose(model_lib.rope_inv_freq(linear), plain / 4, rtol=1e-6)
    # dynamic: unscaled up to the original length; at 2x it with factor 3, theta grows by
    # (3 * 2 - 2) ** (8 / 6).
    dynamic = dict(base, rope_type="dynamic", rope_factor=3.0, rope_original_max_len=64)
    short = model_lib.ModelConfig(**dynamic, max_len=64)
    np.testing.assert_allclose(model_lib.rope_inv_freq(short), plain, rtol=1e-6)
    long = model_lib.ModelConfig(**dynamic, max_len=128)
    theta = 1e4 * 4 ** (8 / 6)
    np.testing.assert_allclose(
        model_lib.rope_inv_freq(long), theta ** -(np.arange(4) / 4), rtol=1e-5
    )


def test_model_config_rejects_bad_rope():
    with pytest.raises(ValueError, match="rope_type='yarn'.*allowed"):
        model_lib.ModelConfig(rope_type="yarn")
    with pytest.raises(ValueError, match="rope_original_max_len"):
        model_lib.ModelConfig(rope_type="llama3", rope_factor=8.0)
    with pytest.raises(ValueError, match="high"):
        model_lib.ModelConfig(rope_type="llama3", rope_original_max_len=8, rope_low_freq_factor=4.0)
