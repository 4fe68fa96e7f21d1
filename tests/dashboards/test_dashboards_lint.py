"""Lint of the committed dashboards: grafana/dashboard-linter's rules plus ours.

Each test checks one rule over every dashboard and lists every violation it finds.
"""

from __future__ import annotations

import glob
import json
import re
from pathlib import Path

import yaml
from grafana_foundation_sdk.models import units

from llmmon.catalog import exported_names

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_VERSION = 41  # classic model of Grafana 11.x (grafana-foundation-sdk 11.6 default)
UIDS = {"llmmon-cluster-wall", "llmmon-node", "llmmon-job", "llmmon-triage"}
VARIABLES = ["datasource", "cluster", "job_id", "node", "rank", "gpu"]
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PANEL_TYPES = {"timeseries", "stat", "state-timeline", "heatmap", "table", "row", "text",
               "bargauge", "gauge"}
UNITS = {value for value in vars(units).values() if isinstance(value, str)}
WIDTH = 24
# Grafana's grid: a unit of height is 30 px plus an 8 px margin between units. In kiosk mode
# a 1080 px screen keeps 16 px of page padding above and below the grid.
CELL_PX, MARGIN_PX, SCREEN_PX, PADDING_PX = 30, 8, 1080, 16
RATE_FUNCTIONS = re.compile(r"\b(rate|irate|increase)\(")
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{")
RATED_SAMPLE = re.compile(r"[a-zA-Z0-9_:]+_(total|bucket|sum|count)\{")
DASHBOARD_URL = re.compile(r"/d/([a-z0-9-]+)/")
CARRIED = ("${datasource:queryparam}", "${cluster:queryparam}", "${__url_time_range}")


def _strings(node) -> list[str]:
    if isinstance(node, dict):
        return [s for value in node.values() for s in _strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in _strings(value)]
    return [node] if isinstance(node, str) else []


def _rule_files() -> list[dict]:
    return [yaml.safe_load(Path(path).read_text(encoding="utf-8"))
            for path in sorted(glob.glob(str(ROOT / "alerts" / "rules" / "*.y*ml")))]


def _rules(kind: str) -> set[str]:
    return {rule[kind] for data in _rule_files() for group in data["groups"]
            for rule in group["rules"] if kind in rule}


def _range_of(expr: str, start: int) -> str:
    """The range selector `[...]` directly inside the call whose '(' is at `start`."""
    depth = 0
    for index in range(start, len(expr)):
        char = expr[index]
        if char in "({":
            depth += 1
        elif char in ")}":
            depth -= 1
            if depth == 0:
                return ""
        elif char == "[" and depth == 1:
            return expr[index + 1:expr.index("]", index)]
    return ""


def test_classic_model_with_pinned_schema(dashboards) -> None:
    assert set(dashboards) == UIDS, "one file per dashboard, named after its uid"
    problems = []
    for name, model in dashboards.items():
        expected = {"uid": name, "schemaVersion": SCHEMA_VERSION, "editable": False,
                    "timezone": "utc", "tags": ["llmmon"]}
        problems += [f"{name}: {key} is {model.get(key)!r}, expected {value!r}"
                     for key, value in expected.items() if model.get(key) != value]
        problems += [f"{name}: lacks {key}" for key in ("title", "description", "time",
                                                         "refresh", "templating")
                     if not model.get(key)]
        if not model.get("annotations", {}).get("list"):
            problems.append(f"{name}: no annotations list")
        problems += [f"{name}: has {key}" for key in ("__inputs", "__requires", "id")
                     if key in model]
        problems += [f"{name}: exported-dashboard input {s!r}" for s in _strings(model)
                     if "${DS_" in s]
    assert not problems, "\n".join(problems)


def test_variables(dashboards) -> None:
    problems = []
    for name, model in dashboards.items():
        variables = model["templating"]["list"]
        if [v["name"] for v in variables] != VARIABLES:
            problems.append(f"{name}: variables {[v['name'] for v in variables]}")
            continue
        source = variables[0]
        if (source["type"], source["query"], source.get("label")) != (
                "datasource", "prometheus", "Data source"):
            problems.append(f"{name}: datasource variable {source}")
        for variable in variables[1:]:
            where = f"{name}: ${variable['name']}"
            if variable["type"] != "query" or variable.get("datasource") != DATASOURCE:
                problems.append(f"{where} is not a query on $datasource")
            if variable.get("refresh") != 2:
                problems.append(f"{where} does not refresh on time-range change")
            if not (variable.get("multi") and variable.get("includeAll")):
                problems.append(f"{where} is not multi-select with All")
    assert not problems, "\n".join(problems)


def test_queries_use_only_known_variables(dashboards, targets) -> None:
    builtin = {"__rate_interval", "__range", "__interval"}
    names = {v["name"] for model in dashboards.values() for v in model["templating"]["list"]}
    problems = [f"{t.name}: ${name}" for t in targets
                for name in re.findall(r"\$\{?(\w+)", t.expr) if name not in names | builtin]
    assert not problems, "\n".join(problems)


def test_every_query_uses_the_datasource_variable(panels) -> None:
    problems = []
    for panel in panels:
        targets = panel.model.get("targets", [])
        if panel.model["type"] in ("row", "text"):
            if targets:
                problems.append(f"{panel.name}: a {panel.model['type']} panel with queries")
            continue
        if not targets:
            problems.append(f"{panel.name}: no queries")
        if panel.model.get("datasource") != DATASOURCE:
            problems.append(f"{panel.name}: panel datasource {panel.model.get('datasource')}")
        problems += [f"{panel.name} [{t['refId']}]: datasource {t.get('datasource')}"
                     for t in targets if t.get("datasource") != DATASOURCE]
        refs = [t["refId"] for t in targets]
        if len(set(refs)) != len(refs) or "" in refs:
            problems.append(f"{panel.name}: refIds {refs}")
    assert not problems, "\n".join(problems)


def test_rate_functions_use_rate_interval(targets) -> None:
    problems = []
    for target in targets:
        calls = list(RATE_FUNCTIONS.finditer(target.expr))
        problems += [f"{target.name}: {call.group(1)}(...[{_range_of(target.expr, call.end() - 1)}])"
                     for call in calls
                     if _range_of(target.expr, call.end() - 1) != "$__rate_interval"]
    assert not problems, "\n".join(problems)


def test_a_window_over_the_whole_range_is_taken_once(targets) -> None:
    """`[$__range]` in a range query is the dashboard's whole range at every step: thousands of
    points a step per series. Pinned with `@ end()` it is evaluated once, at the range's end."""
    problems = [f"{t.name}: {t.expr}" for t in targets
                if re.search(r"\[\$__range\](?!\s*@\s*end\(\))", t.expr)]
    assert not problems, "\n".join(problems)


def test_counters_and_histograms_go_through_rate(targets) -> None:
    functions = ("rate(", "irate(", "increase(")
    problems = [f"{t.name}: {match.group(0)} used raw" for t in targets
                for match in RATED_SAMPLE.finditer(t.expr)
                if not t.expr[:match.start()].endswith(functions)]
    assert not problems, "\n".join(problems)


def test_units_descriptions_and_types(panels) -> None:
    problems = []
    for panel in panels:
        kind = panel.model["type"]
        if kind not in PANEL_TYPES:
            problems.append(f"{panel.name}: panel type {kind!r} not allowed")
        if kind in ("row", "text"):
            continue
        unit = panel.model.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if unit not in UNITS:
            problems.append(f"{panel.name}: unit {unit!r}")
        for override in panel.model["fieldConfig"].get("overrides", []):
            problems += [f"{panel.name}: override unit {p['value']!r}"
                         for p in override["properties"]
                         if p["id"] == "unit" and p["value"] not in UNITS]
        if len(panel.model.get("description", "")) < 40:
            problems.append(f"{panel.name}: no description of what to look for")
    assert not problems, "\n".join(problems)


def test_grid_inside_24_columns_without_overlaps(dashboards) -> None:
    problems = []
    for name, model in dashboards.items():
        boxes = []
        for panel in model["panels"]:  # top level: our rows are never collapsed
            pos = panel["gridPos"]
            title = f"{name} / {panel.get('title')}"
            if pos["x"] < 0 or pos["y"] < 0 or pos["w"] < 1 or pos["h"] < 1:
                problems.append(f"{title}: bad gridPos {pos}")
            if pos["x"] + pos["w"] > WIDTH:
                problems.append(f"{title}: ends at column {pos['x'] + pos['w']}")
            if panel["type"] == "row" and (pos["w"], pos["h"], pos["x"]) != (WIDTH, 1, 0):
                problems.append(f"{title}: row at {pos}")
            for other_title, other in boxes:
                if (pos["x"] < other["x"] + other["w"] and other["x"] < pos["x"] + pos["w"]
                        and pos["y"] < other["y"] + other["h"]
                        and other["y"] < pos["y"] + pos["h"]):
                    problems.append(f"{title} overlaps {other_title}")
            boxes.append((title, pos))
    assert not problems, "\n".join(problems)


def test_cluster_wall_fits_one_1080p_screen(dashboards) -> None:
    wall = dashboards["llmmon-cluster-wall"]
    units_high = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in wall["panels"])
    pixels = units_high * CELL_PX + (units_high - 1) * MARGIN_PX
    assert pixels <= SCREEN_PX - 2 * PADDING_PX, f"{units_high} grid units = {pixels} px"
    assert not [p for p in wall["panels"] if p["type"] == "row"], "rows would need scrolling"
    assert wall["refresh"] and wall["time"]["from"].startswith("now-")


