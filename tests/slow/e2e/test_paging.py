"""Every scenario pages once, correctly, and nothing else pages (conftest.py: the stack).

For each scenario: its critical alerts reach the pager with the right job, rank, node, GPU or
port in their labels and description; its warnings reach the tickets receiver; the alerts
the shipped inhibit rules must mute are firing in Alertmanager but suppressed; no other
critical alert about its node or job pages; and `llmmon diagnose` over the same Prometheus
finds the same cause (a suspect check that pages with the scenario's first alert, naming the
same node or job and target).  The healthy node runs last, once every other scenario has
paged: it must have paged nothing, and diagnosing it on its own finds nothing suspect.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import pytest

from llmmon.diagnose import command
from llmmon.diagnose.branches import TREE

from tests.helpers import wait_for
from tests.slow.e2e.cases import CASES, WARMUP_TICKETS, Case, Expect
from tests.slow.e2e.conftest import Alert, Stack


# From the stack being up: the starvation's 5-minute rates need ~2 minutes of it (the hang, 30 s
# without progress at this module's window, comes sooner), plus `for`, evaluation and delivery,
# on a 2-core machine busy with ten exporters.  (Unchanged since the hang's 180 s window.)
DEADLINE = 300.0


def _matches(labels: dict[str, str], expect: Expect, e2e: Stack, case: Case) -> bool:
    layout = e2e.node(case)
    return labels.get("alertname") == expect.alertname and all(
        labels.get(key) == (value(layout) if callable(value) else value)
        for key, value in expect.labels.items())


def _firing(e2e: Stack, case: Case, expect: Expect, receiver: str) -> Alert | None:
    return next((a for a in e2e.about(case) if a.receiver == receiver and a.status == "firing"
                 and _matches(a.labels, expect, e2e, case)), None)


def _suppressed(e2e: Stack, case: Case, expect: Expect) -> dict | None:
    node, job = e2e.node(case).name, e2e.job(case)
    return next((a for a in e2e.suppressed()
                 if node in (a["labels"].get("node"), None) or a["labels"].get("job_id") == job
                 if _matches(a["labels"], expect, e2e, case)), None)


def diagnose(e2e: Stack, **source: Any) -> dict[str, Any]:
    """`llmmon diagnose --json --alerts-config` (the thresholds the stack's rules have) over
    `source` (prometheus=URL, or url=daemon with scrape)."""
    args = argparse.Namespace(**{"prometheus": None, "url": None, "scrape": False,
                                 "interval": 5.0, "alerts_config": e2e.alerts_config,
                                 "json": True, **source})
    for branch in TREE:
        setattr(args, f"tree_{branch.id}", False)
    return command.report(args)


def _diagnosed(e2e: Stack, case: Case, expect: Expect) -> bool:
    """A suspect check that pages with `expect` names the case's node or job and target."""
    node, job = e2e.node(case).name, e2e.job(case)
    layout = e2e.node(case)
    wanted = {key: value(layout) if callable(value) else value
              for key, value in expect.labels.items()}
    for branch in diagnose(e2e, prometheus=e2e.prometheus.url)["branches"]:
        for check in branch["checks"]:
            if check["verdict"] != "suspect" or expect.alertname not in check["alerts"]:
                continue
            for evidence in check["evidence"]:
                subject = evidence["subject"]
                if node not in (subject.get("node"), None) or \
                        subject.get("job_id", job) != job:
                    continue
                if "node" in subject or "job_id" in subject:
                    if all(subject[k] == v for k, v in wanted.items() if k in subject):
                        return True
    return False


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_scenario_pages_its_alerts_and_nothing_else(e2e: Stack, case: Case) -> None:
    deadline = e2e.started + DEADLINE
    node, job = e2e.node(case).name, e2e.job(case)
    for receiver, expected in (("pager", case.pages), ("tickets", case.tickets)):
        for expect in expected:
            alert = wait_for(lambda: _firing(e2e, case, expect, receiver),
                             deadline - time.monotonic(),
                             f"{case.name}: {expect.alertname} {expect.labels} at {receiver}",
                             interval=0.5)
            assert alert.labels.get("node", node) == node
            assert alert.labels.get("job_id", job) == job
            for snippet in expect.evidence:
                text = snippet.format(node=node, job=job)
                assert text in alert.annotations["description"], \
                    f"{expect.alertname}: {text!r} not in {alert.annotations['description']!r}"
    for expect in case.inhibited:
        wait_for(lambda: _suppressed(e2e, case, expect), deadline - time.monotonic(),
                 f"{case.name}: {expect.alertname} {expect.labels} inhibited", interval=0.5)

    about = e2e.about(case)
    pages = {a.labels["alertname"] for a in about if a.receiver == "pager"}
    assert pages <= {e.alertname for e in case.pages}, f"{case.name} paged {pages}"
    if case.name == "healthy":
        tickets = {a.labels["alertname"] for a in about if a.receiver == "tickets"}
        assert tickets <= WARMUP_TICKETS, f"healthy ticketed {tickets}"
        node_url = next(n["url"] for n in e2e.daemons() if n["node"] == node)
        # The healthy job's MFU is 0.42 (the threshold 0.3). Between two scrapes 30 s apart
        # lie ~16 steps of 1.9 s, of which a loaded machine's lag (the simulator's tick, the
        # ranks collector's interval) can hide ~2: 0.35 at worst (10 s apart read 0.24).
        assert diagnose(e2e, url=node_url, scrape=True, interval=30.0)["suspects"] == []
    else:
        cause = (case.pages + case.tickets)[0]
        wait_for(lambda: _diagnosed(e2e, case, cause), deadline - time.monotonic(),
                 f"{case.name}: llmmon diagnose naming {cause.alertname} {cause.labels}",
                 interval=0.5)
