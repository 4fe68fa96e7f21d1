"""The alert thresholds of alerts/config.yaml, so panels draw the levels the alerts fire at.

Reading them here instead of repeating the numbers keeps dashboards and alerts in step: a
changed threshold changes the generated JSON, and the drift test asks for a regeneration.
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

CONFIG = Path(__file__).resolve().parents[2] / "alerts" / "config.yaml"


@functools.cache
def _values() -> dict[str, object]:
    with open(CONFIG, encoding="utf-8") as handle:
        return {name: entry["value"] for name, entry in yaml.safe_load(handle).items()}


def get(name: str) -> float:
    """A numeric threshold by its alerts/config.yaml name, e.g. get("mfu_low") -> 0.3."""
    return float(_values()[name])  # type: ignore[arg-type]


def text(name: str) -> str:
    """A regex or selector by its alerts/config.yaml name, e.g. text("tcp_netdev_selector")."""
    return str(_values()[name])
