"""Tokenizers: a byte-level one with no files, and an adapter over a HF tokenizer.json.

Both follow one small protocol (`Tokenizer`). `encode` never adds special tokens;
`encode_prompts` adds BOS and left-pads a batch for the sampler, which appends
completions on the right.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Tokenizer(Protocol):
    """What the sampler, the trainer and the data pipeline need from a tokenizer."""

    pad_id: int
    bos_id: int | None  # None for tokenizers without a BOS token (e.g. Qwen).
    eos_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without BOS/EOS."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`; drops pad/bos/eos wherever they are, stops at nothing."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: PAD=0, BOS=1, EOS=2, byte b -> b + 3 (vocab 259)."""

    pad_id = 0
    bos_id = 1
    eos_id = 2
    num_special = 3
    vocab_size = 256 + num_special

    def encode(self, text: str) -> list[int]:
        return [b + self.num_special for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        out = bytearray()
        for i in ids:
            i = int(i)
            if i < self.num_special:
                continue
            if i >= self.vocab_size:
                # A model whose embedding is padded past 259 may sample such ids;
                # make them visible (and unrewardable) rather than crash.
                out += "\ufffd".encode()
                continue
            out.append(i - self.num_special)
        return out.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


# Special-token names tried, in order, when neither the caller nor a sibling
# tokenizer_config.json names them.
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "[CLS]")
_EOS_NAMES = ("<|end_of_text|>", "<|eot_id|>", "</s>", "<eos>", "<|im_end|>", "<|endoftext|>")
_PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>")


class HFTokenizer:
    """Adapter over a Hugging Face `tokenizer.json` (needs `pip install tokenizers`).

    Special tokens are taken from, in order: the constructor arguments (token
    strings), a `tokenizer_config.json` next to the file, and well-known names among
    the file's added special tokens. Without a pad token, pad = eos (prompts are
    masked, so the pad id never matters). Without a BOS token, `bos_id` is None and
    `encode_prompts` adds none.
    """

    def __init__(
        self,
        path: str | pathlib.Path,
        *,
        pad_token: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ):
        try:
            import tokenizers
        except ImportError as e:
            raise ImportError(
                "HFTokenizer needs the `tokenizers` package: pip install tokenizers "
                "(or pip install 'replax[hf]')."
            ) from e
        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        self.path = path
        self._tok = tokenizers.Tokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

        configured = _read_tokenizer_config(path.parent / "tokenizer_config.json")
        special = [
            t["content"]
            for t in json.loads(path.read_text()).get("added_tokens", [])
            if t.get("special")
        ]

        def find(kind, given, names):
            token = given or configured.get(kind)
            if token is None:
                token = next((n for n in names if n in special), None)
            if token is None:
                return None
            token_id = self._tok.token_to_id(token)
            if token_id is None:
                raise ValueError(f"{kind} {token!r} is not in the vocabulary of {path}")
            return token_id

        self.bos_id = find("bos_token", bos_token, _BOS_NAMES)
        self.eos_id = find("eos_token", eos_token, _EOS_NAMES)
        if self.eos_id is None:
            raise ValueError(
                f"no EOS token found in {path}; pass eos_token=... (special tokens: {special})"
            )
        pad_id = find("pad_token", pad_token, _PAD_NAMES)
        self.pad_id = self.eos_id if pad_id is None else pad_id
        self._strip = {self.pad_id, self.eos_id} | ({self.bos_id} - {None})

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        kept = [int(i) for i in ids if int(i) not in self._strip and 0 <= int(i) < self.vocab_size]
        return self._tok.decode(kept, skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"HFTokenizer({str(self.path)!r})"


def _read_tokenizer_config(path: pathlib.Path) -> dict[str, str]:
    """Special-token strings from a transformers tokenizer_config.json, if present."""
    if not path.is_file():
        return {}
    config = json.loads(path.read_text())
    out = {}
    for kind in ("bos_token", "eos_token", "pad_token"):
        value = config.get(kind)
        if isinstance(value, dict):  # {"content": "<s>", ...}
            value = value.get("content")
        if isinstance(value, str):
            out[kind] = value
    return out


def encode_prompts(
    tokenizer: Tokenizer, texts: Sequence[str], max_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """BOS + tokens of each text, left-padded with pad_id to max_len.

    Returns ids int32[B, max_len] and mask bool[B, max_len] (True on real tokens).
    Raises ValueError for a prompt longer than max_len: it is never truncated.
    """
    ids = np.full((len(texts), max_len), tokenizer.pad_id, dtype=np.int32)  # [B, P]
    mask = np.zeros((len(texts), max_len), dtype=bool)  # [B, P]
    bos = [] if tokenizer.bos_id is None else [tokenizer.bos_id]
    for row, text in enumerate(texts):
        tokens = bos + tokenizer.encode(text)
        if len(tokens) > max_len:
            shown = text if len(text) <= 200 else text[:200] + "..."
            raise ValueError(
                f"prompt {shown!r} is {len(tokens)} tokens (with BOS), longer than "
                f"max_len={max_len}"
            )
        if tokens:
            ids[row, max_len - len(tokens) :] = tokens
            mask[row, max_len - len(tokens) :] = True
    return ids, mask


def decode_completion(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
    """Text of a sampled completion up to (not including) its first EOS.

    This is what reward functions expect: tokens after EOS are not part of the answer.
    """
    ids = [int(i) for i in ids]
    if tokenizer.eos_id in ids:
        ids = ids[: ids.index(tokenizer.eos_id)]
    return tokenizer.decode(ids)