def test_uids_unique_and_panel_ids_stable(dashboards) -> None:
    assert len({model["uid"] for model in dashboards.values()}) == len(dashboards)
    for name, model in dashboards.items():
        ids = [panel["id"] for panel in model["panels"]]
        assert ids == list(range(1, len(ids) + 1)), f"{name}: panel ids {ids}"


def test_links_between_dashboards_carry_variables(dashboards) -> None:
    problems = []
    for name, model in dashboards.items():
        for dash_link in model["links"]:
            if not (dash_link["type"] == "dashboards" and dash_link["includeVars"]
                    and dash_link["keepTime"] and dash_link["tags"] == ["llmmon"]):
                problems.append(f"{name}: dashboard link {dash_link}")
        for text in _strings(model["panels"]):
            for match in DASHBOARD_URL.finditer(text):
                if match.group(1) not in UIDS:
                    problems.append(f"{name}: link to unknown dashboard {match.group(1)}")
                problems += [f"{name}: link {text!r} drops {carried}" for carried in CARRIED
                             if carried not in text]
    assert not problems, "\n".join(problems)


def test_runbook_links_resolve() -> None:
    runbooks = (ROOT / "docs" / "runbooks.md").read_text(encoding="utf-8")
    anchors = {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
               for heading in re.findall(r"^#+ (.+)$", runbooks, re.M)}
    links = {url for path in (ROOT / "dashboards").glob("*.json")
             for url in re.findall(r'docs/runbooks\.md#([\w-]+)', path.read_text())}
    assert links, "no runbook links found"
    assert links <= anchors, f"runbook anchors missing: {sorted(links - anchors)}"


