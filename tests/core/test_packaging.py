"""Packaging: every package folder is shipped under its import name, and the two distributions
(the node daemon's `llmmon`, the trainer side's `llmmon-reporter`) agree on their version."""

from __future__ import annotations

import tomllib

import llmmon
import llmmon_reporter
from tests.conftest import ROOT


def _project(path: str) -> dict:
    return tomllib.loads((ROOT / path).read_text())


def test_every_package_folder_is_listed_under_its_import_name() -> None:
    setuptools = _project("pyproject.toml")["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for name, folder in setuptools["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            relative = init.parent.relative_to(base).parts
            found.add(".".join((name, *relative)))
    assert listed == found


def test_the_start_up_hook_ships_in_both_distributions() -> None:
    for path in ("pyproject.toml", "reporter/pyproject.toml"):
        data = _project(path)["tool"]["setuptools"]["package-data"]
        assert data["llmmon_reporter"] == ["boot/sitecustomize.py"], path


def test_the_daemon_and_the_reporter_distributions_share_one_version() -> None:
    daemon, reporter = _project("pyproject.toml"), _project("reporter/pyproject.toml")
    assert daemon["project"]["version"] == reporter["project"]["version"] == \
        llmmon.__version__ == llmmon_reporter.__version__
    assert reporter["project"]["dependencies"] == []
