"""Tests for replax/tokenizer.py."""

import json
import sys

import numpy as np
import pytest

from replax.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    decode_completion,
    encode_prompts,
)


def test_byte_tokenizer_ids():
    tok = ByteTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 259)
    assert tok.encode("A1=") == [ord("A") + 3, ord("1") + 3, ord("=") + 3]
    assert isinstance(tok, Tokenizer)


@pytest.mark.parametrize("text", ["", "37+48-19=", "héllo\n", "数学 \u2212 \\boxed{1}"])
def test_byte_tokenizer_round_trip(text):
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_byte_decode_strips_specials_everywhere_and_survives_bad_ids():
    tok = ByteTokenizer()
    ids = [tok.pad_id, tok.bos_id] + tok.encode("12") + [tok.eos_id] + tok.encode("3")
    assert tok.decode(ids) == "123"  # decode stops at nothing
    assert tok.decode(np.array(tok.encode("7") + [300])) == "7\ufffd"  # id past the vocab


def test_decode_completion_stops_at_first_eos():
    tok = ByteTokenizer()
    ids = tok.encode("66") + [tok.eos_id] + tok.encode("junk") + [tok.pad_id]
    assert decode_completion(tok, ids) == "66"
    assert decode_completion(tok, tok.encode("66")) == "66"  # no EOS: all of it


def test_encode_prompts_left_pads_with_bos_first():
    tok = ByteTokenizer()
    ids, mask = encode_prompts(tok, ["1+2=", "10+20="], max_len=8)
    assert ids.dtype == np.int32 and mask.dtype == bool and ids.shape == mask.shape == (2, 8)
    np.testing.assert_array_equal(ids[0], [0, 0, 0, 1] + tok.encode("1+2="))
    np.testing.assert_array_equal(ids[1], [0, 1] + tok.encode("10+20="))
    np.testing.assert_array_equal(mask[0], [False] * 3 + [True] * 5)
    np.testing.assert_array_equal(mask[1], [False] * 1 + [True] * 7)


def test_encode_prompts_exact_fit_and_too_long():
    tok = ByteTokenizer()
    ids, mask = encode_prompts(tok, ["1234"], max_len=5)  # BOS + 4 bytes fits exactly
    assert mask.all() and ids[0, 0] == tok.bos_id
    with pytest.raises(ValueError, match=r"'12345'.*max_len=5"):
        encode_prompts(tok, ["1", "12345"], max_len=5)


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
    with pytest.raises(FileNotFoundError, match="nope.json"):
        HFTokenizer(tmp_path / "nope.json")


def test_hf_tokenizer_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
    with pytest.raises(ImportError, match="pip install tokenizers"):
        HFTokenizer(tmp_path / "tokenizer.json")
