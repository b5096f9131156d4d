"""Tokenizers: a byte-level one with no files, and an adapter over a HF tokenizer directory.

Both follow one small protocol (`Tokenizer`). `encode` never adds special tokens;
`encode_prompts` adds BOS where the tokenizer does (and the text does not start with it
already) and left-pads a batch for the sampler, which appends completions on the right.
A completion ends at the first of `stop_ids` (`decode_completion`).

`format_prompt` builds the prompt text for a question: "chat" renders the tokenizer's chat
template as transformers' `apply_chat_template(..., add_generation_prompt=True,
tokenize=False)` does; "base" writes plain "Question: ... Answer:" few-shot text.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

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
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "[CLS]")
_EOS_NAMES = ("<|end_of_text|>", "<|eot_id|>", "</s>", "<eos>", "<|im_end|>", "<|endoftext|>")
_PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>")
# The named special tokens transformers passes to a chat template (special_tokens_map).
_TEMPLATE_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class HFTokenizer:
    """A Hugging Face tokenizer directory (or its tokenizer.json), read without transformers.

    tokenizer.json is loaded with the `tokenizers` library. From the same directory:
    tokenizer_config.json names the special tokens, says whether BOS is added
    (`add_bos_token`; else the tokenizer.json post-processor decides, as in transformers)
    and holds the chat template (chat_template.jinja wins, as in transformers >= 4.43);
    generation_config.json adds its `eos_token_id` (an int or a list) to the stop ids and
    supplies bos / pad ids the tokenizer config does not name.

    Special tokens come from, in order: the constructor arguments (token strings), those
    files, and well-known names among the added special tokens. `eos_id` is the tokenizer's
    EOS (the end of an assistant turn for chat models), `stop_ids` it followed by
    generation_config's (Qwen2.5-Instruct: 151645 <|im_end|>, 151643 <|endoftext|>).
    Without a pad token, pad = eos (prompts are masked, so the pad id never matters).
    """

    def __init__(
        self,
        path: str | pathlib.Path,
        *,
        pad_token: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        chat_template: str | None = None,
    ):
        try:
            import tokenizers
        except ImportError as e:
            raise ImportError(
                "HFTokenizer needs the `tokenizers` package: pip install tokenizers "
                "(or pip install 'replax[hf]')."
            ) from e
        path = pathlib.Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"tokenizer file not found: {file}")
        self.path = file
        self.directory = file.parent
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # noqa: BLE001 - the library raises its own exception type
            raise ValueError(f"{file}: not a tokenizers tokenizer.json ({e})") from None
        vocab = self._tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values(), default=-1) + 1
        self.sample_limit = self.vocab_size

        self.config = _read_json(self.directory / "tokenizer_config.json")
        legacy_map = _read_json(self.directory / "special_tokens_map.json")
        self.generation_config = _read_json(self.directory / "generation_config.json")
        special = [
            t["content"]
            for t in json.loads(file.read_text(encoding="utf-8")).get("added_tokens", [])
            if t.get("special")
        ]
        given = {"bos_token": bos_token, "eos_token": eos_token, "pad_token": pad_token}
        # The special-token strings a chat template sees, as transformers passes them.
        self.special_tokens: dict[str, str] = {}
        for kind in _TEMPLATE_TOKENS:
            value = given.get(kind) or _token_str(self.config.get(kind, legacy_map.get(kind)))
            if value is not None:
                self.special_tokens[kind] = value

        def token_id(kind: str, token: str) -> int:
            token_id = self._tok.token_to_id(token)
            if token_id is None:
                raise ValueError(f"{kind} {token!r} is not in the vocabulary of {file}")
            return token_id

        def find(kind: str, names: Sequence[str]) -> int | None:
            if kind in self.special_tokens:
                return token_id(kind, self.special_tokens[kind])
            if kind in self.config or kind in legacy_map:  # named, and null: there is none
                return None
            generation_id = self.generation_config.get(kind + "_id")
            if isinstance(generation_id, int):
                return generation_id
            name = next((n for n in names if n in special), None)
            return None if name is None else token_id(kind, name)

        self.bos_id = find("bos_token", _BOS_NAMES)
        eos_id = (
            token_id("eos_token", self.special_tokens["eos_token"])
            if "eos_token" in self.special_tokens
            else None
        )
        stop = [] if eos_id is None else [eos_id]
        generation_eos = self.generation_config.get("eos_token_id")
        for i in generation_eos if isinstance(generation_eos, list) else [generation_eos]:
            if isinstance(i, int) and i not in stop:
                stop.append(i)
        if not stop:
            name = next((n for n in _EOS_NAMES if n in special), None)
            if name is None:
                raise ValueError(
                    f"no EOS token found for {file}; pass eos_token=... (special tokens: "
                    f"{special[:8]})"
                )
            stop = [token_id("eos_token", name)]
        bad = [i for i in stop if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(
                f"stop ids {bad} (generation_config.json eos_token_id) are outside the "
                f"vocabulary of {file}: allowed are 0 <= id < {self.vocab_size}"
            )
        self.stop_ids = tuple(stop)
        self.eos_id = self.stop_ids[0]
        pad_id = find("pad_token", _PAD_NAMES)
        self.pad_id = self.eos_id if pad_id is None else pad_id

        add_bos = self.config.get("add_bos_token")
        if not isinstance(add_bos, bool):
            if self._tok.post_processor is None:
                add_bos = True
            else:  # what transformers' tokenizer(text) does: the post-processor decides
                ids = self._tok.encode("a", add_special_tokens=True).ids
                add_bos = bool(ids) and ids[0] == self.bos_id
        self.add_bos = bool(add_bos) and self.bos_id is not None

        self.chat_template = chat_template or _chat_template(self.directory, self.config)
        self._strip = {self.pad_id, *self.stop_ids} | ({self.bos_id} - {None})
        self._compiled = None

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        kept = [int(i) for i in ids if int(i) not in self._strip and 0 <= int(i) < self.vocab_size]
        return self._tok.decode(kept, skip_special_tokens=False)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **kwargs
    ) -> str:
        """The chat template rendered as transformers' apply_chat_template(messages,
        add_generation_prompt=..., tokenize=False) renders it: the same sandboxed jinja2
        environment (trim_blocks, lstrip_blocks, loopcontrols, a tojson that does not
        escape HTML, raise_exception, strftime_now) and the special tokens as variables."""
        if not self.chat_template:
            raise ValueError(
                f"{self.directory} has no chat template (tokenizer_config.json chat_template "
                "or chat_template.jinja): use the 'base' prompt format"
            )
        if self._compiled is None:
            self._compiled = _compile_template(self.chat_template)
        messages = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
        variables = {**self.special_tokens, **kwargs}
        variables.setdefault("tools", None)
        variables.setdefault("documents", None)
        return self._compiled.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **variables
        )

    def __repr__(self) -> str:
        return f"HFTokenizer({str(self.directory)!r})"


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    return value if isinstance(value, dict) else {}


def _token_str(value) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(directory: pathlib.Path, config: Mapping[str, Any]) -> str | None:
    """The default chat template, found where transformers looks for it."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _compile_template(source: str):
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        raise ImportError(
            "chat templates need jinja2: pip install jinja2 (or pip install 'replax[hf]')."
        ) from e

    class GenerationTag(jinja2.ext.Extension):
        """{% generation %} ... {% endgeneration %} (assistant-mask markers): rendered as is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(
                lineno
            )

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format):
        import datetime

        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ValueError(f"chat template does not parse: {e} (line {e.lineno})") from None


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
    bos_id = tokenizer.bos_id if getattr(tokenizer, "add_bos", True) else None
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
