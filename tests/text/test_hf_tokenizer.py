"""Tests for replax/text/hf_tokenizer.py: specials and stop ids from a HF tokenizer directory,
BOS as transformers adds it, chat-template rendering, and the install hints."""

import json
import sys

import numpy as np
import pytest

from replax.text.hf_tokenizer import HFTokenizer
from replax.text.tokenizer import Tokenizer, decode_completion, encode_prompts, format_prompt


def _write_hf_tokenizer(directory, with_config):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "[UNK]": 3, "1": 4, "+": 5, "2": 6, "=": 7, "3": 8}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    path = directory / "tokenizer.json"
    tok.save(str(path))
    if with_config:  # transformers names the specials here; it overrides the name guess
        (directory / "tokenizer_config.json").write_text(
            json.dumps({"bos_token": {"content": "</s>"}, "eos_token": "<s>"})
        )
    return path


def test_hf_tokenizer_specials_from_names(tmp_path):
    tok = HFTokenizer(_write_hf_tokenizer(tmp_path, with_config=False))
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 9)
    assert tok.encode("1+2=3") == [4, 5, 6, 7, 8]
    assert tok.decode([0, 1, 4, 5, 6, 2, 8]) == "1+23"
    ids, mask = encode_prompts(tok, ["1+2="], max_len=6)
    np.testing.assert_array_equal(ids[0], [0, 1, 4, 5, 6, 7])
    assert mask[0].tolist() == [False] + [True] * 5


