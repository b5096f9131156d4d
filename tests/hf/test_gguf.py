"""replax.hf.gguf and scripts/gguf_to_hf.py: a llama.cpp GGUF to a Hugging Face directory.

The real file is SmolLM2-135M-Instruct in Q4_1 (tests/assets.py). Its converted weights
are checked against transformers' own GGUF loader (an independent dequantisation and
RoPE un-permutation), its tokenizer against transformers' GGUF tokenizer, and bad input
(another architecture, a tensor type the converter cannot read, no file) against the
script's exit status 2 and one line.
"""

import os
import subprocess
import sys

import assets
import numpy as np
import pytest

from replax.hf import gguf as gguf_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _llama_cpp_permute(w, num_heads):
    """What llama.cpp's convert_hf_to_gguf.py does to q/k_proj rows (LlamaModel.permute)."""
    return (
        w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


@pytest.mark.parametrize("num_heads", [1, 3, 9])
def test_unpermute_inverts_llama_cpp_permute(num_heads):
    w = np.arange(num_heads * 8 * 5, dtype=np.float32).reshape(num_heads * 8, 5)
    np.testing.assert_array_equal(
        gguf_lib.unpermute_rope_rows(_llama_cpp_permute(w, num_heads), num_heads), w
    )
    # Within a head of 8 rows, llama.cpp's order is rows 0, 4, 1, 5, 2, 6, 3, 7 of HF's.
    assert _llama_cpp_permute(w, num_heads)[:8, 0].tolist() == [0, 20, 5, 25, 10, 30, 15, 35]


@pytest.fixture(scope="module")
def converted():
    return assets.converted_smollm2("float32")


def test_weights_equal_transformers_gguf_loader(converted):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    assets.require_module("accelerate", "accelerate")  # transformers' GGUF loading needs it
    from safetensors.numpy import load_file

    source = assets.smollm2_gguf()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    theirs = {k: v.numpy() for k, v in model.state_dict().items()}
    ours = load_file(str(converted / "model.safetensors"))
    assert set(theirs) - set(ours) == {"lm_head.weight"}  # tied: the embedding
    assert set(ours) <= set(theirs) and len(ours) == 2 + 30 * 9
    for name, x in ours.items():
        assert x.dtype == np.float32 and x.shape == theirs[name].shape, name
        np.testing.assert_array_equal(x, theirs[name], err_msg=name)
    for key in ("rms_norm_eps", "num_key_value_heads", "tie_word_embeddings", "vocab_size"):
        assert (
            getattr(model.config, key)
            == transformers.AutoConfig.from_pretrained(converted).to_dict()[key]
        )
    assert model.config.rope_parameters["rope_theta"] == 100_000.0


def test_tokenizer_matches_transformers_gguf_tokenizer(converted):
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from replax.text import hf_tokenizer

    source = assets.smollm2_gguf()
    auto = transformers.AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    ours = hf_tokenizer.HFTokenizer(converted)
    library = tokenizers.Tokenizer.from_file(str(converted / "tokenizer.json"))
    assert (ours.bos_id, ours.eos_id, ours.pad_id) == (1, 2, 2)
    assert (auto.bos_token_id, auto.eos_token_id, auto.pad_token_id) == (1, 2, 2)
    assert ours.vocab_size == len(auto) == 49_152
    # transformers' converter ignores tokenizer.ggml.pre; llama.cpp's 'smollm' splits every
    # digit off first, as SmolLM2's own tokenizer.json does. Give transformers' the same.
    theirs = auto.backend_tokenizer
    plain = tokenizers.Tokenizer.from_str(theirs.to_str())
    theirs.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [tokenizers.pre_tokenizers.Digits(individual_digits=True), theirs.pre_tokenizer]
    )
    rows = assets.read_jsonl(assets.gsm8k("test"))[:300]
    texts = [r["question"] for r in rows] + [r["answer"] for r in rows[:100]]
    differ_plain = 0
    for text in texts + ["  2 apples", "x = ¾ and ²", "<|im_start|>user\nhi<|im_end|>"]:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False).ids, text
        assert ids == library.encode(text, add_special_tokens=False).ids, text
        kept = [i for i in ids if i not in (1, 2)]  # replax's decode drops bos / eos / pad
        assert ours.decode(kept) == theirs.decode(kept, skip_special_tokens=False), text
        differ_plain += ids != plain.encode(text, add_special_tokens=False).ids
    print(
        f"\n{len(texts)} GSM8K strings: {differ_plain} tokenise differently without the digit split"
    )
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    for add in (True, False):
        assert ours.apply_chat_template(messages, add_generation_prompt=add) == (
            auto.apply_chat_template(messages, add_generation_prompt=add, tokenize=False)
        )


def _write_gguf(path, arch="llama", tensor_dtype=np.float32):
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_tensor("token_embd.weight", np.zeros((32, 8), tensor_dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _script(*args):
    return subprocess.run(
        [sys.executable, "scripts/gguf_to_hf.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "case, expected",
    [
        ("gpt2", "GGUF general.architecture='gpt2': supported are ['llama']"),
        ("int32", "GGUF tensor token_embd.weight has type I32: supported are ['F32', 'F16'"),
        ("missing", "no such file"),
    ],
)
def test_script_bad_input_exits_2_with_one_line(tmp_path, case, expected):
    assets.require_module("gguf", "gguf")
    path = tmp_path / "model.gguf"
    if case == "gpt2":
        _write_gguf(path, arch="gpt2")
    elif case == "int32":
        _write_gguf(path, tensor_dtype=np.int32)
    out = tmp_path / "out"
    proc = _script(f"--gguf={path}", f"--out={out}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert not out.exists()


def test_a_gguf_file_as_model_checkpoint_says_to_convert_it(tmp_path):
    """train.py --config.model.checkpoint=FILE.gguf: exit 2, one line pointing at
    scripts/gguf_to_hf.py, nothing created."""
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(28))
    workdir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/train.py",
            "--config=configs/arith.py",
            f"--workdir={workdir}",
            "--config.model.init=checkpoint",
            f"--config.model.checkpoint={path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"model.checkpoint='{path}' is a GGUF file" in lines[0], lines
    assert "scripts/gguf_to_hf.py" in lines[0], lines
    assert not workdir.exists()
