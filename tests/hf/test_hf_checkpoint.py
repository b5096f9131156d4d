"""HF safetensors import/export: exact round trips, and replax's forward on an imported
checkpoint against a plain-numpy HF Llama / Qwen2 / Qwen3 forward written from the HF
formulas (which pins the name mapping, the transposes and the rotate-half RoPE)."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from replax.core import sharding
from replax.hf import checkpoint as hf
from replax.hf import config as hf_config
from replax.hf import layout as hf_layout
from replax.model import transformer as model_lib

TINY = model_lib.ModelConfig(
    vocab_size=64,
    num_layers=2,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,  # heads * head_dim != d_model: a missed transpose cannot pass.
    mlp_dim=48,
    max_len=32,
)
VARIANTS = {
    "tied": {},
    "untied": {"tie_embeddings": False},
    "qkv_bias": {"qkv_bias": True},
    "qk_norm": {"qk_norm": True, "tie_embeddings": False},
}

_BASE_HF = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32,
    "hidden_act": "silu",
}
HF_CONFIGS = {
    "llama": {
        **_BASE_HF,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "head_dim": 8,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "rope_scaling": None,
    },
    "qwen2": {  # no head_dim: hidden_size / num_attention_heads = 8.
        **_BASE_HF,
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "rope_theta": 1000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": 32,
        "max_window_layers": 2,
    },
    "qwen3": {
        **_BASE_HF,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "head_dim": 16,
        "rope_theta": 100.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "attention_bias": False,
    },
    # transformers 5.x form: theta and the scaling in rope_parameters.
    "llama3_rope": {
        **_BASE_HF,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    # transformers 4.x form, with the legacy "type" key.
    "qwen2_linear": {
        **_BASE_HF,
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "rope_theta": 1000.0,
        "tie_word_embeddings": False,
        "rope_scaling": {"type": "linear", "factor": 4.0},
    },
    "qwen3_dynamic": {
        **_BASE_HF,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "head_dim": 16,
        "max_position_embeddings": 8,  # shorter than the test's 12 tokens: NTK scales
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 100.0},
    },
}


def random_params(config, seed=0):
    """Random replax params with every leaf (biases and norm scales too) perturbed."""
    dummy = jnp.zeros((1, 1), jnp.int32)
    params = nn.unbox(model_lib.Transformer(config).init(jax.random.key(seed), dummy, dummy))
    leaves, treedef = jax.tree_util.tree_flatten(params["params"])
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    leaves = [
        np.asarray(x + 0.1 * jax.random.normal(k, x.shape, x.dtype)) for x, k in zip(leaves, keys)
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def assert_trees_equal(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ---------------------------------------------------------------------------------------
# An HF-layout random checkpoint and the HF forward in plain numpy.


def random_hf_checkpoint(c, seed=0):
    """HF-named float32 tensors, shaped as transformers stores them ([out, in] linears)."""
    rng = np.random.default_rng(seed)
    e, m, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    h, kv = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or e // h
    arch = c["architectures"][0]

    def linear(out, inp):
        return rng.normal(0.0, inp**-0.5, (out, inp)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.normal(size=n)).astype(np.float32)

    t = {"model.embed_tokens.weight": rng.normal(0.0, 1.0, (v, e)).astype(np.float32)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(e)
        t[p + "self_attn.q_proj.weight"] = linear(h * d, e)
        t[p + "self_attn.k_proj.weight"] = linear(kv * d, e)
        t[p + "self_attn.v_proj.weight"] = linear(kv * d, e)
        t[p + "self_attn.o_proj.weight"] = linear(e, h * d)
        if arch == "Qwen2ForCausalLM":
            for name, n in (("q", h * d), ("k", kv * d), ("v", kv * d)):
                t[p + f"self_attn.{name}_proj.bias"] = rng.normal(0.0, 0.5, n).astype(np.float32)
        if arch == "Qwen3ForCausalLM":
            t[p + "self_attn.q_norm.weight"] = norm(d)
            t[p + "self_attn.k_norm.weight"] = norm(d)
        t[p + "post_attention_layernorm.weight"] = norm(e)
        t[p + "mlp.gate_proj.weight"] = linear(m, e)
        t[p + "mlp.up_proj.weight"] = linear(m, e)
        t[p + "mlp.down_proj.weight"] = linear(e, m)
    t["model.norm.weight"] = norm(e)
    if not c.get("tie_word_embeddings", False):
        t["lm_head.weight"] = linear(v, e)
    return t


def hf_inv_freq(c, seq_len):
    """RoPE inverse frequencies [D/2] of an HF config for a `seq_len`-token sequence,
    transcribed from transformers' modeling_rope_utils in float64."""
    d = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    rope = c.get("rope_scaling") or c.get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
    max_pos = c["max_position_embeddings"]
    if kind == "dynamic":
        seq_len = max(seq_len, max_pos)
        theta *= (rope["factor"] * seq_len / max_pos - (rope["factor"] - 1)) ** (d / (d - 2))
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2) / d)
    if kind == "linear":
        inv_freq = inv_freq / rope["factor"]
    if kind == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old = rope["original_max_position_embeddings"]
        out = []
        for f in inv_freq:
            wavelen = 2 * np.pi / f
            if wavelen < old / high:
                out.append(f)
            elif wavelen > old / low:
                out.append(f / factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                out.append((1 - smooth) * f / factor + smooth * f)
        inv_freq = np.array(out)
    return inv_freq


def hf_forward(c, t, tokens):
    """Logits [B, T, V] of LlamaForCausalLM / Qwen2 / Qwen3, transcribed from transformers
    (float64; position_ids = arange(T), causal mask, no padding)."""
    t = {k: x.astype(np.float64) for k, x in t.items()}
    e, h, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or e // h
    eps = c.get("rms_norm_eps", 1e-6)
    b, s = tokens.shape

    def rms_norm(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rotate_half(x):
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([-x2, x1], axis=-1)

    inv_freq = hf_inv_freq(c, s)
    freqs = np.arange(s)[:, None] * inv_freq[None, :]  # [S, D/2]
    emb = np.concatenate([freqs, freqs], axis=-1)  # [S, D]
    cos, sin = np.cos(emb), np.sin(emb)
    causal = np.tril(np.ones((s, s), dtype=bool))

    x = t["model.embed_tokens.weight"][tokens]  # [B, S, E]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        hs = rms_norm(x, t[f"model.layers.{i}.input_layernorm.weight"])

        def proj(name, n_heads, hs=hs, p=p):
            y = hs @ t[p + f"{name}_proj.weight"].T
            if p + f"{name}_proj.bias" in t:
                y = y + t[p + f"{name}_proj.bias"]
            return y.reshape(b, s, n_heads, d)

        q, k, v = proj("q", h), proj("k", kv), proj("v", kv)
        if p + "q_norm.weight" in t:  # Qwen3: per-head RMSNorm before RoPE.
            q, k = rms_norm(q, t[p + "q_norm.weight"]), rms_norm(k, t[p + "k_norm.weight"])
        q, k, v = (y.transpose(0, 2, 1, 3) for y in (q, k, v))  # [B, heads, S, D]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, h // kv, axis=1), np.repeat(v, h // kv, axis=1)  # repeat_kv
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
        scores = np.where(causal, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, h * d)
        x = x + out @ t[p + "o_proj.weight"].T
        p = f"model.layers.{i}."
        hs = rms_norm(x, t[p + "post_attention_layernorm.weight"])
        gate = hs @ t[p + "mlp.gate_proj.weight"].T
        up = hs @ t[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ t[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, t["model.norm.weight"])
    head = t.get("lm_head.weight", t["model.embed_tokens.weight"])  # tied without it
    return x @ head.T


# ---------------------------------------------------------------------------------------
# Round trips.


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_params_round_trip_exact(variant):
    config = dataclasses.replace(TINY, **VARIANTS[variant])
    params = random_params(config)
    tensors = hf_layout.params_to_hf(params, config)
    assert ("lm_head.weight" in tensors) == (not config.tie_embeddings)
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 16, 32)
    assert tensors["model.layers.0.self_attn.o_proj.weight"].shape == (32, 4 * 16)
    assert tensors["model.layers.1.mlp.down_proj.weight"].shape == (32, 48)
    assert_trees_equal(hf_layout.params_from_hf(tensors, config), params)
    # Boxed params (as model.init returns them) export the same.
    dummy = jnp.zeros((1, 1), jnp.int32)
    boxed = model_lib.Transformer(config).init(jax.random.key(0), dummy, dummy)
    for name, x in hf_layout.params_to_hf(boxed, config).items():
        assert x.shape == tensors[name].shape


@pytest.mark.parametrize("arch", list(HF_CONFIGS))
def test_hf_tensors_round_trip_and_init_tree(arch):
    c = HF_CONFIGS[arch]
    config = hf_config.config_from_hf(c)
    tensors = random_hf_checkpoint(c)
    params = hf_layout.params_from_hf(tensors, config)
    dummy = jnp.zeros((1, 1), jnp.int32)
    init = jax.eval_shape(
        lambda: model_lib.Transformer(config).init(jax.random.key(0), dummy, dummy)
    )
    init = nn.unbox(init["params"])
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(init)
    for x, y in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(init)):
        assert x.shape == y.shape and x.dtype == y.dtype
    back = hf_layout.params_to_hf(params, config)
    assert sorted(back) == sorted(tensors)
    for name, x in tensors.items():
        np.testing.assert_array_equal(back[name], x)
    # The config survives config_to_hf -> config_from_hf.
    assert hf_config.config_from_hf(hf_config.config_to_hf(config)) == config


@pytest.mark.parametrize("variant", ["untied", "qkv_bias", "qk_norm"])
def test_save_load_pretrained(tmp_path, variant):
    config = dataclasses.replace(TINY, **VARIANTS[variant])
    params = random_params(config)
    written = hf.save_pretrained(str(tmp_path), config, params)
    assert written == ["config.json", "model.safetensors"]
    loaded_config, loaded = hf.load_pretrained(str(tmp_path))
    assert loaded_config == config
    assert_trees_equal(loaded, params)


def test_save_load_sharded(tmp_path):
    config = dataclasses.replace(TINY, tie_embeddings=False, qkv_bias=True)
    params = random_params(config)
    hf.save_pretrained(str(tmp_path), config, params)  # a stale single file to replace
    written = hf.save_pretrained(str(tmp_path), config, params, max_shard_bytes=20_000)
    shards = [n for n in written if n.endswith(".safetensors")]
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert sorted(os.listdir(tmp_path)) == sorted(written)
    with open(tmp_path / "model.safetensors.index.json") as f:
        index = json.load(f)
    tensors = hf_layout.params_to_hf(params, config)
    assert sorted(index["weight_map"]) == sorted(tensors)
    assert set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == sum(x.nbytes for x in tensors.values())
    _, loaded = hf.load_pretrained(str(tmp_path))
    assert_trees_equal(loaded, params)
    # Saving unsharded again removes the shards and the index.
    hf.save_pretrained(str(tmp_path), config, params)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]


