"""Tests for replax/text/tokenizer.py (the HF tokenizer: tests/text/test_hf_tokenizer.py)."""

import numpy as np
import pytest
from test_hf_tokenizer import QWEN_CONFIG, _write_chat_dir

from replax.text.hf_tokenizer import HFTokenizer
from replax.text.tokenizer import (
    ByteTokenizer,
    Tokenizer,
    check_model_vocab,
    decode_completion,
    encode_prompts,
    format_prompt,
)


def test_byte_tokenizer_ids():
    tok = ByteTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 259)
    assert tok.stop_ids == (2,)
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


def test_format_prompt_base_and_errors(tmp_path):
    tok = ByteTokenizer()
    assert format_prompt(tok, "1+2=", style="base", shots=[("1+1=", "2")]) == (
        "Question: 1+1=\nAnswer: 2\n\nQuestion: 1+2=\nAnswer:"
    )
    assert format_prompt(tok, "q", style="base", system="S") == "S\n\nQuestion: q\nAnswer:"
    with pytest.raises(ValueError, match="no chat template.*base"):
        format_prompt(tok, "q", style="chat")
    with pytest.raises(ValueError, match="style 'fancy'"):
        format_prompt(tok, "q", style="fancy")
    plain = HFTokenizer(_write_chat_dir(tmp_path, QWEN_CONFIG))
    with pytest.raises(ValueError, match="no chat template"):
        plain.apply_chat_template([{"role": "user", "content": "q"}])


def test_check_model_vocab():
    check_model_vocab(ByteTokenizer(), 259)
    check_model_vocab(ByteTokenizer(), 512)  # padded past the tokenizer: fine
    with pytest.raises(ValueError, match=r"model.vocab_size=258.*allowed is >= 259"):
        check_model_vocab(ByteTokenizer(), 258)
