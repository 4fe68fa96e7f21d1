"""Generates the llmmon Grafana dashboards with grafana-foundation-sdk.

One builder module per dashboard (wall, node, job, triage) over shared helpers in `panels` and
`common`. `python -m dashboards.generator` writes `dashboards/<uid>.json`; `--check` fails when
the committed files differ from what the builders produce.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from dashboards.generator import job, node, triage, wall
from dashboards.generator.common import UIDS, render

OUTPUT = Path(__file__).resolve().parent.parent
BUILDERS: dict[str, Callable[[], dict]] = {
    UIDS["wall"]: wall.dashboard,
    UIDS["node"]: node.dashboard,
    UIDS["job"]: job.dashboard,
    UIDS["triage"]: triage.dashboard,
}


def generate() -> dict[Path, str]:
    """Every dashboard's committed path and its JSON text."""
    return {OUTPUT / f"{uid}.json": render(build()) for uid, build in BUILDERS.items()}
