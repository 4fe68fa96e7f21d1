"""Conventions of the rules (monitoring-mixins style guide, mixtool lint) and their contract with
the exporter: names, severities, annotations, runbook anchors, and that every metric a rule reads
is one the exporter exports or a recording rule defines."""

from __future__ import annotations

import re

import pytest

from alerts import render
from llmmon.options import parse_duration
from tests.conftest import markdown_sections

# The decision tree, one name per branch: the list of docs/design.md#alert-names (its last
# paragraph), which this checks against the shipped rules.
DESIGN_ALERTS = set(re.findall(r"`(\w+)`", markdown_sections(
    render.ROOT / "docs" / "design.md")["alert-names"].strip().split("\n\n")[-1]))
# Node health (alerts/source/health.yaml): repair and fail-slow verdicts.
HEALTH_ALERTS = {
    "GPUXidActionRequired", "GPURowRemapFailure", "GPURecoveryActionRequired",
    "GPUEccUncorrectableSinceBoot", "PCIeLinkDowntrained", "GPULinkErrorsAbovePeers",
    "RDMALinkDegraded", "LLMNodeLemon", "GPUFabricUnhealthy",
}
# Alerts added after docs/design.md#alert-names' list (hangs across nodes and without the
# reporter).
EXTENDED_ALERTS = {"LLMTrainingHangNodes", "LLMTrainingHangSuspected", "LLMTrainingDesync"}
# Recording rules the dashboards query by name.
DASHBOARD_RECORDINGS = {
    "job_id:llmmon_training_mfu:ratio",
    "job_id_rank:llmmon_torch_memory_fragmentation:ratio",
    "node_device:llmmon_disk_read_latency_seconds:rate1m",
    "node_netdev_priority:llmmon_nic_pfc_pause:ratio_rate1m",
    "job_id_pg:llmmon_nccl_busbw_bytes_per_second:rate1m",
    "job_id_rank:llmmon_nccl_straggler_score:ratio",
}
# Labels Prometheus adds at scrape time (docs/design.md#labels); every series may carry them.
TARGET_LABELS = {"cluster", "node", "instance", "job"}
RUNBOOKS = render.ROOT / "docs" / "runbooks.md"

METRIC = re.compile(r"(?<![\w:])(llmmon_\w+|up)(?![\w:])")
SELECTOR = re.compile(r"(?<![\w:])(llmmon_\w+)\{([^}]*)\}")
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
# Alerts that wait 10 minutes or more yet run in a 15 s group, and why (alerts/config.yaml,
# trend_rules_interval, says where the others run).
SLOW_ALERTS_AT_15S = {
    "LLMTrainingStraggler": "its ticket latency is a detection figure of docs/faults.md",
}


def _texts(rule: dict) -> list[str]:
    """The PromQL a rule runs: its expression and the queries in its annotation templates."""
    return [rule["expr"], *rule.get("annotations", {}).values()]


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _runbook_sections() -> dict[str, str]:
    sections = re.split(r"^## ", RUNBOOKS.read_text(), flags=re.M)[1:]
    return {_slug(section.splitlines()[0]): section for section in sections}


def _waits_seconds(rule: dict) -> float:
    """The rule's `for:` in seconds; parse_duration refuses zero, which waits nothing."""
    return 0.0 if rule.get("for", "0s") == "0s" else parse_duration(rule["for"])


def test_an_alert_that_waits_ten_minutes_runs_once_a_minute(rendered: render.Rendered) -> None:
    """At fleet size every 15 s group shares the store's cores with every other (docs/capacity.md);
    an alert that waits 10 minutes loses at most 45 s by running once a minute, so it does."""
    slow_at_15s = {rule["alert"] for content in rendered.files.values()
                   for group in content["groups"] if "interval" not in group
                   for rule in group["rules"]
                   if "alert" in rule and _waits_seconds(rule) >= 600}
    assert slow_at_15s == set(SLOW_ALERTS_AT_15S)


