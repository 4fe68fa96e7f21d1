"""The scale-out path for real: a Prometheus agent scrapes a live exporter with the shipped
deploy/prometheus/agent.yml and remote-writes into a second Prometheus, or into
VictoriaMetrics, which then answers queries for it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.deploy.deploy_helpers import ROOT, require, wait_for_port
from tests.helpers import free_port, stop_process, wait_for

PROMETHEUS = ROOT / "deploy" / "prometheus"


def _query(url: str, promql: str) -> list[dict]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10)
    response.raise_for_status()
    return response.json()["data"]["result"]


def _receiver(store: str, tmp_path: Path, port: int) -> tuple[str, list[str]]:
    """The store's binary and flags: a Prometheus with its remote-write receiver on, or
    VictoriaMetrics (it hides the newest 30 s from queries by default; 1 s here)."""
    if store == "prometheus":
        (tmp_path / "receiver.yml").write_text("global: {}\n")
        return require("prometheus"), [
            f"--config.file={tmp_path / 'receiver.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            "--web.enable-remote-write-receiver", f"--web.listen-address=127.0.0.1:{port}"]
    return require("victoria-metrics"), [
        f"-storageDataPath={tmp_path / 'vm'}", f"-httpListenAddr=127.0.0.1:{port}",
        "-search.latencyOffset=1s"]


@pytest.mark.parametrize("store", ["prometheus", "victoria-metrics"])
def test_agent_remote_writes_into_the_store(tmp_path: Path, web_serve, store: str):
    exporter = web_serve()
    receiver_port, agent_port = free_port(), free_port()
    # The shipped agent.yml with only the store's URL and the intervals changed.
    agent = yaml.safe_load((PROMETHEUS / "agent.yml").read_text())
    agent["remote_write"][0]["url"] = f"http://127.0.0.1:{receiver_port}/api/v1/write"
    agent["remote_write"][0]["queue_config"]["batch_send_deadline"] = "1s"
    agent["global"].update(scrape_interval="1s", scrape_timeout="1s")
    (tmp_path / "agent.yml").write_text(yaml.safe_dump(agent))
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "nodes.yml").write_text(yaml.safe_dump(
        [{"targets": [f"127.0.0.1:{exporter.port}"], "labels": {"node": "test-node"}}]))
    prometheus = require("prometheus")
    processes = []
    try:
        for name, command, port in (
                ("receiver", _receiver(store, tmp_path, receiver_port), receiver_port),
                ("agent", (prometheus, [
                    "--enable-feature=agent", f"--config.file={tmp_path / 'agent.yml'}",
                    f"--storage.agent.path={tmp_path / 'wal'}",
                    f"--web.listen-address=127.0.0.1:{agent_port}"]), agent_port)):
            log = tmp_path / f"{name}.log"
            with open(log, "wb") as sink:
                processes.append(subprocess.Popen([command[0], *command[1]],
                                                  stdout=sink, stderr=subprocess.STDOUT))
            wait_for_port(port, processes[-1], log)
        receiver = f"http://127.0.0.1:{receiver_port}"
        promql = 'llmmon_exporter_collector_success{job="llmmon",collector="disk"}'
        (series,) = wait_for(lambda: _query(receiver, promql), 90, "the series to arrive",
                             interval=0.5, context=(tmp_path / "agent.log").read_text)
        assert series["metric"]["node"] == "test-node"
        assert series["metric"]["cluster"] == agent["global"]["external_labels"]["cluster"]
        assert series["value"][1] == "1"
        assert _query(receiver, 'count(up{job="llmmon"} == 1)')[0]["value"][1] == "1"
    finally:
        for process in processes:
            stop_process(process)