def test_bfloat16_checkpoint(tmp_path):
    config = dataclasses.replace(TINY, param_dtype="bfloat16")
    params = jax.tree_util.tree_map(lambda x: x.astype(ml_dtypes.bfloat16), random_params(config))
    hf.save_pretrained(str(tmp_path), config, params)
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["torch_dtype"] == "bfloat16"
    loaded_config, loaded = hf.load_pretrained(str(tmp_path), param_dtype="bfloat16")
    assert_trees_equal(loaded, params)
    # The numpy-only reader (for safetensors without bfloat16) reads the same tensors.
    raw = hf._read_safetensors_raw(str(tmp_path / "model.safetensors"))
    for name, x in hf_layout.params_to_hf(params, config).items():
        assert raw[name].dtype == x.dtype
        np.testing.assert_array_equal(raw[name], x)
    # A bfloat16 checkpoint loads exactly into float32 params.
    _, loaded32 = hf.load_pretrained(str(tmp_path))
    assert_trees_equal(loaded32, jax.tree_util.tree_map(lambda x: x.astype(np.float32), params))


def test_shard_params_places_on_mesh():
    config = TINY
    mesh = sharding.make_mesh((2, 2, 2))
    params = hf.shard_params(random_params(config), config, mesh)
    q = params["layer_0"]["attn"]["q"]
    assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
    assert params["embedding"].sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")


