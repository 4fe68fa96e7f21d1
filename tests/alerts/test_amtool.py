"""alerts/alertmanager.yaml through the real amtool: the config is valid, each severity routes to
its receiver, inhibitions can match, and notifications show the evidence (no Alertmanager runs:
tests/slow/alerts/ starts one)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.alerts.alert_helpers import ALERTMANAGER_CONFIG, promtool_cases

TEMPLATES = ALERTMANAGER_CONFIG.parent / "notifications.tmpl"


def _amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["amtool", *args], capture_output=True, text=True, timeout=30)


def test_config_is_valid() -> None:
    result = _amtool("check-config", str(ALERTMANAGER_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert " - 10 inhibit rules" in result.stdout and " - 3 receivers" in result.stdout


@pytest.mark.parametrize("labels, receiver", [
    ("alertname=GPULost severity=critical cluster=c1 node=n1 uuid=GPU-1", "pager"),
    ("alertname=LLMTrainingHang severity=critical cluster=c1 job_id=llama rank=3 node=n2", "pager"),
    ("alertname=GPUThermalThrottle severity=warning cluster=c1 node=n1", "tickets"),
    ("alertname=LLMTrainingStraggler severity=warning cluster=c1 job_id=llama rank=2", "tickets"),
    ("alertname=RDMACongestion severity=info cluster=c1 node=n1 device=mlx5_0 port=1",
     "record-only"),
    ("alertname=SomethingElse cluster=c1", "record-only"),
])
def test_route(labels: str, receiver: str) -> None:
    result = _amtool("config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}",
                     f"--verify.receivers={receiver}", *labels.split())
    assert result.returncode == 0 and result.stdout.strip() == receiver, \
        result.stdout + result.stderr


def _matches(matchers: list[str], labels: dict[str, str]) -> bool:
    for matcher in matchers:
        name, op, value = re.fullmatch(r'(\w+)(=~|!~|!=|=)"(.*)"', matcher).groups()
        hit = re.fullmatch(value, labels.get(name, "")) is not None
        if hit != (op in ("=", "=~")):
            return False
    return True


def test_inhibition_sources_and_named_targets_carry_the_equal_labels() -> None:
    """An `equal` label missing on both sides matches everything; the rules must produce them all.
    Checked on the label sets the promtool cases expect the rules to fire with."""
    fired = [{"alertname": case["alertname"], **{k: str(v) for k, v in alert["exp_labels"].items()}}
             for case, alert in promtool_cases() if alert]
    rules = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())["inhibit_rules"]
    for rule in (r for r in rules if any(m.startswith("alertname=") for m in r["source_matchers"])):
        sides = [rule["source_matchers"]]
        if rule["target_matchers"][0].startswith(("alertname=", "alertname=~")):
            sides.append(rule["target_matchers"])
        for matchers in sides:
            matched = [labels for labels in fired if _matches(matchers, labels)]
            assert matched, f"no rule fires an alert matching {matchers}"
            for labels in matched:
                assert set(rule["equal"]) <= set(labels), f"{labels} lacks one of {rule['equal']}"


def test_notification_shows_the_evidence_and_the_runbook(tmp_path: Path) -> None:
    alert = {
        "status": "firing",
        "labels": {"alertname": "LLMTrainingHang", "severity": "critical", "cluster": "c1",
                   "job_id": "llama", "rank": "3", "node": "node-b", "pg": "0"},
        "annotations": {"summary": "A process group of a training job stopped making progress.",
                        "description": "Rank 3 of job llama on node node-b is the rank behind.",
                        "runbook_url": "https://example.org/runbooks.md#llmtraininghang"},
        "startsAt": "2026-01-01T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "", "fingerprint": "0"}
    data = tmp_path / "data.json"
    data.write_text(json.dumps({
        "receiver": "pager", "status": "firing", "alerts": [alert],
        "groupLabels": {"alertname": "LLMTrainingHang", "cluster": "c1", "job_id": "llama"},
        "commonLabels": alert["labels"], "commonAnnotations": alert["annotations"],
        "externalURL": "http://127.0.0.1:9093"}))
    result = _amtool("template", "render", f"--template.glob={TEMPLATES}",
                     f"--template.data={data}", '--template.text={{ template "llmmon.title" . }}'
                     '\n{{ template "llmmon.text" . }}')
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "[FIRING:1] LLMTrainingHang job llama on node-b (c1)\n"
        "FIRING [critical] A process group of a training job stopped making progress.\n"
        "Rank 3 of job llama on node node-b is the rank behind.\n"
        "Runbook: https://example.org/runbooks.md#llmtraininghang\n"
        "Labels: alertname=LLMTrainingHang cluster=c1 job_id=llama node=node-b pg=0 rank=3 "
        "severity=critical\n\n")
