"""llama.cpp GGUF files of Llama-architecture models -> a Hugging Face directory.

`convert(gguf_path, out_dir, dtype)` writes config.json, model.safetensors, tokenizer.json,
tokenizer_config.json (with the GGUF's `tokenizer.chat_template`) and
generation_config.json: a directory that `replax.hf.checkpoint.load_pretrained`,
`--config.model.checkpoint=DIR` and transformers' AutoModelForCausalLM / AutoTokenizer
load. scripts/gguf_to_hf.py is its command line. Reading needs the `gguf` package.

Weights. Quantised tensors are dequantised to float32 with `gguf.quants.dequantize` (a
4-bit GGUF gives the dequantised 4-bit weights, not the model it was quantised from) and
written as float32 or bfloat16. GGUF stores a [rows, cols] matrix with ne0 = cols first,
so its numpy view is already HF's [out, in]. llama.cpp's converter permutes the rows of
attn_q / attn_k within each head from HF's rotate-half RoPE pairing (i, i + D/2) to the
interleaved pairing (2i, 2i + 1) that ggml's RoPE uses; `unpermute_rope_rows` undoes it.
A GGUF without output.weight ties the LM head to the embedding.

Tokenizer. tokenizer.ggml.model 'gpt2' (byte-level BPE): the vocabulary, merges and token
types (control tokens become special added tokens, user-defined ones plain added tokens),
with the pre-tokenizer llama.cpp uses for tokenizer.ggml.pre (`PRE_TOKENIZERS`).

Anything else (another architecture, a tensor type gguf cannot dequantise, RoPE scaling,
a SentencePiece tokenizer) raises a one-line ConfigError naming it and what is supported.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np

from replax.core.config_utils import ConfigError

ARCHITECTURES = ("llama",)
# Plain float types, and the quantisations gguf.quants dequantises that llama.cpp's
# quantize writes for Llama models.
FLOAT_TYPES = ("F32", "F16", "BF16")
QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
TENSOR_TYPES = FLOAT_TYPES + QUANT_TYPES
OUT_DTYPES = ("float32", "bfloat16")
TOKENIZER_MODELS = ("gpt2",)

# HF's special ids and the GGUF keys that hold them.
_SPECIAL_KEYS = {
    "bos": "bos_token_id",
    "eos": "eos_token_id",
    "pad": "padding_token_id",
    "unk": "unknown_token_id",
}
# llama.cpp's token types (llama_token_type).
_CONTROL, _USER_DEFINED = 3, 4

_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = _LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")


def _byte_level(use_regex: bool) -> dict[str, Any]:
    return {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": use_regex,
    }


def _split_then_bytes(regex: str) -> dict[str, Any]:
    split = {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}
    return {"type": "Sequence", "pretokenizers": [split, _byte_level(False)]}


# tokenizer.ggml.pre -> the tokenizer.json pre-tokenizer that splits text as llama.cpp's
# pre-tokenizer regexes do. 'smollm' (as 'starcoder') isolates every digit, then GPT-2's
# regex; ByteLevel's own regex is GPT-2's.
PRE_TOKENIZERS = {
    "default": _byte_level(True),
    "gpt2": _byte_level(True),
    "smollm": {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, _byte_level(True)],
    },
    "starcoder": {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, _byte_level(True)],
    },
    "llama-bpe": _split_then_bytes(_LLAMA3_REGEX),
    "qwen2": _split_then_bytes(_QWEN2_REGEX),
}


def _reader(path: str):
    try:
        import gguf
    except ImportError:
        raise ConfigError(
            "reading a GGUF file needs the gguf package: pip install gguf "
            "(or pip install 'replax[gguf]')"
        ) from None
    if not os.path.isfile(path):
        raise ConfigError(f"--gguf={path}: no such file")
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - gguf raises ValueError / struct errors of its own
        raise ConfigError(f"--gguf={path}: not a readable GGUF file ({e})") from None


def _metadata(reader) -> dict[str, Any]:
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            out[key] = field.contents()
        except Exception:  # noqa: BLE001 - a field gguf cannot decode is not one we read
            continue
    return out


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """HF's q/k_proj rows [H*D, E] from llama.cpp's: within each head, llama.cpp orders
    rows (0, D/2, 1, D/2 + 1, ...) so that its interleaved RoPE pairs what HF's rotate-half
    RoPE pairs; this puts rows 0, 2, 4, ... back first."""
    rows = w.shape[0]
    return (
        w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def hf_config_of(meta: dict[str, Any], vocab_size: int, tied: bool) -> dict[str, Any]:
    """A transformers LlamaConfig dict from llama.* GGUF metadata."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ConfigError(
            f"GGUF general.architecture={arch!r}: supported are {list(ARCHITECTURES)}"
        )

    def get(key, default=None, required=True):
        value = meta.get(f"{arch}.{key}", default)
        if value is None and required:
            raise ConfigError(f"GGUF metadata lacks {arch}.{key}: it is required")
        return value

    if get("expert_count", 0, required=False):
        raise ConfigError(
            f"GGUF {arch}.expert_count={get('expert_count')}: only dense models are supported"
        )
    scaling = get("rope.scaling.type", "none", required=False)
    if scaling not in ("none", None):
        raise ConfigError(f"GGUF {arch}.rope.scaling.type={scaling!r}: only 'none' is supported")
    d_model, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", d_model // heads, required=False))
    rope_dim = int(get("rope.dimension_count", head_dim, required=False))
    if rope_dim != head_dim:
        raise ConfigError(
            f"GGUF {arch}.rope.dimension_count={rope_dim} != head_dim {head_dim}: only full-width "
            "RoPE is supported"
        )
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(get("vocab_size", vocab_size, required=False)),
        "hidden_size": d_model,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads, required=False)),
        "head_dim": head_dim,
        "max_position_embeddings": int(get("context_length", 2048, required=False)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-5, required=False)),
        "rope_theta": float(get("rope.freq_base", 10_000.0, required=False)),
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
    }