# ---------------------------------------------------------------------------------------
# Forward equivalence with the HF formulas.


@pytest.mark.parametrize("arch", list(HF_CONFIGS))
def test_forward_matches_numpy_hf_reference(arch):
    c = HF_CONFIGS[arch]
    tensors = random_hf_checkpoint(c, seed=3)
    # max_len = the 12 tokens: dynamic NTK then scales as transformers does for 12 tokens.
    config = hf_config.config_from_hf(c, max_len=12)
    params = hf_layout.params_from_hf(tensors, config)
    tokens = np.random.default_rng(4).integers(0, c["vocab_size"], (2, 12)).astype(np.int32)
    positions = np.broadcast_to(np.arange(12, dtype=np.int32), tokens.shape)
    logits = model_lib.Transformer(config).apply(
        {"params": params}, jnp.asarray(tokens), jnp.asarray(positions), jnp.ones((2, 12), bool)
    )
    expected = hf_forward(c, tensors, tokens)
    assert np.abs(expected).max() > 1.0  # the comparison is not between near-zeros
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------
# Bad input.


def test_params_from_hf_rejects_bad_tensors():
    c = HF_CONFIGS["qwen2"]
    config = hf_config.config_from_hf(c)
    tensors = random_hf_checkpoint(c)

    missing = dict(tensors)
    del missing["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*\[48, 32\]"):
        hf_layout.params_from_hf(missing, config)

    wrong = dict(tensors)
    wrong["model.layers.0.self_attn.k_proj.weight"] = np.zeros((32, 16), np.float32)
    with pytest.raises(
        ValueError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight.*\[32, 16\].*\[16, 32\]"
    ):
        hf_layout.params_from_hf(wrong, config)

    extra = {**tensors, "model.layers.0.self_attn.o_proj.bias": np.zeros(32, np.float32)}
    with pytest.raises(ValueError, match=r"unexpected.*o_proj\.bias"):
        hf_layout.params_from_hf(extra, config)

    # A tied checkpoint that also stores the head is accepted iff it is the embedding.
    tied = {**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"].copy()}
    hf_layout.params_from_hf(tied, config)
    tied["lm_head.weight"] = tied["lm_head.weight"] + 1.0
    with pytest.raises(ValueError, match="lm_head.weight"):
        hf_layout.params_from_hf(tied, config)


# ---------------------------------------------------------------------------------------
# Sharded loading: each device's block straight from the file.


@pytest.mark.parametrize(
    "variant, mesh_shape, param_dtype, shard_bytes",
    [
        ("qkv_bias", (2, 2, 2), "float32", None),
        ("qk_norm", (1, 2, 4), "float32", 20_000),
        ("untied", (1, 8, 1), "bfloat16", None),
        ("tied", (1, 1, 8), "float32", None),
    ],
)
def test_load_pretrained_sharded_matches_unsharded(
    tmp_path, variant, mesh_shape, param_dtype, shard_bytes
):
    # vocab 64, heads 4, kv 2, head_dim 16, mlp 48: tensor = 4 or 8 splits kv_heads 2 and
    # heads unevenly, so blocks within a head (a strided read) are exercised too.
    config = dataclasses.replace(TINY, **VARIANTS[variant], num_kv_heads=4, param_dtype=param_dtype)
    params = random_params(config)
    if param_dtype == "bfloat16":
        params = jax.tree_util.tree_map(lambda x: x.astype(ml_dtypes.bfloat16), params)
    hf.save_pretrained(str(tmp_path), config, params, max_shard_bytes=shard_bytes)
    mesh = sharding.make_mesh(mesh_shape)
    rules = sharding.DEFAULT_RULES
    if mesh_shape == (1, 1, 8):  # head_dim sharded: every block is strided in HF's rows
        moved = {"head_dim": "tensor", "heads": None, "kv_heads": None}
        rules = tuple((k, moved.get(k, v)) for k, v in rules)
    loaded_config, sharded = hf.load_pretrained_sharded(
        str(tmp_path), mesh, rules, param_dtype=param_dtype
    )
    assert loaded_config == config
    _, host = hf.load_pretrained(str(tmp_path), param_dtype=param_dtype)
    expected = hf.shard_params(host, config, mesh, rules)
    assert jax.tree_util.tree_structure(sharded) == jax.tree_util.tree_structure(expected)
    for x, y in zip(jax.tree_util.tree_leaves(sharded), jax.tree_util.tree_leaves(expected)):
        assert x.sharding == y.sharding and x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    q = sharded["layer_0"]["attn"]["q"]
    assert len(q.addressable_shards) == 8


def test_load_pretrained_sharded_reads_only_its_blocks(tmp_path, monkeypatch):
    config = dataclasses.replace(TINY, tie_embeddings=False)
    hf.save_pretrained(str(tmp_path), config, random_params(config))
    reads = []
    original = hf_layout.read_block

    def counting(view, entry, index):
        block = original(view, entry, index)
        reads.append((entry.hf_name, block.size))
        return block

    monkeypatch.setattr(hf_layout, "read_block", counting)
    mesh = sharding.make_mesh((2, 2, 2))
    hf.load_pretrained_sharded(str(tmp_path), mesh)
    # Each distinct block is read once: lm_head [E, V] over (fsdp, tensor) = 4 blocks of
    # a quarter of it, although 8 devices hold them.
    head = [size for name, size in reads if name == "lm_head.weight"]
    assert head == [32 * 64 // 4] * 4


def test_load_pretrained_sharded_memmap_fallback_and_errors(tmp_path, monkeypatch):
    config = dataclasses.replace(TINY, qkv_bias=True)
    params = random_params(config)
    hf.save_pretrained(str(tmp_path), config, params)
    import safetensors

    def no_safe_open(*args, **kwargs):  # an older safetensors without numpy bfloat16
        raise TypeError("data type 'bfloat16' not understood")

    monkeypatch.setattr(safetensors, "safe_open", no_safe_open)
    mesh = sharding.make_mesh((2, 2, 2))
    _, sharded = hf.load_pretrained_sharded(str(tmp_path), mesh)
    assert_trees_equal(jax.device_get(sharded), params)

    tensors = hf_layout.params_to_hf(params, config)
    del tensors["model.layers.1.self_attn.v_proj.bias"]
    from safetensors.numpy import save_file

    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing.*layers\.1\.self_attn\.v_proj\.bias.*\[32\]"):
        hf.load_pretrained_sharded(str(tmp_path), mesh)
    with pytest.raises(ValueError, match=r"nothing/config.json: cannot be read"):
        hf.load_pretrained_sharded(str(tmp_path / "nothing"), mesh)
    os.remove(tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="neither model.safetensors"):
        hf.load_pretrained_sharded(str(tmp_path), mesh)


# ---------------------------------------------------------------------------------------
# Export with the tokenizer.


def _tiny_tokenizer_dir(directory):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "[UNK]": 3, "a": 4}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None})
    )
    (directory / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    (directory / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [2, 0], "temperature": 0.7, "top_p": 0.8})
    )
    return directory


