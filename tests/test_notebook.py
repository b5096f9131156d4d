"""The Colab notebook runs top to bottom on the CPU, every cell, with only its parameters
changed (through the REPLAX_* environment variables its first cell reads): replax as this
environment has it (the notebook finds it importable and installs nothing, so the test
never touches the environment's install), a tiny random Qwen2-architecture Hugging Face
directory for MODEL, the forty problems of tests/data/gsm8k_tiny.jsonl for DATA, a few
steps, ALLOW_CPU. The kernel runs in notebooks/, as Jupyter runs a notebook.

The install cell's other paths (a notebook in a checkout without replax installed; no
checkout and no REPLAX_SOURCE), the one-line stops and the TensorBoard cell's message run
cell by cell, with replax (or tensorboard) made unimportable in the kernel."""

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
    "model.dtype=float32 rollout.max_prompt_len=80 model.max_len=96 "
    "eval.pass_k=2 eval.pass_k_prompts=4 checkpoint_every=4"
)


def run_notebook(**parameters):
    """The notebook executed top to bottom with `parameters` added to the environment, and
    the error of the cell that failed (None if none did)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": NOTEBOOK.parent}}
    )
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


def test_notebook_executes(tmp_path, gsm8k_directory, monkeypatch):
    data, records = gsm8k_directory
    model = tmp_path / "tiny-qwen2"
    write_tiny_bpe_qwen2(model, [r["question"] + "\n" + r["answer"] for r in records])
    monkeypatch.delenv("REPLAX_SOURCE", raising=False)
    work = tmp_path / "work"
    nb, error = run_notebook(
        REPLAX_MODEL=str(model),
        REPLAX_DATA=str(data),
        REPLAX_WORK=str(work),
        REPLAX_ALLOW_CPU="1",
        REPLAX_TENSORBOARD="0",
        # R = 2 x 4, B = 16 in 2 microbatches, N = 32, 4 steps, evaluations on 8 prompts
        # at steps 2 and 4.
        REPLAX_STEPS="4",
        REPLAX_PROMPTS_PER_STEP="2",
        REPLAX_GROUP_SIZE="4",
        REPLAX_BATCH_SIZE="16",
        REPLAX_NUM_MICROBATCHES="2",
        REPLAX_CAPACITY="32",
        REPLAX_MAX_NEW_TOKENS="16",
        REPLAX_EVAL_EVERY="2",
        REPLAX_EVAL_PROMPTS="8",
        REPLAX_OVERRIDES=CPU_OVERRIDES,
    )
    text = output_text(nb)
    assert error is None, f"{error}\n{text[-3000:]}"

    # replax was importable: nothing installed, the notebook ran this environment's replax.
    installed = importlib.util.find_spec("replax").origin
    assert f"replax is already importable from {os.path.dirname(installed)}" in text, text[:3000]
    assert not [line for line in text.splitlines() if line.startswith("pip install")]
    assert "Successfully installed" not in text
    assert f"replax from {os.path.dirname(installed)}" in text
    # Nothing was downloaded: the model is the local directory, the data the local files.
    assert f"model {model}" in text and f"data {data}" in text
    assert not (work / "replax").exists() and not (work / "models").exists()
    assert "TensorBoard off" in text
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


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def cell_with(nb, text):
    return next(c for c in code_cells(nb) if text in c.source)


def stop_line(client, nb, cell) -> str:
    """The one line a cell stops with (no traceback)."""
    with pytest.raises(CellExecutionError) as error:
        client.execute_cell(cell, nb.cells.index(cell))
    assert error.value.ename == "Stop", (error.value.ename, error.value.evalue)
    (output,) = [o for o in cell.outputs if o.output_type == "error"]
    assert len(output.traceback) == 1, output.traceback
    return output.traceback[0]


def run_in_kernel(client, code: str) -> None:
    cell = nbformat.v4.new_code_cell(code)
    client.execute_cell(cell, 0)


def test_install_cell_installs_nothing_when_importable_else_the_checkout_else_says_how(
    tmp_path, monkeypatch
):
    """replax importable: nothing to install. Not importable (sys.modules says so in the
    kernel), the notebook in a checkout's notebooks/: that checkout, editable. Neither, and
    REPLAX_SOURCE unset: one line saying what to set, no traceback, nothing installed. The
    backend check stops with one line too, and the TensorBoard cell says what to install."""
    for name in ("REPLAX_SOURCE", "REPLAX_ALLOW_CPU", "REPLAX_TENSORBOARD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REPLAX_WORK", str(tmp_path / "work"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    parameters, source_cell = code_cells(nb)[0], cell_with(nb, "REQUIREMENT =")
    backend_cell = cell_with(nb, "jax.default_backend()")
    tensorboard_cell = cell_with(nb, "replax[tensorboard]")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": NOTEBOOK.parent}}
    )
    with client.setup_kernel():
        client.execute_cell(parameters, nb.cells.index(parameters))
        client.execute_cell(source_cell, nb.cells.index(source_cell))
        assert "replax is already importable from" in output_text_of(source_cell)
        run_in_kernel(client, "print('REQUIREMENT', REQUIREMENT)")
        # Not importable, in notebooks/ of this checkout.
        run_in_kernel(client, "import sys; sys.modules['replax'] = None")
        client.execute_cell(source_cell, nb.cells.index(source_cell))
        assert f"pip install -e {ROOT}[tpu,hf]" in output_text_of(source_cell)
        # Not importable, not in a checkout, no REPLAX_SOURCE.
        run_in_kernel(client, f"os.chdir({str(elsewhere)!r})")
        line = stop_line(client, nb, source_cell)
        assert line.startswith("replax is not installed: set REPLAX_SOURCE in the first cell")
        # No public URL yet: it says how to upload or mount a checkout.
        assert "upload a zip of a checkout" in line and "drive.mount('/content/drive')" in line
        assert not (tmp_path / "work" / "replax").exists()
        # A CPU runtime without ALLOW_CPU.
        run_in_kernel(client, "del sys.modules['replax']")
        line = stop_line(client, nb, backend_cell)
        assert line.startswith("JAX sees no TPU") and "Runtime > Change runtime type > TPU" in line
        # TensorBoard missing.
        run_in_kernel(client, "sys.modules['tensorboard'] = None")
        client.execute_cell(tensorboard_cell, nb.cells.index(tensorboard_cell))
        assert "pip install 'replax[tensorboard]'" in output_text_of(tensorboard_cell)


def output_text_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []))


def test_a_bad_setting_stops_the_run_cell_with_one_line(tmp_path, gsm8k_directory, monkeypatch):
    """A small run whose microbatches do not divide its batch (once a long traceback)."""
    data, records = gsm8k_directory
    model = tmp_path / "tiny-qwen2"
    write_tiny_bpe_qwen2(model, [r["question"] + "\n" + r["answer"] for r in records])
    for name, value in {
        "REPLAX_MODEL": str(model),
        "REPLAX_DATA": str(data),
        "REPLAX_WORK": str(tmp_path / "work"),
        "REPLAX_BATCH_SIZE": "16",
        "REPLAX_NUM_MICROBATCHES": "32",
    }.items():
        monkeypatch.setenv(name, value)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": NOTEBOOK.parent}}
    )
    with client.setup_kernel():
        for text in ("PARAMETERS =", "snapshot_download"):  # parameters, the policy and data
            cell = cell_with(nb, text)
            client.execute_cell(cell, nb.cells.index(cell))
        line = stop_line(client, nb, cell_with(nb, "trainer.train("))
    assert line.startswith("error: train.num_microbatches=32: must divide train.batch_size=16"), (
        line
    )
    assert not (tmp_path / "work" / "run").exists()


def test_the_workdir_goes_on_drive_when_drive_is_mounted(tmp_path, monkeypatch):
    """WORK left empty: under a mounted Drive (it outlives the runtime), else on the local
    disk, each said in a line; a WORK the user set is kept."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    parameters = code_cells(nb)[0].source
    monkeypatch.delenv("REPLAX_WORK", raising=False)
    drive = tmp_path / "MyDrive"
    drive.mkdir()
    monkeypatch.setenv("REPLAX_DRIVE_ROOT", str(drive))
    scope = {}
    exec(parameters, scope)  # noqa: S102 - the notebook's own first cell
    assert scope["WORK"] == str(drive / "replax_runs")
    monkeypatch.setenv("REPLAX_DRIVE_ROOT", str(tmp_path / "not_mounted"))
    scope = {}
    exec(parameters, scope)  # noqa: S102
    assert scope["WORK"] != str(drive / "replax_runs") and scope["WORK"].endswith("replax_runs")
    monkeypatch.setenv("REPLAX_WORK", str(tmp_path / "mine"))
    monkeypatch.setenv("REPLAX_DRIVE_ROOT", str(drive))
    scope = {}
    exec(parameters, scope)  # noqa: S102
    assert scope["WORK"] == str(tmp_path / "mine")
