"""The shipped rules through Prometheus' own promtool: lint, and the unit tests in promtool/."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from alerts import render
from alerts.render import INCIDENT_ALERTS
from tests.alerts.alert_helpers import PROMTOOL_TESTS, promtool_cases

RULE_FILES = sorted(render.RULES_DIR.glob("*.yaml"))


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)


def test_rules_pass_promtool_check_with_every_lint() -> None:
    result = _promtool("check", "rules", "--lint=all", "--lint-fatal", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_FILES)


@pytest.mark.parametrize("suite", PROMTOOL_TESTS, ids=lambda path: path.stem)
def test_promtool_unit_tests(suite: Path) -> None:
    result = _promtool("test", "rules", str(suite))
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_every_rule_fires_in_full_somewhere_and_every_alert_has_a_near_miss(alert_rules: list[dict]) -> None:
    """A rule is told apart from its siblings by its static labels (severity, reason)."""
    cases = promtool_cases()
    for rule in alert_rules:
        name, labels = rule["alert"], {k: str(v) for k, v in rule["labels"].items()}
        firing = [alert for case, alert in cases if case["alertname"] == name and alert
                  and labels.items() <= {k: str(v) for k, v in alert["exp_labels"].items()}.items()]
        assert firing, f"{name} {labels}: no promtool case where it fires"
        written = {"summary", "description", "runbook_url"} | (
            {"incident_url"} if name in INCIDENT_ALERTS else set())
        assert all(set(alert["exp_annotations"]) == written
                   for alert in firing), f"{name}: annotations not written out in full"
        assert any(case["alertname"] == name and not alert for case, alert in cases), \
            f"{name}: no promtool case where it must stay silent"
