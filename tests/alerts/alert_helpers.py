"""Helpers for the alert tests: the promtool cases as data."""

from __future__ import annotations

from pathlib import Path

import yaml

from alerts import render

ALERTMANAGER_CONFIG = render.ALERTS_DIR / "alertmanager.yaml"
PROMTOOL_TESTS = sorted((Path(__file__).parent / "promtool").glob("*.yaml"))


def promtool_cases() -> list[tuple[dict, dict]]:
    """(alert_rule_test, expected alert or {} for a must-not-fire case) over every suite."""
    cases = []
    for suite in PROMTOOL_TESTS:
        for test in yaml.safe_load(suite.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.extend((case, alert) for alert in case.get("exp_alerts") or [{}])
    return cases
