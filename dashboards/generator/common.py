"""Dashboard-level conventions: variables, cross-dashboard links, runbook links, assembly.

Every dashboard has the same six variables (`datasource`, `cluster`, `job_id`, `node`, `rank`,
`gpu`) so that the links between them can carry all of them along (`includeVars`).
"""

from __future__ import annotations

import json
from typing import Sequence

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from dashboards.generator.panels import DATASOURCE, PanelBuilder

TAG = "llmmon"
UIDS = {
    "wall": "llmmon-cluster-wall",
    "node": "llmmon-node",
    "job": "llmmon-job",
    "triage": "llmmon-triage",
}
RUNBOOKS = "https://github.com/llmmon/llmmon/blob/main/docs/runbooks.md"


def runbook(alert: str) -> str:
    """The docs/runbooks.md section of an alert (GitHub's anchor for a `## <alert>` heading)."""
    return f"{RUNBOOKS}#{alert.lower()}"


def dashboard_url(key: str, carry: Sequence[str] = (), **values: str) -> str:
    """A link to another llmmon dashboard that keeps the time range and carries variables.

    `datasource` and `cluster` always travel; `carry` names more variables to pass as they are;
    `values` sets variables from link expressions, e.g. node="${__field.labels.node}".
    """
    params = [f"${{{name}:queryparam}}" for name in ("datasource", "cluster", *carry)]
    params += [f"var-{name}={value}" for name, value in values.items()]
    return f"/d/{UIDS[key]}/{UIDS[key]}?{'&'.join([*params, '${__url_time_range}'])}"


def _query_variable(name: str, label: str, query: str, *, all_value: str | None = ".+",
                    numeric: bool = False) -> db.QueryVariable:
    variable = (db.QueryVariable(name).label(label).datasource(DATASOURCE)
                .query({"query": query, "refId": f"{name}-values"})
                .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
                .sort(dm.VariableSort.NATURAL_ASC if numeric else dm.VariableSort.ALPHABETICAL_ASC)
                .multi(True).include_all(True)
                .current(dm.VariableOption(selected=True, text="All", value="$__all")))
    if all_value is not None:
        variable.all_value(all_value)
    return variable


def variables(job_scoped_nodes: bool) -> list:
    """The six variables; on job-centred dashboards `node` lists only the job's nodes.

    There `node` has no custom "All" value, so All means the job's nodes (Grafana joins the
    option values) instead of every node of the cluster.
    """
    node_query = ('label_values(llmmon_rank_info{cluster=~"$cluster", job_id=~"$job_id"}, node)'
                  if job_scoped_nodes else
                  'label_values(llmmon_exporter_build_info{cluster=~"$cluster"}, node)')
    return [
        db.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        _query_variable("cluster", "Cluster",
                        "label_values(llmmon_exporter_build_info, cluster)", all_value=".*"),
        _query_variable("job_id", "Job",
                        'label_values(llmmon_rank_info{cluster=~"$cluster"}, job_id)'),
        _query_variable("node", "Node", node_query,
                        all_value=None if job_scoped_nodes else ".+"),
        _query_variable("rank", "Rank", 'label_values(llmmon_rank_info{cluster=~"$cluster", '
                        'job_id=~"$job_id"}, rank)', numeric=True),
        _query_variable("gpu", "GPU", 'label_values(llmmon_gpu_info{cluster=~"$cluster", '
                        'node=~"$node"}, gpu)', numeric=True),
    ]


def build(key: str, title: str, description: str, items: Sequence[PanelBuilder | db.Row], *,
          job_scoped_nodes: bool, refresh: str = "1m", time_from: str = "now-1h") -> dict:
    """Assemble a dashboard and return its classic JSON model as plain data."""
    board = (db.Dashboard(title).uid(UIDS[key]).description(description).tags([TAG])
             .readonly().timezone("utc").time(time_from, "now").refresh(refresh)
             .tooltip(dm.DashboardCursorSync.CROSSHAIR)
             .annotation(db.AnnotationQuery().name("Annotations & Alerts").built_in(1)
                         .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
                         .enable(True).hide(True).icon_color("rgba(0, 211, 255, 1)")
                         .type("dashboard"))
             .variables(variables(job_scoped_nodes))
             .link(db.DashboardLink("llmmon").type(dm.DashboardLinkType.DASHBOARDS)
                   .tags([TAG]).as_dropdown(True).include_vars(True).keep_time(True)))
    for item in items:
        if isinstance(item, db.Row):
            board.with_row(item)
        else:
            board.with_panel(item)
    model = board.build()
    for number, panel in enumerate(model.panels or [], 1):
        panel.id_val = number  # stable ids, so viewPanel links survive regeneration
    return json.loads(json.dumps(model, cls=JSONEncoder))


def render(model: dict) -> str:
    """The committed form: sorted keys, two-space indent, trailing newline."""
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