def test_save_pretrained_with_tokenizer(tmp_path):
    source = _tiny_tokenizer_dir(tmp_path / "source")
    config = TINY
    written = hf.save_pretrained(
        str(tmp_path / "out"),
        config,
        random_params(config),
        tokenizer_dir=str(source),
        generation={"do_sample": True},
    )
    assert written == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
    ]
    with open(tmp_path / "out" / "generation_config.json") as f:
        generation = json.load(f)
    # The source's sampling defaults kept, every stop id, the pad id, no BOS (Qwen-like).
    assert generation == {
        "eos_token_id": [2, 0],
        "temperature": 0.7,
        "top_p": 0.8,
        "pad_token_id": 0,
        "do_sample": True,
    }
    with open(tmp_path / "out" / "config.json") as f:
        assert json.load(f)["dtype"] == "float32"


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_every_written_file_has_the_mode_of_the_rest(tmp_path, umask, mode):
    """Weights included (safetensors creates its files 0600): the group and others read
    them as they read config.json, as far as the user's umask lets them."""
    source = _tiny_tokenizer_dir(tmp_path / "source")
    previous = os.umask(umask)
    try:
        for out, shard_bytes in (("one", None), ("sharded", 4096)):
            written = hf.save_pretrained(
                str(tmp_path / out),
                TINY,
                random_params(TINY),
                tokenizer_dir=str(source),
                max_shard_bytes=shard_bytes,
            )
            modes = {name: os.stat(tmp_path / out / name).st_mode & 0o777 for name in written}
            assert any(name.endswith(".safetensors") for name in modes)
            assert set(modes.values()) == {mode}, {k: oct(v) for k, v in modes.items()}
    finally:
        os.umask(previous)


