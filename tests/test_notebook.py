"""The Colab notebook runs top to bottom on the CPU, every cell, with only its parameters
changed (through the REPLAX_* environment variables its first cell reads): replax installed
by its own %pip cell from this checkout, a tiny random Qwen2-architecture Hugging Face
directory for MODEL, the forty problems of tests/data/gsm8k_tiny.jsonl for DATA, a few
steps, ALLOW_CPU.

The install goes into a directory of its own (pip --target, first on the kernel's
PYTHONPATH) and without dependencies, which this environment already has: the test
neither reinstalls the environment's replax nor pulls the `tpu` extra's libtpu."""

import importlib.util
import json
import os
import pathlib

import nbformat
import pytest
from checkpoints import write_tiny_bpe_qwen2
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "replax_colab.ipynb"

# The Colab settings a CPU cannot run in seconds: float32 (XLA:CPU's bfloat16 is slow),
# short prompts, pass@k on a handful of prompts, one checkpoint at the end.
CPU_OVERRIDES = (
    "model.dtype=float32 rollout.max_prompt_len=80 model.max_len=96 train.num_microbatches=2 "
    "eval.pass_k=2 eval.pass_k_prompts=4 checkpoint_every=4"
)


def run_notebook(**parameters):
    """The notebook executed top to bottom with `parameters` added to the environment, and
    the error of the cell that failed (None if none did)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3")
    try:
        client.execute(env={**os.environ, **parameters})
    except CellExecutionError as error:
        return nb, error
    return nb, None


def output_text(nb) -> str:
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    return "".join(o.get("text", "") for o in outputs)


@pytest.fixture
def gsm8k_directory(tmp_path):
    with open(ROOT / "tests" / "data" / "gsm8k_tiny.jsonl") as f:
        records = [json.loads(line) for line in f if line.strip()]
    data = tmp_path / "gsm8k"
    data.mkdir()
    for split, rows in (("train", records[:32]), ("test", records[32:])):
        with open(data / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return data, records


def test_notebook_executes(tmp_path, gsm8k_directory):
    data, records = gsm8k_directory
    model = tmp_path / "tiny-qwen2"
    write_tiny_bpe_qwen2(model, [r["question"] + "\n" + r["answer"] for r in records])
    site = tmp_path / "site"
    site.mkdir()
    # Without build isolation pip builds with this environment's setuptools, offline; an
    # environment without setuptools (Python 3.12+ venvs) lets pip fetch it. Otherwise pip
    # needs no index: no dependencies, a local source.
    if importlib.util.find_spec("setuptools"):
        offline = "--no-build-isolation --no-index --disable-pip-version-check"
    else:
        offline = "--disable-pip-version-check"
    work = tmp_path / "work"
    nb, error = run_notebook(
        REPLAX_SOURCE=str(ROOT),
        REPLAX_PIP_OPTIONS=f"--no-deps {offline} --target={site}",
        PYTHONPATH=str(site),
        REPLAX_MODEL=str(model),
        REPLAX_DATA=str(data),
        REPLAX_WORK=str(work),
        REPLAX_ALLOW_CPU="1",
        # R = 2 x 4, B = 16, N = 32, 4 steps, evaluations on 8 prompts at steps 2 and 4.
        REPLAX_STEPS="4",
        REPLAX_PROMPTS_PER_STEP="2",
        REPLAX_GROUP_SIZE="4",
        REPLAX_BATCH_SIZE="16",
        REPLAX_CAPACITY="32",
        REPLAX_MAX_NEW_TOKENS="16",
        REPLAX_EVAL_EVERY="2",
        REPLAX_EVAL_PROMPTS="8",
        REPLAX_OVERRIDES=CPU_OVERRIDES,
    )
    text = output_text(nb)
    assert error is None, f"{error}\n{text[-3000:]}"

    # The %pip cell installed the checkout (its configs included), and the notebook ran
    # that copy, not this environment's replax.
    assert f"replax from {site / 'replax'}" in text, text[:3000]
    assert (site / "replax" / "configs" / "gsm8k.py").is_file()
    # Nothing was downloaded: the model is the local directory, the data the local files,
    # and the source was copied under WORK.
    assert f"model {model}" in text and f"data {data}" in text
    assert (work / "replax" / "setup.py").is_file() and not (work / "models").exists()
    # The run's summary, and the plot of held-out accuracy against generated tokens.
    assert "'final_accuracy'" in text and "'base_accuracy'" in text, text[-2000:]
    assert "generated tokens" in text and "accuracy " in text
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    metrics = [json.loads(line) for line in open(work / "run" / "metrics.jsonl")]
    assert [m["step"] for m in metrics if "eval_accuracy" in m] == [2, 4]
    # The completions cell: the latest evaluation's samples, or where they will appear.
    samples = work / "run" / "samples.jsonl"
    if samples.is_file():
        latest = max(json.loads(line)["step"] for line in open(samples) if line.strip())
        assert f"step {latest}, reward" in text and "completion:" in text
    else:
        assert "it appears at the first evaluation" in text


def test_notebook_stops_without_a_source_or_an_accelerator(tmp_path, monkeypatch):
    """With REPLAX_SOURCE unset the install stops, saying what to set; on a CPU runtime
    (ALLOW_CPU unset) the backend check stops, saying how to switch to a TPU."""
    for name in ("REPLAX_SOURCE", "REPLAX_ALLOW_CPU"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REPLAX_WORK", str(tmp_path / "work"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    source_cell = next(c for c in cells if "REQUIREMENT =" in c.source)
    backend_cell = next(c for c in cells if "jax.default_backend()" in c.source)
    client = NotebookClient(nb, timeout=120, kernel_name="python3")
    errors = []
    with client.setup_kernel():
        client.execute_cell(cells[0], nb.cells.index(cells[0]))  # the parameters
        for cell in (source_cell, backend_cell):
            with pytest.raises(CellExecutionError) as error:
                client.execute_cell(cell, nb.cells.index(cell))
            errors.append((error.value.ename, error.value.evalue))
    assert errors[0][0] == "ValueError" and errors[0][1].startswith("set REPLAX_SOURCE to")
    assert errors[1][0] == "RuntimeError" and errors[1][1].startswith("JAX sees no TPU")
    assert "Runtime > Change runtime type > TPU" in errors[1][1]
