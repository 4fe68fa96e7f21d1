"""Every test a document names exists where it says: docs cite tests as evidence, and a test
moved or renamed must not leave a citation that points nowhere."""

from __future__ import annotations

import re

from tests.conftest import ROOT

CITATION = re.compile(r"(tests/[\w/]+\.py)(?:::(\w+))?")


def test_every_cited_test_file_and_function_exists() -> None:
    pages = [*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md")]
    missing = []
    for page in pages:
        for match in CITATION.finditer(page.read_text(encoding="utf-8")):
            path, name = ROOT / match.group(1), match.group(2)
            if not path.is_file() or (name and f"def {name}(" not in path.read_text()):
                missing.append(f"{page.relative_to(ROOT)}: {match.group(0)}")
    assert len(pages) > 10
    assert not missing, "cited tests that do not exist:\n" + "\n".join(sorted(set(missing)))