_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


def _hf_name(name: str) -> str:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    m = _BLOCK_RE.match(name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.weight"
    raise ConfigError(
        f"GGUF tensor {name!r}: not part of a Llama model (supported are token_embd, "
        f"output_norm, output and blk.N.{{{', '.join(_LAYER_NAMES)}}})"
    )


def _dequantize(tensor) -> np.ndarray:
    import gguf

    kind = tensor.tensor_type.name
    shape = tuple(int(n) for n in reversed(tensor.shape))  # numpy order: [rows, ne0]
    if kind in ("F32", "F16"):
        return np.asarray(tensor.data, np.float32).reshape(shape)
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)


def read_weights(reader, hf: dict[str, Any]) -> dict[str, np.ndarray]:
    """HF-named float32 tensors of a Llama GGUF, q/k rows back in HF's order."""
    out = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        x = _dequantize(tensor)
        if name.endswith("q_proj.weight"):
            x = unpermute_rope_rows(x, hf["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            x = unpermute_rope_rows(x, hf["num_key_value_heads"])
        out[name] = x
    return out


def tokenizer_files(meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, int]]:
    """(tokenizer.json, tokenizer_config.json, {bos/eos/pad/unk_token_id}) from GGUF metadata."""
    model = meta.get("tokenizer.ggml.model")
    if model not in TOKENIZER_MODELS:
        raise ConfigError(
            f"GGUF tokenizer.ggml.model={model!r}: supported are {list(TOKENIZER_MODELS)} "
            "(byte-level BPE)"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ConfigError(
            f"GGUF tokenizer.ggml.pre={pre!r}: supported are {sorted(PRE_TOKENIZERS)}"
        )
    if "tokenizer.ggml.tokens" not in meta:
        raise ConfigError("GGUF metadata lacks tokenizer.ggml.tokens: the vocabulary is required")
    tokens = [str(t) for t in meta["tokenizer.ggml.tokens"]]
    types = [int(t) for t in meta.get("tokenizer.ggml.token_type", [1] * len(tokens))]
    merges = [str(m) for m in meta.get("tokenizer.ggml.merges", [])]
    ids = {}
    for kind, key in _SPECIAL_KEYS.items():
        value = meta.get(f"tokenizer.ggml.{key}")
        if value is not None and 0 <= int(value) < len(tokens):
            ids[f"{kind}_token_id"] = int(value)
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and "bos_token_id" in ids
    if meta.get("tokenizer.ggml.add_eos_token", False):
        raise ConfigError("GGUF tokenizer.ggml.add_eos_token=True: only False is supported")

    added = [
        {
            "id": i,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": kind == _CONTROL,
        }
        for i, (token, kind) in enumerate(zip(tokens, types))
        if kind in (_CONTROL, _USER_DEFINED)
    ]
    if add_bos:
        bos = tokens[ids["bos_token_id"]]
        post = {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [ids["bos_token_id"]], "tokens": [bos]}},
        }
    else:
        post = {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        }
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"} if pre == "qwen2" else None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": post,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": pre == "llama-bpe",
            "vocab": {token: i for i, token in enumerate(tokens)},
            "merges": merges,
        },
    }
    config: dict[str, Any] = {
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": int(
            meta.get(f"{meta.get('general.architecture')}.context_length", 2048)
        ),
    }
    for kind in ("bos", "eos", "pad", "unk"):
        if f"{kind}_token_id" in ids:
            config[f"{kind}_token"] = tokens[ids[f"{kind}_token_id"]]
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        config["chat_template"] = template
    return tokenizer, config, ids


