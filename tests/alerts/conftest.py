"""Fixtures for the alert tests: the rendered rules as data, and a live Alertmanager."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from alert_helpers import Alertmanager
from alerts import render


@pytest.fixture(scope="session")
def rendered() -> render.Rendered:
    return render.render(render.load_thresholds())


@pytest.fixture(scope="session")
def alert_rules(rendered: render.Rendered) -> list[dict]:
    return [rule for content in rendered.files.values() for group in content["groups"]
            for rule in group["rules"] if "alert" in rule]


@pytest.fixture(scope="session")
def recording_rules(rendered: render.Rendered) -> list[dict]:
    return [rule for content in rendered.files.values() for group in content["groups"]
            for rule in group["rules"] if "record" in rule]


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    manager = Alertmanager(tmp_path)
    try:
        manager.wait_ready()
        yield manager
    finally:
        manager.stop()
