"""What the diagnosis shares with the rest of llmmon: the alert thresholds, the recording-rule
and alert names, the runbook sections it links, and the published JSON schema."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from llmmon.diagnose import schema
from llmmon.diagnose.branches import TREE
from llmmon.diagnose.recording import RULES
from llmmon.diagnose.thresholds import Thresholds, ThresholdsError
from tests.conftest import ROOT, markdown_sections

CONFIG = ROOT / "alerts" / "config.yaml"


def test_thresholds_are_the_alerts_config() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    names = [field.name for field in dataclasses.fields(Thresholds)]
    assert set(names) <= set(config), "thresholds missing from alerts/config.yaml"
    assert Thresholds.load(str(CONFIG)) == Thresholds()


def test_every_check_uses_declared_thresholds() -> None:
    names = {field.name for field in dataclasses.fields(Thresholds)}
    for branch in TREE:
        for check in branch.checks:
            assert set(check.thresholds) <= names, check.id


@pytest.mark.parametrize("text, message", [
    ("- a list\n", "expected a mapping of thresholds"),
    ("fp16_share: 0.4\n", "fp16_share: expected {value: ..., why: ...}"),
    ("fp16_share: {value: half, why: x}\n", "fp16_share: expected a number, got 'half'"),
    ("xid_critical: {value: 79, why: x}\n", "xid_critical: expected a list"),
    ("fp16_share: {value: [0.4\n", "invalid YAML"),
])
def test_bad_alerts_config(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ThresholdsError, match=re.escape(message)):
        Thresholds.load(str(path))


def test_missing_alerts_config(tmp_path: Path) -> None:
    with pytest.raises(ThresholdsError, match="No such file"):
        Thresholds.load(str(tmp_path / "absent.yaml"))


def _rules(kind: str) -> set[str]:
    names = set()
    for path in (ROOT / "alerts" / "rules").glob("*.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {rule[kind] for rule in group["rules"] if kind in rule}
    return names


def test_local_rules_are_shipped_recording_rules() -> None:
    assert set(RULES) <= _rules("record")


def test_checks_name_shipped_alerts() -> None:
    alerts = _rules("alert")
    named = {alert for branch in TREE for check in branch.checks for alert in check.alerts}
    assert named <= alerts
    # Every alert of the decision tree has a check that judges the same condition, except
    # those about the monitoring itself, and the hang suspicion for jobs without the reporter
    # (it joins a pod's GPUs with its nodes' RDMA traffic: no local check judges it yet).
    assert alerts - named == {"LLMMonExporterDown", "LLMMonCollectorFailing",
                              "LLMMonReporterStale", "LLMTrainingHangSuspected"}


def test_runbook_links_point_at_sections() -> None:
    thresholds = Thresholds()
    pages = {"runbooks.md": markdown_sections(ROOT / "docs" / "runbooks.md"),
             "diagnose.md": markdown_sections(ROOT / "docs" / "diagnose.md")}
    base = thresholds.runbook_base_url.rsplit("/", 1)[0]
    for branch in TREE:
        for check in branch.checks:
            for alert in check.alerts or ("",):
                link = check.runbook(thresholds, alert)
                page, anchor = link.removeprefix(base + "/").split("#")
                assert anchor in pages[page], link


def test_published_schema_is_current() -> None:
    assert (ROOT / "docs" / "diagnose.schema.json").read_text() == schema.text(), \
        "run: python -m llmmon.diagnose.schema > docs/diagnose.schema.json"
