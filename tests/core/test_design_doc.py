"""docs/design.md is the design the code cites: every `design.md#<section>` in the repository
names one of its headings, and nothing cites a design file outside the repository."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator

from tests.conftest import ROOT, markdown_sections

DESIGN = ROOT / "docs" / "design.md"
REFERENCE = re.compile(r"design\.md#([\w-]+)")
SELF_REFERENCE = re.compile(r"\]\(#([\w-]+)\)")
# The design notes this document replaced lived outside the repository under this name.
OUTSIDE = "DESIGN" + ".md"
SKIP_DIRS = {".git", "__pycache__", "fixtures", "golden", "node_modules"}
TEXT = {".py", ".md", ".yaml", ".yml", ".json", ".sh", ".toml", ".tmpl", ".txt", ".cfg", ""}


def _texts() -> Iterator[tuple[Path, str]]:
    """Every text file of the checkout that people read or code runs, fixtures excepted."""
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            path = Path(top, name)
            if path.suffix in TEXT and not path.is_symlink():
                yield path, path.read_text(encoding="utf-8", errors="replace")


def test_design_has_the_sections_the_issue_asks_for() -> None:
    assert {"the-decision-tree", "architecture", "naming-conventions", "metric-names",
            "labels", "alert-names", "budgets"} <= set(markdown_sections(DESIGN))


def test_every_design_anchor_names_a_heading() -> None:
    anchors = set(markdown_sections(DESIGN))
    cited = {(path.relative_to(ROOT).as_posix(), anchor)
             for path, text in _texts() for anchor in REFERENCE.findall(text)}
    cited |= {("docs/design.md", anchor) for anchor in SELF_REFERENCE.findall(DESIGN.read_text())}
    assert len(cited) > 20, "the scan found too few references: is it reading the checkout?"
    broken = sorted(ref for ref in cited if ref[1] not in anchors)
    assert not broken, f"design.md has no heading for: {broken}"


def test_nothing_cites_a_design_file_outside_the_repository() -> None:
    stale = sorted(path.relative_to(ROOT).as_posix() for path, text in _texts()
                   if OUTSIDE in text and path != Path(__file__))
    assert not stale, f"{OUTSIDE} is not in the repository; cite docs/design.md#<section>: {stale}"