def convert(gguf_path: str, out_dir: str, dtype: str = "float32") -> list[str]:
    """Writes the Hugging Face directory of a Llama GGUF (see the module docstring) and
    returns the files written. dtype: of the written weights, 'float32' or 'bfloat16'."""
    from replax.hf import checkpoint as hf_lib
    from replax.hf import config as hf_config
    from replax.hf import layout as hf_layout

    if dtype not in OUT_DTYPES:
        raise ConfigError(f"--dtype={dtype!r}: supported are {list(OUT_DTYPES)}")
    reader = _reader(gguf_path)
    meta = _metadata(reader)
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    tokens = meta.get("tokenizer.ggml.tokens")
    hf = hf_config_of(meta, len(tokens) if tokens is not None else 0, tied)
    for tensor in reader.tensors:  # every name and type, before anything is dequantised
        _hf_name(tensor.name)
        if tensor.tensor_type.name not in TENSOR_TYPES:
            raise ConfigError(
                f"GGUF tensor {tensor.name} has type {tensor.tensor_type.name}: supported are "
                f"{list(TENSOR_TYPES)}"
            )
    tokenizer, tok_config, ids = tokenizer_files(meta)
    tensors = read_weights(reader, hf)
    try:
        config = hf_config.config_from_hf(hf, param_dtype=dtype, dtype=dtype)
        params = hf_layout.params_from_hf(tensors, config)
    except ValueError as e:  # a tensor missing or mis-shaped for the metadata's config
        raise ConfigError(f"--gguf={gguf_path}: {e}") from None
    del tensors

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tok_config, f, ensure_ascii=False, indent=2)
    generation = {k: v for k, v in ids.items() if k != "unk_token_id"}
    written = ["tokenizer.json", "tokenizer_config.json"]
    written += hf_lib.save_pretrained(out_dir, config, params, generation=generation)
    # config.json carries the special ids too, as checkpoints on the Hub do.
    config_path = os.path.join(out_dir, hf_config.CONFIG_NAME)
    with open(config_path) as f:
        written_config = json.load(f)
    written_config.update(ids)
    with open(config_path, "w") as f:
        json.dump(written_config, f, indent=2)
    return written
