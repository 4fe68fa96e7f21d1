"""alerts/alertmanager.yaml in a real Alertmanager on 127.0.0.1: grouping per job and per node,
each inhibition mutes exactly its targets, and a job page leaves before a node alert."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import requests

from llmmon.simulate import stack
from tests.slow.alerts.conftest import Alertmanager


def _window() -> dict[str, str]:
    now = datetime.now(timezone.utc)
    return {"startsAt": now.isoformat(), "endsAt": (now + timedelta(hours=1)).isoformat()}


def test_job_alerts_are_grouped_per_job_and_node_alerts_per_node(alertmanager: Alertmanager) -> None:
    hang = {"alertname": "LLMTrainingHang", "severity": "critical", "cluster": "c1", "job_id": "llama"}
    lost = {"alertname": "GPULost", "severity": "critical", "cluster": "c1"}
    alertmanager.post([{"labels": labels, **_window()} for labels in (
        {**hang, "rank": "3", "node": "node-b"}, {**hang, "rank": "9", "node": "node-c"},
        {**lost, "node": "node-a", "uuid": "GPU-a0"}, {**lost, "node": "node-a", "uuid": "GPU-a1"},
        {**lost, "node": "node-b", "uuid": "GPU-b0"})])
    expected = {
        ("pager", (("cluster", "c1"), ("job_id", "llama")), 2),
        ("pager", (("alertname", "GPULost"), ("cluster", "c1"), ("node", "node-a")), 2),
        ("pager", (("alertname", "GPULost"), ("cluster", "c1"), ("node", "node-b")), 1),
    }
    deadline = time.monotonic() + 10
    while True:
        groups = {(group["receiver"]["name"], tuple(sorted(group["labels"].items())), len(group["alerts"]))
                  for group in alertmanager.groups()}
        if groups == expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert groups == expected


# name -> labels; sources first, then what each must mute, then near-misses that must stay active.
SOURCES = {
    "hang": {"alertname": "LLMTrainingHang", "severity": "critical", "reason": "rank_not_enqueued",
             "cluster": "c1", "job_id": "llama", "rank": "3", "node": "node-b", "pg": "0"},
    "lost": {"alertname": "GPULost", "severity": "critical", "cluster": "c1", "node": "node-a",
             "gpu": "0", "uuid": "GPU-a0"},
    "linkdown": {"alertname": "RDMALinkDown", "severity": "critical", "cluster": "c1",
                 "node": "node-a", "device": "mlx5_0", "port": "1"},
    "exporterdown": {"alertname": "LLMMonExporterDown", "severity": "warning", "cluster": "c1",
                     "node": "node-c", "instance": "10.0.0.3:9435", "job": "llmmon"},
    "oom": {"alertname": "GPUMemoryOOM", "severity": "critical", "cluster": "c1", "job_id": "llama",
            "rank": "5", "node": "node-b"},
    "hwthermal": {"alertname": "GPUThermalThrottle", "severity": "critical", "cluster": "c1",
                  "node": "node-d", "gpu": "1", "uuid": "GPU-d1", "reason": "hw_thermal_slowdown"},
    "xidaction": {"alertname": "GPUXidActionRequired", "severity": "critical", "cluster": "c1",
                  "node": "node-e", "gpu": "2", "uuid": "GPU-e2", "xid": "48",
                  "action": "reset_gpu"},
    "hangnodes": {"alertname": "LLMTrainingHangNodes", "severity": "info", "cluster": "c1",
                  "node": "node-f", "job_id": "llama"},
    "netslow": {"alertname": "LLMTrainingNetworkSlow", "severity": "warning",
                "reason": "tcp_retransmits", "cluster": "c1", "job_id": "mistral"},
    "desync": {"alertname": "LLMTrainingDesync", "severity": "critical", "cluster": "c1",
               "job_id": "bert", "pg": "0", "rank": "3", "node": "node-b", "seq": "273",
               "signature": "broadcast 256 B Float"},
}
MUTED = {  # target -> (labels, the source that mutes it)
    "straggler": ({"alertname": "LLMTrainingStraggler", "severity": "warning", "reason": "collective_time",
                   "cluster": "c1", "job_id": "llama", "rank": "2", "node": "node-b"}, "hang"),
    "netslow-straggler": ({"alertname": "LLMTrainingStraggler", "severity": "warning",
                           "reason": "enqueue_lag", "cluster": "c1", "job_id": "mistral",
                           "rank": "1", "node": "node-a"}, "netslow"),
    "mfu": ({"alertname": "LLMTrainingMFULow", "severity": "warning", "cluster": "c1", "job_id": "llama"},
            "hang"),
    "starvation": ({"alertname": "GPUDataLoaderStarvation", "severity": "warning", "cluster": "c1",
                    "node": "node-a", "job_id": "llama"}, "hang"),
    "power": ({"alertname": "GPUPowerBelowPeers", "severity": "warning", "cluster": "c1", "node": "node-a",
               "gpu": "1", "uuid": "GPU-a1", "job_id": "llama"}, "hang"),
    "lost-thermal": ({"alertname": "GPUThermalThrottle", "severity": "warning", "cluster": "c1",
                      "node": "node-a", "gpu": "0", "uuid": "GPU-a0", "reason": "sw_thermal_slowdown"}, "lost"),
    "lost-xid": ({"alertname": "GPUXidError", "severity": "critical", "cluster": "c1", "node": "node-a",
                  "gpu": "0", "uuid": "GPU-a0", "xid": "79"}, "lost"),
    "loss": ({"alertname": "RDMAPacketLoss", "severity": "warning", "cluster": "c1", "node": "node-a",
              "device": "mlx5_0", "port": "1"}, "linkdown"),
    "congestion": ({"alertname": "RDMACongestion", "severity": "info", "reason": "cnp", "cluster": "c1",
                    "node": "node-a", "device": "mlx5_0", "port": "1"}, "linkdown"),
    "flapping": ({"alertname": "RDMALinkFlapping", "severity": "warning", "reason": "link_downed",
                  "cluster": "c1", "node": "node-a", "device": "mlx5_0", "port": "1"}, "linkdown"),
    "collector": ({"alertname": "LLMMonCollectorFailing", "severity": "warning", "cluster": "c1",
                   "node": "node-c", "collector": "gpu"}, "exporterdown"),
    "reporter": ({"alertname": "LLMMonReporterStale", "severity": "warning", "cluster": "c1",
                  "node": "node-c", "job_id": "gpt", "rank": "7"}, "exporterdown"),
    "oomrisk": ({"alertname": "GPUMemoryOOMRisk", "severity": "warning", "reason": "alloc_retries",
                 "cluster": "c1", "job_id": "llama", "rank": "5", "node": "node-b"}, "oom"),
    "fragmentation": ({"alertname": "GPUMemoryFragmentation", "severity": "warning", "cluster": "c1",
                       "job_id": "llama", "rank": "5", "node": "node-b"}, "oom"),
    "swthermal": ({"alertname": "GPUThermalThrottle", "severity": "warning", "cluster": "c1", "node": "node-d",
                   "gpu": "1", "uuid": "GPU-d1", "reason": "sw_thermal_slowdown"}, "hwthermal"),
    "xid-generic": ({"alertname": "GPUXidError", "severity": "critical", "cluster": "c1",
                     "node": "node-e", "gpu": "2", "uuid": "GPU-e2", "xid": "48"}, "xidaction"),
    "hang-linkdown": ({"alertname": "RDMALinkDown", "severity": "critical", "cluster": "c1", "node": "node-f",
                       "device": "mlx5_2", "port": "1"}, "hangnodes"),
    "hang-pfc": ({"alertname": "RDMAPFCStorm", "severity": "critical", "reason": "storm_error_events",
                  "cluster": "c1", "node": "node-f", "netdev": "eth2"}, "hangnodes"),
    "desync-hang": ({"alertname": "LLMTrainingHang", "severity": "critical",
                     "reason": "all_ranks_in_collective", "cluster": "c1", "job_id": "bert",
                     "pg": "0"}, "desync"),
}
ACTIVE = {
    "other-job": {"alertname": "LLMTrainingStraggler", "severity": "warning", "cluster": "c1",
                  "job_id": "gpt", "rank": "2", "node": "node-b"},
    "other-cluster": {"alertname": "LLMTrainingMFULow", "severity": "warning", "cluster": "c2",
                      "job_id": "llama"},
    "not-a-symptom": {"alertname": "LLMTrainingLossNonFinite", "severity": "critical", "cluster": "c1",
                      "job_id": "llama"},
    "other-gpu": {"alertname": "GPUThermalThrottle", "severity": "warning", "cluster": "c1", "node": "node-a",
                  "gpu": "1", "uuid": "GPU-a1", "reason": "sw_thermal_slowdown"},
    "other-port": {"alertname": "RDMAPacketLoss", "severity": "warning", "cluster": "c1", "node": "node-a",
                   "device": "mlx5_1", "port": "1"},
    "other-node": {"alertname": "LLMMonCollectorFailing", "severity": "warning", "cluster": "c1",
                   "node": "node-d", "collector": "gpu"},
    "other-rank": {"alertname": "GPUMemoryOOMRisk", "severity": "warning", "reason": "reserved_near_capacity",
                   "cluster": "c1", "job_id": "llama", "rank": "6", "node": "node-b", "uuid": "GPU-b6"},
    "other-xid": {"alertname": "GPUXidError", "severity": "critical", "cluster": "c1", "node": "node-e",
                  "gpu": "2", "uuid": "GPU-e2", "xid": "79"},
    "hang-other-node": {"alertname": "RDMALinkDown", "severity": "critical", "cluster": "c1", "node": "node-g",
                        "device": "mlx5_2", "port": "1"},
    "desync-other-job": {"alertname": "LLMTrainingHang", "severity": "critical",
                         "reason": "all_ranks_in_collective", "cluster": "c1", "job_id": "t5",
                         "pg": "0"},
    "hang-not-network": {"alertname": "DiskReadSaturated", "severity": "warning", "cluster": "c1",
                         "node": "node-f", "device": "md0"},
    "other-name": {"alertname": "GPUXidError", "severity": "warning", "cluster": "c1", "node": "node-d",
                   "gpu": "1", "uuid": "GPU-d1", "xid": "13"},
}


def test_each_inhibition_mutes_exactly_its_targets(alertmanager: Alertmanager) -> None:
    every = {**SOURCES, **{name: labels for name, (labels, _) in MUTED.items()}, **ACTIVE}
    alertmanager.post([{"labels": labels, "annotations": {"summary": name}, **_window()}
                       for name, labels in every.items()])
    expected = {name: [] for name in [*SOURCES, *ACTIVE]}
    deadline = time.monotonic() + 10
    while True:
        got = {a["annotations"]["summary"]: a for a in alertmanager.alerts()}
        fingerprint = {name: got[name]["fingerprint"] for name in SOURCES if name in got}
        expected.update({name: [fingerprint.get(source)] for name, (_, source) in MUTED.items()})
        state = {name: got[name]["status"]["inhibitedBy"] for name in got}
        if state == expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert state == expected
    assert all(got[name]["status"]["state"] == ("suppressed" if name in MUTED else "active") for name in got)


def test_a_hung_job_pages_once_with_its_network_cause_and_the_network_alert_does_not(
        tmp_path: Path) -> None:
    """The shipped routing in a real Alertmanager delivering to a webhook: the hang of job llama
    (two ranks, two nodes, plus its NaN loss) is one notification; node-b's link down, which the
    hang page names, is muted by LLMTrainingHangNodes; the same alert on a node without the job
    pages on its own."""
    receiver = stack.WebhookReceiver()
    manager = stack.start_alertmanager(
        stack.find_binary("alertmanager", "prometheus-alertmanager"), tmp_path,
        stack.alertmanager_config(receiver.url, group_wait="1s", group_interval="2s"))
    try:
        job = {"severity": "critical", "cluster": "c1", "job_id": "llama"}
        link = {"alertname": "RDMALinkDown", "severity": "critical", "cluster": "c1",
                "device": "mlx5_0", "port": "1"}
        alerts = [
            {**job, "alertname": "LLMTrainingHang", "reason": "rank_not_enqueued", "rank": "3",
             "node": "node-b", "pg": "0"},
            {**job, "alertname": "LLMTrainingHang", "reason": "rank_not_enqueued", "rank": "3",
             "node": "node-b", "pg": "1"},
            {**job, "alertname": "LLMTrainingLossNonFinite"},
            {"alertname": "LLMTrainingHangNodes", "severity": "info", "cluster": "c1",
             "job_id": "llama", "node": "node-a"},
            {"alertname": "LLMTrainingHangNodes", "severity": "info", "cluster": "c1",
             "job_id": "llama", "node": "node-b"},
            {**link, "node": "node-b"},
            {**link, "node": "node-e"},
        ]
        response = requests.post(f"{manager.url}/api/v2/alerts", timeout=5, json=[
            {"labels": labels, "annotations": {"description": "d"}, **_window()}
            for labels in alerts])
        assert response.status_code == 200, response.text

        def delivered() -> list[tuple[str, tuple[tuple[str, str], ...], int]]:
            return sorted((n.receiver, tuple(sorted(n.payload["groupLabels"].items())),
                           len(n.payload["alerts"])) for n in receiver.snapshot()
                          if n.receiver != "record-only")

        deadline = time.monotonic() + 60
        while len(delivered()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        states = {(a["labels"]["alertname"], a["labels"].get("node")): a["status"]["state"]
                  for a in requests.get(f"{manager.url}/api/v2/alerts", timeout=5).json()}
        assert delivered() == [
            ("pager", (("alertname", "RDMALinkDown"), ("cluster", "c1"), ("node", "node-e")), 1),
            ("pager", (("cluster", "c1"), ("job_id", "llama")), 3)]
        assert states[("RDMALinkDown", "node-b")] == "suppressed"
        assert states[("RDMALinkDown", "node-e")] == "active"
    finally:
        manager.stop()
        receiver.close()


def test_a_job_page_leaves_before_a_node_alert_raised_with_it(tmp_path: Path) -> None:
    """Job alerts wait 10 s to be grouped, node alerts the default 30 s: raised together, the
    hang page goes out about 20 s before the node's (20 s of the 90 s page target)."""
    arrivals: dict[str, float] = {}
    receiver = stack.WebhookReceiver(on_notify=lambda note: arrivals.setdefault(
        "job" if "job_id" in note.payload["groupLabels"] else "node", time.monotonic()))
    manager = stack.start_alertmanager(
        stack.find_binary("alertmanager", "prometheus-alertmanager"), tmp_path,
        stack.alertmanager_config(receiver.url))
    try:
        alerts = [{"alertname": "LLMTrainingHang", "severity": "critical", "cluster": "c1",
                   "job_id": "llama", "reason": "rank_not_enqueued", "rank": "3",
                   "node": "node-b", "pg": "0"},
                  {"alertname": "RDMALinkDown", "severity": "critical", "cluster": "c1",
                   "node": "node-e", "device": "mlx5_0", "port": "1"}]
        response = requests.post(f"{manager.url}/api/v2/alerts", timeout=5, json=[
            {"labels": labels, "annotations": {"description": "d"}, **_window()}
            for labels in alerts])
        assert response.status_code == 200, response.text
        deadline = time.monotonic() + 300
        while len(arrivals) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert arrivals.keys() == {"job", "node"}, arrivals
        assert arrivals["node"] - arrivals["job"] > 10, arrivals
    finally:
        manager.stop()
        receiver.close()
