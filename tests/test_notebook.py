"""The Colab notebook runs top to bottom on the CPU (tiny settings)."""

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
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    assert "replay {" in outputs and "onpolicy {" in outputs
    assert "final_accuracy" in outputs
