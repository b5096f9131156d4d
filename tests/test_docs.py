"""Tests of the documentation itself: docs/ and README.md speak of the project only (no
paths outside the repository, no issue-tracker numbers), and docs/README.md indexes every
page of docs/."""

import pathlib
import re

import pytest

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
