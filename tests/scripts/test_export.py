"""Tests for scripts/export.py that need no run: what it says when the `hf` extra is not
installed (the README's plain `pip install -e .`)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

# scripts/export.py run as `python scripts/export.py ...` would be, with safetensors made
# unimportable (None in sys.modules: `import safetensors` raises ImportError).
WITHOUT_SAFETENSORS = """
import runpy, sys
sys.modules["safetensors"] = None
sys.modules["safetensors.numpy"] = None
sys.argv = ["scripts/export.py", *sys.argv[1:]]
runpy.run_path("scripts/export.py", run_name="__main__")
"""


def test_export_without_the_hf_extra_names_it_in_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "export"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT_SAFETENSORS,
            f"--workdir={tmp_path / 'run'}",
            f"--out={out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "safetensors" in lines[0] and "pip install -e '.[hf]'" in lines[0]
    assert not out.exists()
