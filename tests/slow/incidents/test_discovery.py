"""`llmmon incident JOB --prometheus URL` finds the job's nodes through a real Prometheus that
scrapes them: the `instance` of each daemon exporting the job's llmmon_rank_info (or only its
llmmon_job_incident_info, once its ranks are gone), and no other."""

from __future__ import annotations

import json
from typing import Iterator

import pytest
import requests

from llmmon.cli import main
from llmmon.simulate import stack
from tests.helpers import free_port, wait_for
from tests.incidents.nodes import JOB, NodeServer, node_a, node_b, write_incident

RANK_INFO = '# TYPE llmmon_rank_info gauge\n' + ''.join(
    f'llmmon_rank_info{{job_id="{{job}}",rank="{r}"}} 1\n' for r in (0, 1))
INCIDENT_INFO = ('# TYPE llmmon_job_incident_info gauge\n'
                 'llmmon_job_incident_info{job_id="{job}",incident="{id}"} 1\n')


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[str, NodeServer, NodeServer, NodeServer]]:
    """Prometheus scraping node a (the job's ranks), node b (the job's incident only) and a
    node of another job that holds an incident of this job's name it must never be asked for."""
    tmp_path = tmp_path_factory.mktemp("cluster")
    binary = stack.find_binary("prometheus")
    assert binary, "prometheus is not installed: scripts/install.sh --test"
    servers = []
    for name, made, metrics in (
            ("a", node_a(), RANK_INFO.replace("{job}", JOB)),
            ("b", node_b(), INCIDENT_INFO.replace("{job}", JOB).replace(
                "{id}", node_b()[0]["id"])),
            ("other", node_b(), RANK_INFO.replace("{job}", "other-job"))):
        root = tmp_path / name
        root.mkdir()
        write_incident(root, *made)
        servers.append(NodeServer(root, metrics=metrics).__enter__())
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
              "scrape_configs": [{"job_name": "llmmon", "static_configs": [
                  {"targets": [s.address for s in servers]}]}]}
    prometheus = stack.start_prometheus(binary, tmp_path / "prometheus", config)
    try:
        def scraped() -> bool:
            answer = requests.get(f"{prometheus.url}/api/v1/query", timeout=5, params={
                "query": "count(llmmon_rank_info) + count(llmmon_job_incident_info)"}).json()
            return answer["data"]["result"][:1] != [] and \
                answer["data"]["result"][0]["value"][1] == "5"
        wait_for(scraped, 60, "Prometheus to scrape the three nodes")
        yield prometheus.url, servers[0], servers[1], servers[2]
    finally:
        prometheus.stop()
        for server in servers:
            server.__exit__()


def test_the_nodes_of_the_job_come_from_prometheus_and_no_other_is_asked(
        cluster: tuple[str, NodeServer, NodeServer, NodeServer],
        capsys: pytest.CaptureFixture[str]) -> None:
    url, a, b, other = cluster
    assert main(["incident", JOB, "--prometheus", url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [n["source"] for n in report["nodes"]] == [a.url, b.url]
    assert report["culprit"]["ranks"] == [3] and report["missing"] == []
    assert not any(p.startswith("/api/") for p in other.requests), other.requests
    assert main(["diagnose", "--prometheus", url, "--incident", JOB]) == 1
    assert "culprit: rank 3 (stack_root), named by node-b" in capsys.readouterr().out


def test_an_unknown_job_and_an_unreachable_prometheus_are_clear_errors(
        cluster: tuple[str, NodeServer, NodeServer, NodeServer],
        capsys: pytest.CaptureFixture[str]) -> None:
    url = cluster[0]
    assert main(["incident", 'no"such\\job', "--prometheus", url]) == 2
    assert capsys.readouterr().err == (
        f"llmmon incident: Prometheus at {url} knows no job 'no\"such\\\\job' (no "
        f"llmmon_rank_info nor llmmon_job_incident_info series with "
        f"job_id='no\"such\\\\job')\n")
    down = f"http://127.0.0.1:{free_port()}"
    assert main(["incident", JOB, "--prometheus", down, "--timeout", "3"]) == 2
    assert capsys.readouterr().err.startswith(f"llmmon incident: {down}: ")
