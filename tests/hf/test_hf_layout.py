"""Tests for replax/hf/layout.py: HF tensor names and shapes of the tiny policy, the
[out, in] <-> [in, out] transposes checked on a hand-built weight, round trips in both
layouts, the checks' messages, and block reads against slicing the whole parameter."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replax.hf import layout as hf_layout
from replax.model import transformer as model_lib


def random_params(config):
    """Distinct random values in the params' shapes (from eval_shape: nothing compiles)."""
    dummy = jnp.zeros((1, 1), jnp.int32)
    shapes = jax.eval_shape(model_lib.Transformer(config).init, jax.random.key(0), dummy, dummy)
    rng = np.random.default_rng(0)
    return jax.tree.map(
        lambda x: rng.normal(size=x.shape).astype(np.float32), nn.unbox(shapes["params"])
    )


def test_names_and_shapes_of_the_tiny_policy(tiny_config):
    tensors = hf_layout.params_to_hf(random_params(tiny_config), tiny_config)
    # 1 embedding + 2 layers x (2 norms + q, k, v, o + gate, up, down) + final norm; tied.
    assert len(tensors) == 1 + 2 * 9 + 1 and "lm_head.weight" not in tensors
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 8, 32)  # [H*D, E]
    assert tensors["model.layers.1.self_attn.k_proj.weight"].shape == (2 * 8, 32)
    assert tensors["model.layers.0.self_attn.o_proj.weight"].shape == (32, 4 * 8)  # [E, H*D]
    assert tensors["model.layers.0.mlp.down_proj.weight"].shape == (32, 64)  # [E, M]


def test_a_linear_weight_is_transposed_and_its_heads_split():
    # q: [E=2, H=1, D=2] in replax; HF stores [H*D, E] = its transpose.
    entry = hf_layout._Entry("q", ("q",), (2, 1, 2), "linear")
    hf = np.array([[1.0, 2.0], [3.0, 4.0]])  # rows: outputs (head dims), columns: inputs
    np.testing.assert_array_equal(entry.from_hf(hf)[:, 0, :], hf.T)
    np.testing.assert_array_equal(entry.to_hf(entry.from_hf(hf)), hf)
    bias = hf_layout._Entry("b", ("b",), (2, 3), "reshape")
    assert bias.hf_shape == (6,) and bias.from_hf(np.arange(6.0))[1].tolist() == [3.0, 4.0, 5.0]


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize(
    "variant", [{}, {"qkv_bias": True, "qk_norm": True, "tie_embeddings": False}]
)
def test_round_trip(tiny_config, scan_layers, variant):
    config = dataclasses.replace(tiny_config, scan_layers=scan_layers, **variant)
    params = random_params(config)
    tensors = hf_layout.params_to_hf(params, config)
    back = hf_layout.params_from_hf(tensors, config)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)


def test_checks_name_the_tensor(tiny_config):
    tensors = hf_layout.params_to_hf(random_params(tiny_config), tiny_config)
    missing = {k: v for k, v in tensors.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match=r"missing tensor\(s\): model.norm.weight \(expected"):
        hf_layout.params_from_hf(missing, tiny_config)
    with pytest.raises(ValueError, match=r"unexpected tensor\(s\) extra"):
        hf_layout.params_from_hf({**tensors, "extra": np.zeros(1)}, tiny_config)
    wrong = {**tensors, "model.norm.weight": np.zeros(31)}
    with pytest.raises(ValueError, match=r"model.norm.weight has shape \[31\], expected \[32\]"):
        hf_layout.params_from_hf(wrong, tiny_config)
    # A tied checkpoint that stores its head as a copy of the embedding is accepted.
    head = {**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"]}
    assert set(hf_layout.params_from_hf(head, tiny_config)) == set(
        hf_layout.params_from_hf(tensors, tiny_config)
    )
    # Buffers older checkpoints stored are skipped.
    buffer = {**tensors, "model.layers.0.self_attn.rotary_emb.inv_freq": np.zeros(4)}
    hf_layout.params_from_hf(buffer, tiny_config)


def test_read_block_is_a_slice_of_the_whole_parameter(tiny_config):
    config = dataclasses.replace(tiny_config, qkv_bias=True)
    params = random_params(config)
    tensors = hf_layout.params_to_hf(params, config)
    layout = {e.hf_name: e for e in hf_layout._layout(config)}
    cases = [
        ("model.layers.0.self_attn.q_proj.weight", (slice(8, 16), slice(1, 3), slice(None))),
        ("model.layers.0.self_attn.o_proj.weight", (slice(2, 4), slice(None), slice(0, 16))),
        ("model.layers.0.self_attn.k_proj.bias", (slice(1, 2), slice(2, 6))),
        ("model.embed_tokens.weight", (slice(0, 32), slice(None))),
    ]
    for name, index in cases:
        entry = layout[name]
        whole = entry.from_hf(tensors[name])
        got = hf_layout.read_block(tensors[name], entry, index)
        np.testing.assert_array_equal(got, whole[index], err_msg=name)
