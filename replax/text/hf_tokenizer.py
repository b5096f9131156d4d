"""A Hugging Face tokenizer directory (or its tokenizer.json) read without transformers,
and its chat template rendered as transformers' `apply_chat_template` renders it.

`HFTokenizer` follows `replax.text.tokenizer.Tokenizer`: `encode` never adds special tokens;
BOS, EOS, pad and the stop ids come from tokenizer_config.json, generation_config.json or
the usual token names.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

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

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each text, in one call of the tokenizers library (its threads)."""
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

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
