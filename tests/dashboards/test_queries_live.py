"""Every dashboard query runs on a real Prometheus that scrapes real exporters on fixture data.

Two `llmmon serve` processes stand for two nodes of one cluster: node-a reads the main fixture
trees (sysfs, procfs, the 8-GPU NVML replay, ethtool and netlink dumps, rank spool files) and
node-b the HGX topology tree. A Debian Prometheus 2.42 on 127.0.0.1 scrapes both every second
under job "llmmon" (the job the alerts expect), relabels them with `node` and `cluster` the way
the Kubernetes scrape config does, and evaluates every rule file of alerts/rules/ each second.

Each panel query runs with its variables set to "All" and `$__rate_interval` to 10 s. It must
succeed and return data, except the queries listed in MAY_BE_EMPTY, which only have to
succeed. Fixture trees that have not landed yet are skipped by discovery: the test then
reports the queries they would feed as empty.
"""

from __future__ import annotations

import contextlib
import glob
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import requests
import yaml

from tests.conftest import FIXTURES, ROOT, Server, free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
CLUSTER = "test"
RANGES = {"__rate_interval": "10s", "__range": "1m"}
DATA_TIMEOUT = 40.0
# Queries that are empty on healthy data; they must still parse and evaluate.
MAY_BE_EMPTY = {
    ("llmmon-cluster-wall", "Critical alerts"): "counts firing critical alerts only",
    ("llmmon-cluster-wall", "Hung jobs"): "counts LLMTrainingHang alerts only",
    ("llmmon-cluster-wall", "Ports in PFC storm"): "lists storming ports only",
    ("llmmon-cluster-wall", "Firing alerts"): "lists firing alerts only",
    ("llmmon-node", "GPU errors", "A"): "llmmon_gpu_xid_errors_total exists after an XID only",
    ("llmmon-job", "Allocator retries and OOMs", "B"): "OOM counters appear at the first OOM",
    ("llmmon-triage", "Allocator retries and OOMs", "B"): "OOM counters appear at the first OOM",
    ("llmmon-triage", "GPU errors", "A"): "llmmon_gpu_xid_errors_total exists after an XID only",
}
# (flag, fixture, node): the inputs each simulated node reads, where the fixture exists.
NODE_INPUTS = (
    ("--path.sysfs", FIXTURES / "sys", "node-a"),
    ("--path.procfs", FIXTURES / "proc", "node-a"),
    ("--fake-nvml", FIXTURES / "nvml" / "h200x8", "node-a"),
    ("--ethtool.dumps", FIXTURES / "ethtool", "node-a"),
    ("--netlink.dump", FIXTURES / "netlink" / "links.json", "node-a"),
    ("--spool.dir", FIXTURES / "spool", "node-a"),
    ("--path.sysfs", FIXTURES / "topology" / "hgx" / "sys", "node-b"),
    ("--path.procfs", FIXTURES / "proc", "node-b"),
    ("--fake-nvml", FIXTURES / "nvml" / "h200x8", "node-b"),
)
# Fast cadences so that counters move between the 1 s scrapes.
FAST = ("--collector.disk.interval=1s",)
# Per-second increments of /proc/diskstats fields (reads, merged, sectors, ms, writes, ...):
# 40 reads of 2 ms each, 8 writes, 40 % busy.
DISK_STEP = (40, 0, 2048, 80, 8, 0, 512, 16, 0, 400, 800)