# ---------------------------------------------------------------------------------------
# Scanned layers (model.scan_layers): the same files, params stacked over layers.


def test_scanned_model_round_trips_through_the_same_files(tmp_path):
    config = dataclasses.replace(TINY, qk_norm=True)
    scanned = dataclasses.replace(config, scan_layers=True)
    params = random_params(config)
    stacked = model_lib.stack_layers(params, config.num_layers)
    # The HF tensors of the stacked params are those of the unrolled ones.
    unrolled_tensors = hf_layout.params_to_hf(params, config)
    scanned_tensors = hf_layout.params_to_hf(stacked, scanned)
    assert list(scanned_tensors) == list(unrolled_tensors)
    for name, x in unrolled_tensors.items():
        np.testing.assert_array_equal(scanned_tensors[name], x)
    hf.save_pretrained(str(tmp_path), scanned, stacked, max_shard_bytes=20_000)
    loaded_config, loaded = hf.load_pretrained(str(tmp_path), scan_layers=True)
    assert loaded_config == scanned
    assert_trees_equal(loaded, stacked)
    assert loaded["layers"]["attn"]["q"].shape == (2, 32, 4, 16)
    with pytest.raises(ValueError, match="no 'layers' entry"):
        hf_layout.params_to_hf(params, scanned)


