"""Helpers for the alert tests: the promtool cases as data."""

from __future__ import annotations

from pathlib import Path

import yaml

from alerts import render

ALERTMANAGER_CONFIG = render.ALERTS_DIR / "alertmanager.yaml"
PROMTOOL_TESTS = sorted((Path(__file__).parent / "promtool").glob("*.yaml"))
# The nccl collector's families (issue 44's contract, docs/network.md), with their labels: the
# rules and the dashboards read them; the collector is written on another branch. Once it is
# merged, catalog.exported_names() has them and these entries change nothing.
NCCL_CONTRACT = {
    "llmmon_job_nccl_settings_info": {
        "job_id", "ib_hca", "ib_gid_index", "socket_ifname", "net_gdr_level",
        "ib_qps_per_connection", "ib_disable", "p2p_disable", "shm_disable", "net", "algo",
        "proto", "checked"},
    "llmmon_job_nccl_misconfigured": {"job_id", "check"},
    "llmmon_rank_nccl_transport_info": {"job_id", "rank", "version", "net", "gdr", "devices",
                                        "paths"},
}


def promtool_cases() -> list[tuple[dict, dict]]:
    """(alert_rule_test, expected alert or {} for a must-not-fire case) over every suite."""
    cases = []
    for suite in PROMTOOL_TESTS:
        for test in yaml.safe_load(suite.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.extend((case, alert) for alert in case.get("exp_alerts") or [{}])
    return cases
