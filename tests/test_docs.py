"""Tests of the documentation itself: docs/ and README.md speak of the project only (no
paths outside the repository, no issue-tracker numbers), and docs/README.md indexes every
page of docs/."""

import pathlib
import re

import pytest
from micro_run import MICRO_OVERRIDES

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

# A file outside the checkout (../shared/design.md), or an issue by its number ("issue #25",
# "Issue #16's", "(issue 25)", "#25" in a link anchor "...-issue-25").
OUTSIDE = re.compile(r"\.\./shared|(?i:\bissues?\s*#?\d+\b|\bissue-\d+\b)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_cite_nothing_outside_the_repository(page):
    found = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_pattern_finds_what_it_is_for():
    for text in ("(../shared/paper.md)", "issue #25", "Issue #16's", "rates-issue-25)"):
        assert OUTSIDE.search(text), text
    for text in ("the issues a run can hit", "/mnt/shared/runs", "issued from two threads"):
        assert not OUTSIDE.search(text), text


def test_docs_readme_lists_every_page_with_what_it_answers():
    index = (ROOT / "docs" / "README.md").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    assert pages
    # One list item per page: a link to it and a line on the question it answers.
    items = re.findall(r"^- \[[^\]]+\]\(([^)]+)\)\s*[:-]+\s*(\S.*)$", index, re.MULTILINE)
    listed = {link for link, _ in items}
    missing = [page for page in pages if page not in listed]
    assert not missing, f"docs/README.md does not list {missing}"
    assert not listed - set(pages), f"docs/README.md lists pages that do not exist: {listed}"


def test_readme_and_the_main_config_give_the_main_job_the_same_time():
    """The README's first command and configs/arith.py's docstring state one figure for the
    main job's time, on the same hardware, and both say that load makes it slower."""
    readme = (ROOT / "README.md").read_text().split("\n\n")[1]  # the first command's line
    config = (ROOT / "configs" / "arith.py").read_text().split('"""')[1]
    config = " ".join(config.split())
    figures = []
    for text in (readme, config):
        match = re.search(r"about (\d+) minutes", text)
        assert match, text
        figures.append(match.group(1))
        assert "2 free CPU cores" in " ".join(text.split()), text
        assert "slower" in text, text
    assert figures[0] == figures[1], figures


def readme_quick_start() -> str:
    """The code block of README.md's "Python quick start" section (indented 4 spaces)."""
    section = (ROOT / "README.md").read_text().split("## Python quick start\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    lines, started = [], False
    for line in section.splitlines():
        if line.startswith("    "):
            started = True
            lines.append(line[4:])
        elif started and line.strip():
            break
        elif started:
            lines.append("")
    return "\n".join(lines).strip() + "\n"


# What makes the quick start tiny here (a test runs it): the micro policy of
# tests/micro_run.py, no warm start, 4 steps. Applied to the config as spec.parse sees it,
# after the README's own overrides.
TINY = {**MICRO_OVERRIDES, "eval.every": 2, "checkpoint_every": 4, "total_steps": 4}


def test_the_readme_python_quick_start_runs(tmp_path, monkeypatch, capsys):
    from replax.config import spec
    from replax.tools import experiments

    code = readme_quick_start()
    assert "spec.parse(" in code and "trainer.train(" in code and "read_metrics(" in code
    parse = spec.parse

    def tiny_parse(config):
        for key, value in TINY.items():
            experiments.set_value(config, key, value)
        return parse(config)

    monkeypatch.setattr(spec, "parse", tiny_parse)
    monkeypatch.chdir(ROOT)  # configs/arith.py, as in the repository root
    workdir = str(tmp_path / "quickstart")
    exec(compile(code.replace('"runs/quickstart"', repr(workdir)), "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("accuracy ") and " -> " in line for line in out), out
    # The evaluation steps, read back from metrics.jsonl: step, accuracy, entropy.
    assert [line.split()[0] for line in out if line[:1].isdigit()] == ["2", "4"], out


def test_the_readme_quick_start_says_what_its_steps_give():
    """A newcomer who sees the accuracy barely move is told, beside the code, that this is
    what its number of steps gives: the prose names the steps the code sets and a line of
    what the code prints."""
    section = (ROOT / "README.md").read_text().split("## Python quick start\n", 1)[1]
    prose = "\n".join(
        line for line in section.split("\n## ", 1)[0].splitlines() if line[:4] != "    "
    )
    (steps,) = re.findall(r"config\.total_steps = (\d+)", readme_quick_start())
    assert re.search(rf"\b{steps} steps\b.*\n?.*`accuracy \d\.\d{{3}} -> \d\.\d{{3}}`", prose), (
        prose
    )


def test_the_readme_is_a_guide_not_a_notebook():
    """README.md stays short (studies and long tables live in docs/): at most 250 lines."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"
