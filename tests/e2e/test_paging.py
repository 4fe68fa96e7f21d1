"""Every scenario pages once, correctly, and nothing else pages (tests/e2e/conftest.py: the stack).

For each scenario: its critical alerts reach the pager with the right job, rank, node, GPU or
port in their labels and description; its warnings reach the tickets receiver; the alerts
the shipped inhibit rules must mute are firing in Alertmanager but suppressed; and no other
critical alert about its node or job pages.  The healthy node runs last, once every other
scenario has paged, and must have paged nothing.
"""

from __future__ import annotations

import pytest

from tests.e2e.cases import CASES, WARMUP_TICKETS, Case, Expect
from tests.e2e.conftest import Alert, Stack, wait_for

# From the simulator's start: the hang needs 180 s without progress (the shipped window),
# plus `for`, evaluation and delivery, on a 2-core machine busy with eleven exporters.
DEADLINE = 330.0


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
    return next((a for a in e2e.alertmanager_alerts()
                 if node in (a["labels"].get("node"), None) or a["labels"].get("job_id") == job
                 if _matches(a["labels"], expect, e2e, case)
                 and a["status"]["state"] == "suppressed" and a["status"]["inhibitedBy"]),
                None)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_scenario_pages_its_alerts_and_nothing_else(e2e: Stack, case: Case) -> None:
    deadline = e2e.started + DEADLINE
    node, job = e2e.node(case).name, e2e.job(case)
    for receiver, expected in (("pager", case.pages), ("tickets", case.tickets)):
        for expect in expected:
            alert = wait_for(f"{case.name}: {expect.alertname} {expect.labels} at {receiver}",
                             lambda: _firing(e2e, case, expect, receiver), deadline)
            assert alert.labels.get("node", node) == node
            assert alert.labels.get("job_id", job) == job
            for snippet in expect.evidence:
                text = snippet.format(node=node, job=job)
                assert text in alert.annotations["description"], \
                    f"{expect.alertname}: {text!r} not in {alert.annotations['description']!r}"
    for expect in case.inhibited:
        wait_for(f"{case.name}: {expect.alertname} {expect.labels} inhibited",
                 lambda: _suppressed(e2e, case, expect), deadline)

    about = e2e.about(case)
    pages = {a.labels["alertname"] for a in about if a.receiver == "pager"}
    assert pages <= {e.alertname for e in case.pages}, f"{case.name} paged {pages}"
    if case.name == "healthy":
        tickets = {a.labels["alertname"] for a in about if a.receiver == "tickets"}
        assert tickets <= WARMUP_TICKETS, f"healthy ticketed {tickets}"
