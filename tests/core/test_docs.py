"""Generated references must match the code, and every exported family must be documented."""

from __future__ import annotations

from llmmon import catalog, docsgen
from tests.conftest import ROOT


def test_generated_docs_are_current() -> None:
    for what, filename in docsgen.FILES.items():
        committed = (ROOT / "docs" / filename).read_text(encoding="utf-8")
        assert committed == docsgen.RENDERERS[what](), \
            f"docs/{filename} is stale: run python -m llmmon.docsgen"


def test_metric_names_are_unique() -> None:
    names = [spec.name for spec in catalog.all_specs()]
    assert len(names) == len(set(names))
