"""Every generated, committed file is what its generator makes; one command refreshes them all."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import ROOT
from tools import generate


def test_every_generated_file_is_current() -> None:
    stale = generate.stale()
    assert not stale, (f"stale generated files; run `{generate.COMMAND}` and commit:\n"
                       + "\n".join(str(output) for output in stale))


def test_the_check_names_each_stale_file_and_the_refresh_mends_it(tmp_path: Path) -> None:
    """On a copy: an edited rule file and a missing schema are named with their generators; the
    deploy/ copy made from the rules is judged against the rules as they should be, not as
    edited, so it is not named."""
    for folder in ("alerts", "dashboards", "deploy", "docs"):
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    edited = Path("alerts/rules/alerts.yaml")
    text = (tmp_path / edited).read_text(encoding="utf-8")
    (tmp_path / edited).write_text(text.replace("severity: critical", "severity: info", 1),
                                   encoding="utf-8")
    missing = Path("docs/diagnose.schema.json")
    (tmp_path / missing).unlink()
    stale = generate.stale(tmp_path)
    assert [(output.path, output.generator) for output in stale] == [
        (missing, f"python -m llmmon.diagnose.schema > {missing}"),
        (edited, "python -m alerts.render"),
    ]
    assert generate.refresh(tmp_path) == stale
    assert generate.stale(tmp_path) == []