def test_hf_tokenizer_specials_from_config_and_args(tmp_path):
    path = _write_hf_tokenizer(tmp_path, with_config=True)
    tok = HFTokenizer(path)
    assert (tok.bos_id, tok.eos_id) == (2, 1)
    tok = HFTokenizer(path, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (2, 1, 2)
    with pytest.raises(ValueError, match="<eot>"):
        HFTokenizer(path, eos_token="<eot>")


def test_hf_tokenizer_missing_file(tmp_path):
    pytest.importorskip("tokenizers")
    with pytest.raises(ValueError, match="nope.json"):
        HFTokenizer(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="tokenizer.json"):
        HFTokenizer(tmp_path)  # a directory without one


def test_hf_tokenizer_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
    with pytest.raises(ImportError, match="pip install tokenizers"):
        HFTokenizer(tmp_path / "tokenizer.json")


# ---------------------------------------------------------------------------------------
# A Qwen-like directory: stop ids, BOS, chat template.

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _write_chat_dir(directory, config=None, generation=None, post_processor_bos=False):
    tokenizers = pytest.importorskip("tokenizers")
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
    vocab = {t: i for i, t in enumerate(specials + ["[UNK]", "1", "+", "2", "=", "\n", "a"])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    tok.add_special_tokens(specials)
    if post_processor_bos:  # as Llama's tokenizer.json adds <|begin_of_text|>
        tok.post_processor = tokenizers.processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", 3)]
        )
    else:  # as Qwen's ByteLevel post-processor: adds nothing
        tok.post_processor = tokenizers.processors.ByteLevel()
    tok.save(str(directory / "tokenizer.json"))
    if config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    if generation is not None:
        (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


QWEN_CONFIG = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}


def test_stop_ids_merge_tokenizer_eos_and_generation_config(tmp_path):
    _write_chat_dir(tmp_path, QWEN_CONFIG, {"bos_token_id": 0, "eos_token_id": [2, 0]})
    tok = HFTokenizer(tmp_path)  # a directory, as a checkpoint holds it
    assert (tok.stop_ids, tok.eos_id, tok.pad_id, tok.bos_id) == ((2, 0), 2, 0, None)
    assert not tok.add_bos and tok.vocab_size == 11 and isinstance(tok, Tokenizer)
    # The tokenizer's EOS first, then generation_config's in its order, no repeats.
    _write_chat_dir(tmp_path, QWEN_CONFIG, {"eos_token_id": [0, 2]})
    assert HFTokenizer(tmp_path).stop_ids == (2, 0)
    _write_chat_dir(tmp_path, {"eos_token": "<|endoftext|>"}, {"eos_token_id": 2})
    tok = HFTokenizer(tmp_path / "tokenizer.json")
    assert tok.stop_ids == (0, 2) and tok.pad_id == 0  # no pad token: pad = eos
    # Only generation_config names EOS / pad / BOS.
    _write_chat_dir(tmp_path, {}, {"eos_token_id": [2], "pad_token_id": 1, "bos_token_id": 3})
    tok = HFTokenizer(tmp_path)
    assert (tok.stop_ids, tok.pad_id, tok.bos_id) == ((2,), 1, 3)
    _write_chat_dir(tmp_path, QWEN_CONFIG, {"eos_token_id": [2, 500]})
    with pytest.raises(ValueError, match=r"stop ids \[500\].*0 <= id < 11"):
        HFTokenizer(tmp_path)


def test_decode_completion_stops_at_any_stop_id(tmp_path):
    tok = HFTokenizer(_write_chat_dir(tmp_path, QWEN_CONFIG, {"eos_token_id": [2, 0]}))
    one_plus_two = tok.encode("1+2")
    assert decode_completion(tok, one_plus_two + [0] + tok.encode("=3")) == "1+2"
    assert decode_completion(tok, one_plus_two + [2, 5]) == "1+2"
    assert tok.decode(one_plus_two + [2] + tok.encode("2")) == "1+22"  # decode stops at none


def test_bos_as_transformers_adds_it(tmp_path):
    # The post-processor adds BOS: encode_prompts does too, once, even if the text has it.
    tok = HFTokenizer(_write_chat_dir(tmp_path, {"bos_token": "<s>"}, post_processor_bos=True))
    assert tok.bos_id == 3 and tok.add_bos
    ids, mask = encode_prompts(tok, ["1+2", "<s>1+2"], max_len=5)
    assert ids.tolist() == [[2, 3, 5, 6, 7], [2, 3, 5, 6, 7]]  # pad = eos <|im_end|>
    # add_bos_token in tokenizer_config wins over the post-processor.
    config = {"bos_token": "<s>", "add_bos_token": False}
    tok = HFTokenizer(_write_chat_dir(tmp_path, config, post_processor_bos=True))
    assert not tok.add_bos and encode_prompts(tok, ["1"], 1)[0].tolist() == [[5]]
    # A BOS token the post-processor does not add (GPT-2 style): none added.
    tok = HFTokenizer(_write_chat_dir(tmp_path, {"bos_token": "<s>", "eos_token": "<s>"}))
    assert tok.bos_id == 3 and not tok.add_bos


def test_chat_template_rendering(tmp_path):
    config = {**QWEN_CONFIG, "chat_template": CHATML}
    tok = HFTokenizer(_write_chat_dir(tmp_path, config, {"eos_token_id": [2, 0]}))
    messages = [{"role": "user", "content": "1+2="}]
    assert tok.apply_chat_template(messages) == (
        "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == (
        "<|im_start|>user\n1+2=<|im_end|>\n"
    )
    prompt = format_prompt(tok, "1+2=", style="chat", system="a", shots=[("1+1=", "2")])
    assert prompt == (
        "<|im_start|>system\na<|im_end|>\n<|im_start|>user\n1+1=<|im_end|>\n"
        "<|im_start|>assistant\n2<|im_end|>\n<|im_start|>user\n1+2=<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids, mask = encode_prompts(tok, [tok.apply_chat_template(messages)], max_len=32)
    prompt_ids = ids[0][mask[0]].tolist()
    assert prompt_ids[0] == 1 and prompt_ids[-1] == 9  # <|im_start|> first, no BOS; "\n" last
    # chat_template.jinja wins over tokenizer_config (as in transformers >= 4.43), and a
    # list of named templates uses "default".
    (tmp_path / "chat_template.jinja").write_text("J{{ messages[0]['content'] }}")
    assert HFTokenizer(tmp_path).apply_chat_template(messages) == "J1+2="
    (tmp_path / "chat_template.jinja").unlink()
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    _write_chat_dir(tmp_path, {**QWEN_CONFIG, "chat_template": named})
    assert HFTokenizer(tmp_path).apply_chat_template(messages) == "D"
    # transformers' helpers: raise_exception, tojson that leaves HTML alone, loop controls.
    template = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m | tojson }}{% endfor %}{% if not messages %}{{ raise_exception('empty') }}"
        "{% endif %}"
    )
    tok = HFTokenizer(tmp_path, chat_template=template)
    assert tok.apply_chat_template([{"role": "user", "content": "<b>&"}, {"role": "x"}]) == (
        '{"role": "user", "content": "<b>&"}'
    )
    import jinja2

    with pytest.raises(jinja2.exceptions.TemplateError, match="empty"):
        tok.apply_chat_template([])


def test_chat_template_says_how_to_install_jinja(monkeypatch, tmp_path):
    tok = HFTokenizer(_write_chat_dir(tmp_path, {**QWEN_CONFIG, "chat_template": CHATML}))
    monkeypatch.setitem(sys.modules, "jinja2", None)
    with pytest.raises(ImportError, match="pip install jinja2"):
        tok.apply_chat_template([{"role": "user", "content": "q"}])
