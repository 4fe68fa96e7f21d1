"""Fixtures for the alert tests: the rendered rules as data."""

from __future__ import annotations

import pytest

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
