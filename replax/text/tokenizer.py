"""Tokenizers: the protocol (`Tokenizer`), a byte-level one with no files, and the prompt
helpers every tokenizer shares; the adapter over a HF tokenizer directory is
`replax.text.hf_tokenizer.HFTokenizer`.

Both follow the protocol. `encode` never adds special tokens;
`encode_prompts` adds BOS where the tokenizer does (and the text does not start with it
already) and left-pads a batch for the sampler, which appends completions on the right.
A completion ends at the first of `stop_ids` (`decode_completion`).

`format_prompt` builds the prompt text for a question: "chat" renders the tokenizer's chat
template as transformers' `apply_chat_template(..., add_generation_prompt=True,
tokenize=False)` does; "base" writes plain "Question: ... Answer:" few-shot text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Tokenizer(Protocol):
    """What the sampler, the trainer and the data pipeline need from a tokenizer."""

    pad_id: int
    bos_id: int | None  # None for tokenizers without a BOS token (e.g. Qwen).
    eos_id: int  # the first of stop_ids: what a demonstration ends with
    stop_ids: tuple[int, ...]  # every id that ends a completion
    vocab_size: int  # every id is < vocab_size; a model's vocab must be at least this
    # Model rows at or past this id are never sampled (None: every row may be). A
    # pretrained checkpoint pads its vocabulary past the tokenizer's ids with rows that
    # were never trained to stay unlikely.
    sample_limit: int | None

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without BOS/EOS."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`; drops pad/bos/stop ids wherever they are, stops at nothing."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: PAD=0, BOS=1, EOS=2, byte b -> b + 3 (vocab 259)."""

    pad_id = 0
    bos_id = 1
    eos_id = 2
    stop_ids = (2,)
    add_bos = True
    chat_template = None
    num_special = 3
    vocab_size = 256 + num_special
    # A policy over bytes is trained from scratch, extra rows included: it learns never
    # to emit them, and sampling keeps its whole vocabulary, as it always has.
    sample_limit = None

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


# Special-token names tried, in order, when neither the caller nor the directory's
# tokenizer_config.json / generation_config.json names them.
PROMPT_STYLES = ("chat", "base")


def format_prompt(
    tokenizer,
    question: str,
    *,
    style: str = "chat",
    system: str | None = None,
    shots: Sequence[tuple[str, str]] = (),
    question_prefix: str = "Question: ",
    answer_prefix: str = "Answer:",
) -> str:
    """The prompt text for `question`.

    chat: [system] + (user, assistant) per shot + user question, rendered by the tokenizer's
    chat template with the generation prompt (the assistant header) at the end.
    base: [system + blank line] + "Question: q\\nAnswer: a\\n\\n" per shot + "Question:
    question\\nAnswer:", for a model without chat tuning to continue.
    """
    if style == "chat":
        messages = [] if system is None else [{"role": "system", "content": system}]
        for q, a in shots:
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        messages.append({"role": "user", "content": question})
        if not hasattr(tokenizer, "apply_chat_template") or not tokenizer.chat_template:
            raise ValueError(f"{tokenizer!r} has no chat template: use the 'base' prompt format")
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    if style == "base":
        parts = [] if system is None else [system + "\n\n"]
        for q, a in shots:
            parts.append(f"{question_prefix}{q}\n{answer_prefix} {a}\n\n")
        parts.append(f"{question_prefix}{question}\n{answer_prefix}")
        return "".join(parts)
    raise ValueError(f"prompt style {style!r}: allowed are {list(PROMPT_STYLES)}")


def encode_prompts(
    tokenizer: Tokenizer, texts: Sequence[str], max_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """[BOS +] tokens of each text, left-padded with pad_id to max_len.

    BOS is added when the tokenizer adds one (`add_bos`, default True with a bos_id) and
    the text's tokens do not already start with it (a chat template that writes it).
    Returns ids int32[B, max_len] and mask bool[B, max_len] (True on real tokens).
    Raises ValueError for a prompt longer than max_len: it is never truncated.
    """
    ids = np.full((len(texts), max_len), tokenizer.pad_id, dtype=np.int32)  # [B, P]
    mask = np.zeros((len(texts), max_len), dtype=bool)  # [B, P]
    bos_id = prompt_bos_id(tokenizer)
    for row, text in enumerate(texts):
        tokens = tokenizer.encode(text)
        if bos_id is not None and tokens[:1] != [bos_id]:
            tokens = [bos_id] + tokens
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


def prompt_bos_id(tokenizer: Tokenizer) -> int | None:
    """The BOS id a prompt starts with, or None when the tokenizer adds none."""
    return tokenizer.bos_id if getattr(tokenizer, "add_bos", True) else None


def prompt_lengths(tokenizer: Tokenizer, texts: Sequence[str]) -> np.ndarray:
    """int64[N]: the tokens of each text as `encode_prompts` lays it out (BOS included
    where it adds one). A tokenizer with `encode_batch` (HFTokenizer) encodes the whole
    list in one call, so a data set of thousands of prompts is measured in about a
    second."""
    batch = getattr(tokenizer, "encode_batch", None)
    encoded = batch(list(texts)) if batch else [tokenizer.encode(t) for t in texts]
    bos_id = prompt_bos_id(tokenizer)
    lengths = [len(ids) + (bos_id is not None and list(ids[:1]) != [bos_id]) for ids in encoded]
    return np.asarray(lengths, dtype=np.int64)


def check_model_vocab(tokenizer: Tokenizer, model_vocab_size: int) -> None:
    """Raises a one-line ValueError if the tokenizer has ids the model cannot embed (a model
    vocabulary may be larger: Qwen2.5 pads 151,665 tokenizer ids to 151,936 rows)."""
    if model_vocab_size < tokenizer.vocab_size:
        raise ValueError(
            f"model.vocab_size={model_vocab_size} is smaller than the tokenizer's vocabulary "
            f"({tokenizer.vocab_size} ids, {tokenizer!r}): allowed is >= {tokenizer.vocab_size}"
        )
    bad = [i for i in (tokenizer.pad_id, *tokenizer.stop_ids) if not 0 <= i < model_vocab_size]
    if bad:
        raise ValueError(f"pad / stop ids {bad} are outside model.vocab_size={model_vocab_size}")


def decode_completion(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
    """Text of a sampled completion up to (not including) its first stop id.

    This is what reward functions expect: tokens after the stop are not part of the answer.
    """
    ids = [int(i) for i in ids]
    stops = set(getattr(tokenizer, "stop_ids", (tokenizer.eos_id,)))
    end = next((t for t, i in enumerate(ids) if i in stops), len(ids))
    return tokenizer.decode(ids[:end])
