"""Tests for replax/tools/report.py: table cells, markdown tables, JSON without NaN, the
report files of a study."""

import json
import math

import numpy as np

from replax.tools import report


def test_cells_say_never_for_a_missing_or_infinite_figure():
    assert report.fmt(None) == report.fmt(math.inf) == "never"
    assert report.fmt(0.5377, "pct") == "53.8%"
    assert report.fmt(121346.4, "int") == "121,346"
    assert report.fmt(3e-6, "lr") == "3e-06"
    assert report.fmt(0.123456) == "0.123"


def test_markdown_table_has_a_header_rule_and_one_line_per_row():
    text = report.markdown_table(["a", "b"], [[1, "x"], [2, "y"]])
    assert text.splitlines() == ["| a | b |", "|---|---|", "| 1 | x |", "| 2 | y |"]


def test_write_json_turns_numpy_and_non_finite_values_into_plain_json(tmp_path):
    path = str(tmp_path / "out.json")
    report.write_json(path, {"a": np.float32(0.5), "b": [np.int64(3), math.nan], "c": (1,)})
    with open(path) as f:
        assert json.load(f) == {"a": 0.5, "b": [3, None], "c": [1]}
    assert not (tmp_path / "out.json.tmp").exists()  # written whole, then renamed


def test_write_report_writes_json_plot_and_markdown_with_the_command(tmp_path, capsys):
    plotted = []
    payload = {"figure": 1}
    report.write_report(
        str(tmp_path), "compare", payload, "| x |\n", plotted.append, ["--seeds=3"], 0.0, None
    )
    with open(tmp_path / "compare.json") as f:
        saved = json.load(f)
    assert saved["figure"] == 1 and saved["command"].endswith("scripts/compare.py --seeds=3")
    assert saved["machine"]["cpu_count"] >= 1 and saved["wall_s"] > 0
    assert plotted == [str(tmp_path / "compare.png")]
    assert (tmp_path / "compare.md").read_text() == "| x |\n"
    assert "| x |" in capsys.readouterr().out