def test_recording_groups_run_once_a_minute_or_less_often(rendered: render.Rendered) -> None:
    """Recording groups feed dashboards and alerts that wait minutes; at 1,250 nodes the rules, not
    the scrape, use the store's CPU (docs/capacity.md), so none reads every device every 15 s. A
    recording a quick alert needs sits in that alert's group, before it (the hang rules')."""
    every_15s = {group["name"] for content in rendered.files.values() for group in content["groups"]
                 if all("record" in rule for rule in group["rules"])
                 and parse_duration(group.get("interval", "15s")) < 60}
    assert not every_15s


def test_alert_names_are_the_design_names(alert_rules: list[dict]) -> None:
    assert {rule["alert"] for rule in alert_rules} == \
        DESIGN_ALERTS | EXTENDED_ALERTS | HEALTH_ALERTS


def test_names_are_camel_case_and_severities_known(alert_rules: list[dict]) -> None:
    for rule in alert_rules:
        assert re.fullmatch(r"([A-Z][A-Za-z0-9]*)+", rule["alert"]), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]


def test_summary_is_one_static_sentence_per_alert(alert_rules: list[dict]) -> None:
    summaries: dict[str, set[str]] = {}
    for rule in alert_rules:
        summary = rule["annotations"]["summary"]
        assert "{{" not in summary and re.fullmatch(r"[A-Z].+\.", summary), rule["alert"]
        summaries.setdefault(rule["alert"], set()).add(summary)
    assert all(len(texts) == 1 for texts in summaries.values()), summaries


def test_description_is_templated_with_the_evidence(alert_rules: list[dict]) -> None:
    for rule in alert_rules:
        assert "$labels." in rule["annotations"]["description"], rule["alert"]


def test_runbook_url_points_at_an_existing_section(alert_rules: list[dict]) -> None:
    base = render.load_thresholds()["runbook_base_url"].text
    sections = _runbook_sections()
    for rule in alert_rules:
        url = rule["annotations"]["runbook_url"]
        assert url == f"{base}#{rule['alert'].lower()}"
        assert url.split("#")[1] in sections, f"docs/runbooks.md has no section for {rule['alert']}"


@pytest.mark.parametrize("part", ["**Meaning.**", "**Confirm.**", "**Act.**", "**Rule out.**"])
def test_every_runbook_section_has(part: str) -> None:
    sections = _runbook_sections()
    assert set(sections) >= {name.lower() for name in DESIGN_ALERTS}
    missing = [anchor for anchor, text in sections.items() if anchor in {n.lower() for n in DESIGN_ALERTS}
               and part not in text]
    assert not missing, f"runbook sections without {part}: {missing}"


def test_recording_rule_names_follow_level_metric_operations(recording_rules: list[dict]) -> None:
    names = {rule["record"] for rule in recording_rules}
    assert names >= DASHBOARD_RECORDINGS
    for name in names:
        level, metric, operations = re.fullmatch(r"([a-z_]+):([a-z0-9_]+):([a-z0-9_]+)", name).groups()
        assert metric.startswith("llmmon_") and not metric.endswith("_total"), name


def test_every_metric_a_rule_reads_is_exported_or_recorded(alert_rules: list[dict],
                                                           recording_rules: list[dict]) -> None:
    from llmmon import catalog

    exported = catalog.exported_names() | {"up"}
    read = {name for rule in alert_rules + recording_rules for text in _texts(rule)
            for name in METRIC.findall(text)}
    missing = sorted(read - exported)
    print("metrics the rules read that no collector exports yet:", *missing, sep="\n  ")
    assert not missing, f"{len(missing)} metrics read by rules are not exported: {missing}"


def test_selectors_use_labels_the_metric_has(alert_rules: list[dict], recording_rules: list[dict]) -> None:
    from llmmon import catalog

    labels = {name: set(spec.labels) | TARGET_LABELS
               for spec in catalog.all_specs() for name in spec.sample_names()}
    wrong = sorted({(metric, label) for rule in alert_rules + recording_rules for text in _texts(rule)
                    for metric, matchers in SELECTOR.findall(text) if metric in labels
                    for label in MATCHER.findall(matchers) if label not in labels[metric]})
    assert not wrong, f"selectors on labels the exporter does not emit: {wrong}"