def test_load_pretrained_sharded_scanned_reads_each_layer_block(tmp_path, monkeypatch):
    config = dataclasses.replace(TINY, tie_embeddings=False, num_kv_heads=4)
    params = random_params(config)
    hf.save_pretrained(str(tmp_path), config, params)
    reads = []
    original = hf_layout.read_block

    def counting(view, entry, index):
        block = original(view, entry, index)
        reads.append((entry.hf_name, block.size))
        return block

    monkeypatch.setattr(hf_layout, "read_block", counting)
    mesh = sharding.make_mesh((1, 2, 4))
    scanned_config, sharded = hf.load_pretrained_sharded(str(tmp_path), mesh, scan_layers=True)
    assert scanned_config.scan_layers
    expected = hf.shard_params(
        model_lib.stack_layers(params, 2), scanned_config, mesh, sharding.DEFAULT_RULES
    )
    assert jax.tree_util.tree_structure(sharded) == jax.tree_util.tree_structure(expected)
    for x, y in zip(jax.tree_util.tree_leaves(sharded), jax.tree_util.tree_leaves(expected)):
        assert x.sharding == y.sharding and x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    q = sharded["layers"]["attn"]["q"]  # [L, E, H, D] over (None, fsdp, tensor, None)
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
    # Every layer's q_proj is read in 2 x 4 distinct blocks of an eighth of it, once each.
    for layer in range(2):
        name = f"model.layers.{layer}.self_attn.q_proj.weight"
        assert [size for n, size in reads if n == name] == [32 * 4 * 16 // 8] * 8
