"""The Colab notebook runs top to bottom on the CPU: REPLAX_NOTEBOOK_SMOKE=1 swaps the
downloads for a tiny random Qwen2-architecture checkpoint and tests/data/gsm8k_tiny.jsonl,
and shortens the run; the config, the trainer.train call and the plot are the Colab ones."""

import os

import nbformat
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_notebook_executes(monkeypatch):
    monkeypatch.setenv("REPLAX_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("REPLAX_ROOT", ROOT)
    path = os.path.join(ROOT, "notebooks", "replax_colab.ipynb")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}},
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    # The run's summary, and the plot of held-out accuracy against generated tokens.
    assert "'final_accuracy'" in text and "'base_accuracy'" in text, text[-2000:]
    assert "generated tokens" in text and "accuracy " in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    # Nothing was downloaded: the stand-in checkpoint is a Hugging Face directory.
    assert "tiny-qwen2" in text
