"""Cluster wall: one 1920x1080 TV screen, no scrolling, refreshed every 30 s.

Height budget: 4 + 12 + 10 = 26 grid units, 980 px (docs/dashboards.md has the arithmetic). Top line: eight headline stats. Middle: every GPU's instant power as a
state timeline, one row per GPU, so a hang (all cold), starvation (stripes) and one cold card
are visible at a glance. Bottom: RDMA throughput per node, MFU per job and the firing alerts.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import units

from dashboards.generator.common import build, dashboard_url
from dashboards.generator.panels import (
    Query,
    link,
    m,
    prop,
    rate,
    stat,
    state_timeline,
    table,
    timeseries,
)

THERMAL_OR_HW_SLOWDOWN = ('reason=~"hw_slowdown|sw_thermal_slowdown|hw_thermal_slowdown|'
                          'hw_power_brake_slowdown"')
PFC_STORM_PAUSED_FRACTION = 0.5  # the RDMAPFCStorm alert's "paused most of the time"
# <30 % fails, >50 % is excellent (docs/design.md#while-the-job-runs).
MFU_STEPS = ((None, "red"), (0.3, "yellow"), (0.5, "green"))
FIRING = 'alertstate="firing"'
CRITICAL = 'severity="critical"'
HANG = 'alertname="LLMTrainingHang"'
ALARM = ((None, "green"), (1, "red"))
WARN = ((None, "green"), (1, "orange"))
STAT_HEIGHT, TIMELINE_HEIGHT, BOTTOM_HEIGHT = 4, 12, 10


def _headline():
    job_link = link("Job dashboard", dashboard_url("job", carry=("job_id",)))
    return [
        stat("Jobs running", "Training jobs with at least one rank reporting "
             "(llmmon_rank_up = 1). Zero while the cluster should be busy means the reporters "
             "or the jobs are gone.", units.NoUnit,
             Query(f"count(max by (cluster, job_id) ({m('llmmon_rank_up')}) == 1)"),
             steps=((None, "blue"),), no_value="0", links=[job_link]),
        stat("GPUs busy", "GPUs whose NVML utilisation is above 10 %. Compare with the GPUs the "
             "scheduler handed out: a drop with jobs still running is a stall.", units.NoUnit,
             Query(f"sum({m('llmmon_gpu_utilization_ratio')} > bool 0.1)"),
             steps=((None, "blue"),)),
        stat("Cluster MFU", "Mean model FLOPs utilisation of the running jobs "
             "(job_id:llmmon_training_mfu:ratio). Below 30 % fails, above 50 % is excellent.",
             units.PercentUnit, Query(f"avg({m('job_id:llmmon_training_mfu:ratio')})"),
             steps=MFU_STEPS, no_value="no MFU", links=[job_link]),
        stat("Critical alerts", "Critical alerts firing now (each one pages). Open the triage "
             "dashboard to see which branch of the decision tree they belong to.",
             units.NoUnit,
             Query(f"count({m('ALERTS', FIRING, CRITICAL)})"),
             steps=ALARM, no_value="0",
             links=[link("Triage", dashboard_url("triage", carry=("job_id",)))]),
        stat("Hung jobs", "Jobs with LLMTrainingHang firing: a process group made no progress "
             "while some ranks wait in a collective. The job dashboard's ranks table names the "
             "rank that is behind.", units.NoUnit,
             Query("count(count by (cluster, job_id) "
                   f"({m('ALERTS', HANG, FIRING)})"
                   ")"),
             steps=ALARM, no_value="0", links=[job_link]),
        stat("Throttled GPUs", "GPUs with a thermal, hardware-slowdown or power-brake clock "
             "event active now (the power cap alone is normal under load). One throttled card "
             "slows the whole synchronous job.", units.NoUnit,
             Query("sum(max by (cluster, node, gpu) "
                   f"({m('llmmon_gpu_clock_event_active', THERMAL_OR_HW_SLOWDOWN)}))"),
             steps=WARN),
        stat("Ports in PFC storm", "NIC ports that raised pause-storm events in the last rate "
             f"window, or that are paused more than {PFC_STORM_PAUSED_FRACTION:.0%} of the time "
             "on some priority. A storming port can freeze the fabric around it.",
             units.NoUnit,
             Query("count(max by (cluster, node, netdev) "
                   f"({rate('llmmon_nic_pause_storm_events_total')}) > 0 "
                   "or max by (cluster, node, netdev) "
                   f"({m('node_netdev_priority:llmmon_nic_pfc_pause:ratio_rate1m')}) "
                   f"> {PFC_STORM_PAUSED_FRACTION})"),
             steps=ALARM, no_value="0"),
        stat("Failing collectors", "Exporter collectors whose last run failed or timed out "
             "(llmmon_exporter_collector_success = 0): the panels fed by them are stale.",
             units.NoUnit,
             Query(f"sum({m('llmmon_exporter_collector_success')} == bool 0)"),
             steps=WARN),
    ]


def _power_timeline():
    # the share the node computed: one series a GPU and no join (8,000 GPUs at 1,000 nodes)
    expr = m("llmmon_gpu_power_instant_min_ratio")
    node_link = link("Node ${__field.labels.node}",
                     dashboard_url("node", node="${__field.labels.node}",
                                   gpu="${__field.labels.gpu}"))
    return state_timeline(
        "GPU instant power (lowest in each scrape, share of power limit)",
        "One row per GPU; colour is the lowest instant power seen in each scrape window "
        "(sampled at 20 Hz) as a share of the card's power limit. All rows blue at once: a "
        "distributed hang. Blue stripes across a job's GPUs: the input pipeline starves them "
        "(check disk on the node dashboard). One blue row among green ones: that card is "
        "throttled or broken. Click a row for its node.",
        units.PercentUnit, Query(expr, "{{node}} GPU {{gpu}}"),
        width=24, height=TIMELINE_HEIGHT,
        steps=((None, "blue"), (0.25, "yellow"), (0.6, "green")), data_links=[node_link])


def _bottom():
    rdma = (f"sum by (cluster, node) ({rate('llmmon_rdma_transmit_bytes_total')}) "
            f"+ sum by (cluster, node) ({rate('llmmon_rdma_receive_bytes_total')})")
    return [
        timeseries("RDMA throughput per node (tx + rx)",
                   "RDMA traffic of each node. All nodes falling to zero together with cold "
                   "GPUs is a hang; one node far below its peers points at its links or NICs.",
                   units.BytesPerSecondSI, Query(rdma, "{{node}}"), width=6,
                   height=BOTTOM_HEIGHT,
                   data_links=[link("Node ${__field.labels.node}",
                                    dashboard_url("node", node="${__field.labels.node}"))]),
        timeseries("MFU per job", "Model FLOPs utilisation per job; dashed lines at 30 % "
                   "(fails) and 50 % (excellent).", units.PercentUnit,
                   Query(m("job_id:llmmon_training_mfu:ratio"), "{{job_id}}"), width=7,
                   height=BOTTOM_HEIGHT, steps=MFU_STEPS, min_value=0,
                   data_links=[link("Job ${__field.labels.job_id}",
                                    dashboard_url("job", job_id="${__field.labels.job_id}"))]),
        table("Lemon nodes", "Alert-hours over 7 days, across jobs, of hang culprits, "
              "stragglers, XIDs needing an SRE and link flaps per node: the nodes to pull from "
              "the pool (LLMNodeLemon when far above the fleet).",
              Query(f"topk(10, {m('node:llmmon_lemon_score:hours7d')} > 0)"),
              columns=("node", "Value"), renames={"Value": "alert-hours"}, width=4,
              height=BOTTOM_HEIGHT, sort_by="alert-hours",
              data_links=[link("Node ${__data.fields.node}",
                               dashboard_url("node", node="${__data.fields.node}"))]),
        table("Firing alerts", "Alerts firing now, most severe first; the triage dashboard "
              "groups them by decision-tree branch.",
              Query(f"max by (cluster, alertname, severity, job_id, node) "
                    f"({m('ALERTS', FIRING)})"),
              columns=("alertname", "severity", "job_id", "node"),
              renames={"alertname": "alert", "job_id": "job"}, width=7, height=BOTTOM_HEIGHT,
              sort_by="severity", overrides=[("severity", [prop("custom.width", 80)])]),
    ]


def dashboard() -> dict:
    return build("wall", "llmmon / Cluster wall",
                 "Wall display of the whole cluster: headline health, every GPU's power and "
                 "the network, sized for one 1920x1080 screen.",
                 [*_headline(), _power_timeline(), *_bottom()],
                 job_scoped_nodes=False, refresh="30s", time_from="now-30m")
