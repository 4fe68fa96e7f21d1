"""Fixtures for the dashboard tests: the committed dashboards, their panels and queries."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Panel:
    dashboard: str
    model: dict

    @property
    def name(self) -> str:
        return f"{self.dashboard} / {self.model.get('title', '?')}"


@dataclass(frozen=True)
class Target:
    panel: Panel
    ref: str
    expr: str

    @property
    def name(self) -> str:
        return f"{self.panel.name} [{self.ref}]"


def _walk(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        yield from _walk(panel.get("panels", []))  # a collapsed row keeps its panels inside


@pytest.fixture(scope="session")
def dashboards() -> dict[str, dict]:
    """Committed dashboards by file stem (which must be their uid)."""
    return {path.stem: json.loads(path.read_text(encoding="utf-8"))
            for path in sorted((ROOT / "dashboards").glob("*.json"))}


@pytest.fixture(scope="session")
def panels(dashboards: dict[str, dict]) -> list[Panel]:
    return [Panel(uid, panel) for uid, model in dashboards.items()
            for panel in _walk(model["panels"])]


@pytest.fixture(scope="session")
def targets(panels: list[Panel]) -> list[Target]:
    return [Target(panel, target["refId"], target["expr"])
            for panel in panels for target in panel.model.get("targets", [])]
