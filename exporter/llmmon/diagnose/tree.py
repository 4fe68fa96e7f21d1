"""The decision tree (docs/design.md#the-decision-tree) as data: branches in the order an SRE
walks them, each a list of checks; `evaluate` runs them over a `View` and assembles the report.

A check is a function of the view and the thresholds that returns an `Outcome`; its identity,
the alerts that page on the same condition and the thresholds it uses are declared beside it, so
the runbook links and the JSON are filled in one place.  A check that breaks on odd data becomes
`unknown` with the error; it never takes the other checks down.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from llmmon.diagnose.model import SCHEMA, Branch, Check, Outcome, Report, Source, unknown, \
    worst
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.view import QueryError, View

log = logging.getLogger("llmmon.diagnose")

NEEDS_RATES = ("needs two observations to compute rates (the daemon has one so far; "
               "try again in a few seconds)")


@dataclass(frozen=True)
class CheckSpec:
    id: str
    title: str
    run: Callable[[View, Thresholds], Outcome]
    alerts: tuple[str, ...] = ()  # alerts on the same condition; the first gives the runbook
    # unless the check has a `doc` section
    thresholds: tuple[str, ...] = ()
    doc: str = ""  # docs/diagnose.md anchor, for checks that no alert covers

    def runbook(self, thresholds: Thresholds, alert: str = "") -> str:
        """The runbook of `alert` (one of this check's), else the check's section of
        docs/diagnose.md where it has one, else the runbook of its first alert."""
        if alert:
            return thresholds.runbook(alert)
        if self.doc or not self.alerts:
            return thresholds.doc("diagnose.md", self.doc)
        return thresholds.runbook(self.alerts[0])


@dataclass(frozen=True)
class BranchSpec:
    id: str
    title: str
    question: str
    checks: tuple[CheckSpec, ...]


def _check(spec: CheckSpec, view: View, thresholds: Thresholds) -> Check:
    try:
        outcome = spec.run(view, thresholds)
    except QueryError:
        raise
    except Exception as exc:  # a check's bug or odd data must not hide the other verdicts
        log.exception("check %s failed", spec.id)
        outcome = unknown(f"check failed: {type(exc).__name__}: {exc}")
    assert not outcome.alert or outcome.alert in spec.alerts, (spec.id, outcome.alert)
    return Check(spec.id, spec.title, outcome.verdict, outcome.summary, spec.alerts,
                 spec.runbook(thresholds, outcome.alert),
                 {name: getattr(thresholds, name) for name in spec.thresholds},
                 outcome.evidence)


def _branch(spec: BranchSpec, view: View, thresholds: Thresholds) -> Branch:
    checks = tuple(_check(check, view, thresholds) for check in spec.checks)
    verdict = worst([c.verdict for c in checks])
    chosen = [c for c in checks if c.verdict == verdict]
    if verdict == "ok":
        unknowns = sum(c.verdict == "unknown" for c in checks)
        summary = f"{len(chosen)} of {len(checks)} checks ok" + (
            f", {unknowns} without data" if unknowns else "")
    else:
        summary = "; ".join(f"{c.title}: {c.summary}" for c in chosen)
    return Branch(spec.id, spec.title, spec.question, verdict, summary,
                  chosen[0].runbook, checks)


def evaluate(view: View, thresholds: Thresholds, branches: tuple[BranchSpec, ...],
             generated_at: float | None = None) -> Report:
    walked = tuple(_branch(spec, view, thresholds) for spec in branches)
    suspects = tuple(f"{b.id}.{c.id}" for b in walked for c in b.checks if c.verdict == "suspect")
    source = Source(view.kind, view.url, view.scope, view.observations,  # type: ignore[arg-type]
                    round(view.window_seconds, 3))
    return Report(SCHEMA, time.time() if generated_at is None else generated_at, source,
                  worst([b.verdict for b in walked]), suspects, walked)