def _advance_diskstats(path: Path) -> None:
    """One second of disk activity: every device's counters move forward."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        major, minor, name, *values = line.split()
        moved = [str(int(v) + step) for v, step in zip(values, DISK_STEP)]
        lines.append(" ".join([major, minor, name, *moved, *values[len(moved):]]))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


class Activity(threading.Thread):
    """Moves the copied fixtures forward each second, as a busy node would.

    Static fixtures make every rate() 0, and rules that divide by a rate (read latency per
    read) are then rightly empty; a node at work is what the dashboards are for.
    """

    def __init__(self, procfs: Path) -> None:
        super().__init__(daemon=True)
        self.procfs = procfs
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            _advance_diskstats(self.procfs / "diskstats")


def _node_args(work: Path) -> dict[str, list[str]]:
    """Flags per node; procfs is copied into `work` because Activity writes to it."""
    args: dict[str, list[str]] = {}
    for flag, path, node in NODE_INPUTS:
        if path == FIXTURES / "proc":
            path = work / "proc"
            if not path.exists():
                shutil.copytree(FIXTURES / "proc", path)
        if path.exists():
            args.setdefault(node, [*FAST]).append(f"{flag}={path}")
    return args


def _prometheus_config(targets: dict[str, str]) -> dict:
    """1 s scrapes of the exporters; `node` and `cluster` set by relabelling, as deploy/ does."""
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                   "evaluation_interval": "1s"},
        "rule_files": sorted(glob.glob(str(ROOT / "alerts" / "rules" / "*.y*ml"))),
        "scrape_configs": [{
            "job_name": "llmmon",
            "static_configs": [{"targets": [address], "labels": {"__node_name": node}}
                               for node, address in targets.items()],
            "relabel_configs": [
                {"source_labels": ["__node_name"], "target_label": "node"},
                {"target_label": "cluster", "replacement": CLUSTER},
            ],
        }],
    }


def _substitute(expr: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda match: values[match.group(1)], expr)


@dataclass
class Live:
    url: str
    deadline: float  # when waiting for data stops, shared by the tests of this module

    def query(self, expr: str) -> dict:
        return requests.get(f"{self.url}/api/v1/query", params={"query": expr},
                            timeout=10).json()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """Exporters for the discovered nodes, a Prometheus scraping them, moving fixtures."""
    tmp = tmp_path_factory.mktemp("live")
    nodes = _node_args(tmp)
    activity = Activity(tmp / "proc")
    servers: list[Server] = []
    process = None
    try:
        for node, args in nodes.items():
            servers.append(Server(args, tmp / f"{node}.log"))
        for server in servers:
            server.wait_ready()
        activity.start()
        targets = {node: server.url.removeprefix("http://")
                   for node, server in zip(nodes, servers)}
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump(_prometheus_config(targets)), encoding="utf-8")
        port = free_port()
        with open(tmp / "prometheus.log", "wb") as log:
            process = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready:\n{(tmp / 'prometheus.log').read_text()}")
            time.sleep(0.2)
        yield Live(url, time.monotonic() + DATA_TIMEOUT)
    finally:
        activity.done.set()
        if process is not None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        for server in servers:
            server.stop()


def _ready(url: str) -> bool:
    with contextlib.suppress(requests.RequestException):
        return requests.get(f"{url}/-/ready", timeout=1).status_code == 200
    return False


@pytest.fixture(scope="module")
def values(dashboards: dict[str, dict]) -> dict[str, str]:
    """Every variable at its "All" value (its allValue, else any value), plus the ranges."""
    found = dict(RANGES)
    for model in dashboards.values():
        for variable in model["templating"]["list"]:
            found.setdefault(variable["name"], variable.get("allValue") or ".+")
    return found


def _may_be_empty(target) -> bool:
    return ((target.panel.dashboard, target.panel.model["title"]) in MAY_BE_EMPTY
            or (target.panel.dashboard, target.panel.model["title"], target.ref)
            in MAY_BE_EMPTY)


def test_may_be_empty_names_real_queries(targets) -> None:
    names = {(t.panel.dashboard, t.panel.model["title"]) for t in targets}
    names |= {(t.panel.dashboard, t.panel.model["title"], t.ref) for t in targets}
    assert set(MAY_BE_EMPTY) <= names, f"stale entries: {set(MAY_BE_EMPTY) - names}"


def _until_clean(live: Live, check) -> list[str]:
    """Run `check` (which lists problems) each second until it lists none or time runs out."""
    while True:
        problems = check()
        if not problems or time.monotonic() > live.deadline:
            return problems
        time.sleep(1)


def test_every_panel_query_returns_data(live: Live, targets, values) -> None:
    def check() -> list[str]:
        problems = []
        for target in targets:
            answer = live.query(_substitute(target.expr, values))
            if answer.get("status") != "success":
                problems.append(f"{target.name}: {answer.get('error')}\n    {target.expr}")
            elif not answer["data"]["result"] and not _may_be_empty(target):
                problems.append(f"{target.name}: no data\n    {target.expr}")
        return problems

    problems = _until_clean(live, check)
    assert not problems, f"{len(problems)} of {len(targets)} queries failed:\n" + "\n".join(
        problems)


def test_every_variable_lists_values(live: Live, dashboards, values) -> None:
    def check() -> list[str]:
        problems = []
        for name, model in dashboards.items():
            for variable in model["templating"]["list"][1:]:
                query = variable["query"]["query"]
                match = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
                assert match, f"{name}: ${variable['name']}: unexpected query {query}"
                series = requests.get(
                    f"{live.url}/api/v1/series", timeout=10,
                    params={"match[]": _substitute(match.group(1), values)}).json()["data"]
                if not any(match.group(2) in labels for labels in series):
                    problems.append(f"{name}: ${variable['name']} lists nothing ({query})")
        return problems

    problems = _until_clean(live, check)
    assert not problems, "\n".join(problems)