def test_panels_the_runbooks_cite_exist(dashboards) -> None:
    """A runbook's "Confirm" step names dashboard panels in italics; renaming one breaks it."""
    uids = {"Cluster wall": "llmmon-cluster-wall", "Node": "llmmon-node", "Job": "llmmon-job",
            "Triage": "llmmon-triage"}
    runbooks = (ROOT / "docs" / "runbooks.md").read_text(encoding="utf-8")
    problems, cited = [], 0
    for paragraph in re.split(r"\n\s*\n", runbooks):
        paragraph = " ".join(paragraph.split())
        where = re.search(r"(Cluster wall|Node|Job|Triage) dashboard", paragraph)
        if "**Confirm.**" not in paragraph or not where:
            continue
        titles = {p["title"] for p in dashboards[uids[where.group(1)]]["panels"]}
        for title in re.findall(r"(?<!\*)\*([^*]+)\*(?!\*)", paragraph):
            cited += 1
            if title not in titles:
                problems.append(f"{where.group(0)} has no panel {title!r}")
    assert cited, "no panel citations found in docs/runbooks.md"
    assert not problems, "\n".join(problems)


def test_every_metric_is_exported_or_recorded(dashboards) -> None:
    known = exported_names() | _rules("record") | {"ALERTS"}
    problems = sorted({f"{name}: {metric}" for name, model in dashboards.items()
                       for text in _strings(model) for metric in SELECTOR.findall(text)
                       if metric not in known})
    assert not problems, "unknown metrics:\n" + "\n".join(problems)


def test_alert_names_exist_and_triage_covers_them_all(dashboards) -> None:
    alerts = _rules("alert")
    assert alerts, "no alert rules rendered in alerts/rules/"
    used = {name for model in dashboards.values() for text in _strings(model)
            for group in re.findall(r'alertname=~?"([^"]+)"', text)
            for name in group.split("|")}
    assert used <= alerts, f"unknown alerts: {sorted(used - alerts)}"
    triage = json.dumps(dashboards["llmmon-triage"])
    placed = {alert: triage.count(f'"Runbook: {alert}"') for alert in alerts}
    assert all(n == 1 for n in placed.values()), f"alerts not in exactly one branch: {placed}"
