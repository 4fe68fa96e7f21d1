"""The shape of a diagnosis: checks with evidence, grouped into the branches of the tree.

One model for every way a diagnosis is produced (the daemon's ring of snapshots, two scrapes of
/metrics, a Prometheus server) and served (`llmmon diagnose`, `--json`, /api/v1/diagnose), so a
report looks the same wherever it comes from.  docs/diagnose.schema.json is generated from these
classes; `SCHEMA` changes whenever a field is renamed or removed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SCHEMA = "llmmon.diagnose/v1"
Verdict = Literal["ok", "suspect", "unknown"]
# A branch or a report is as bad as its worst part; "unknown" only when nothing could be judged.
_RANK = {"unknown": 0, "ok": 1, "suspect": 2}


@dataclass(frozen=True)
class Evidence:
    """One observation behind a verdict: what it is about, in words, and its numbers."""

    subject: dict[str, str]  # join labels: gpu/uuid, job_id/rank/pg, device/port, netdev, node
    text: str
    values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """What a check function decides; the tree adds the check's identity to it."""

    verdict: Verdict
    summary: str
    evidence: tuple[Evidence, ...] = ()
    alert: str = ""  # of the check's alerts, the one whose condition was found (its runbook)


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    verdict: Verdict
    summary: str
    alerts: tuple[str, ...]  # the shipped alerts that page on the same condition
    runbook: str
    thresholds: dict[str, Any]
    evidence: tuple[Evidence, ...]


@dataclass(frozen=True)
class Branch:
    id: str
    title: str
    question: str
    verdict: Verdict
    summary: str
    runbook: str
    checks: tuple[Check, ...]


@dataclass(frozen=True)
class Source:
    kind: Literal["daemon", "scrape", "prometheus"]
    url: str
    scope: Literal["node", "cluster"]
    observations: int  # snapshots in the local window (0 for Prometheus)
    window_seconds: float  # span the rates were computed over (Prometheus: the range used)


@dataclass(frozen=True)
class Report:
    schema: str
    generated_at: float
    source: Source
    verdict: Verdict
    suspects: tuple[str, ...]  # "<branch>.<check>" of every suspect check, in tree order
    branches: tuple[Branch, ...]

    def as_json(self) -> dict[str, Any]:
        """Plain JSON values (lists, not tuples): what /api/v1/diagnose and --json print."""
        return json.loads(json.dumps(asdict(self)))


def ok(summary: str, *evidence: Evidence) -> Outcome:
    return Outcome("ok", summary, evidence)


def suspect(summary: str, *evidence: Evidence, alert: str = "") -> Outcome:
    return Outcome("suspect", summary, evidence, alert)


def unknown(summary: str, *evidence: Evidence) -> Outcome:
    return Outcome("unknown", summary, evidence)


def worst(verdicts: list[Verdict]) -> Verdict:
    return max(verdicts, key=_RANK.__getitem__, default="unknown")
