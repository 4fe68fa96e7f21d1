"""Every dashboard query runs on a real Prometheus that scrapes real exporters on fixture data.

Two `llmmon serve` processes stand for two nodes of one cluster: node-a reads the main fixture
trees (sysfs, procfs, the 8-GPU NVML replay, ethtool and netlink dumps) and runs the 4-rank
fixture job of the rank spool; node-b reads the HGX topology tree. A Debian Prometheus 2.42 on
127.0.0.1 scrapes both every second under job "llmmon" (the job the alerts expect), relabels
them with `node` and `cluster` as deploy/'s scrape configs do, and evaluates every rule file of
alerts/rules/ every second. procfs and the spool are copies that move forward each second.

Each panel query runs with its variables at "All" and `$__rate_interval` at 10 s. It must
succeed and return data, except the queries in MAY_BE_EMPTY, which only have to succeed.
"""

from __future__ import annotations

import contextlib
import glob
import json
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

from llmmon_reporter.spoolfile import write_atomic
from llmmon_reporter.stepstats import StepStats
from tests.conftest import FIXTURES, ROOT, ServeProcess
from tests.helpers import free_port, stop_process

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
    ("llmmon-triage", "GPU errors", "A"): "llmmon_gpu_xid_errors_total exists after an XID only",
    ("llmmon-cluster-wall", "Lemon nodes"): "lists nodes with lemon alert-hours only",
    **{(board, "Pace against its own"): "the fixture job's Flight Recorder rings hold no "
       "30 s of collectives to compare with" for board in ("llmmon-job", "llmmon-triage")},
    **{(board, "TCP segments retransmitted"): "TCP counters come from the ranks' own /proc, "
       "and the fixture job's pids are no live processes" for board in ("llmmon-job",
                                                                       "llmmon-triage")},
    **{(board, "Memory repair state", ref): "fabric series exist on NVSwitch systems only (the "
       "H200 capture's driver answers no fabric call)"
       for board in ("llmmon-node", "llmmon-triage") for ref in ("E", "F")},
}
NVML = FIXTURES / "nvml" / "h200x8"
# (node, flag, fixture): the read-only inputs of each simulated node.
# node-b, the HGX topology tree, runs without the gpu collector: it replays the same NVML
# file as node-a only so that the topology collector knows its GPUs' PCI addresses, and two
# nodes must never export the same GPU uuid (the rules join on uuid).
NODE_INPUTS = (
    ("node-a", "--path.sysfs", FIXTURES / "sys"),
    ("node-a", "--fake-nvml", NVML),
    ("node-a", "--ethtool.dumps", FIXTURES / "ethtool"),
    ("node-a", "--netlink.dump", FIXTURES / "netlink" / "links.json"),
    ("node-b", "--path.sysfs", FIXTURES / "topology" / "hgx" / "sys"),
    ("node-b", "--fake-nvml", NVML),
)
NODE_FLAGS = {"node-a": (), "node-b": ("--no-collector.gpu",)}
SPOOL = FIXTURES / "spool" / "nccl4"  # a 4-rank job, run on node-a
NCCL_LOG = FIXTURES / "nccl" / "logs" / "nccl-2.19.3-roce-ro.log"
NCCL_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p.log",
            "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_P2P_DISABLE": "1"}
# Fast cadences so that counters move between the 1 s scrapes.
FAST = ("--collector.disk.interval=1s", "--collector.ranks.interval=1s")
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


class Job:
    """The fixture job, copied into a work directory, run on node-a's GPUs and kept training.

    The spool and NVML fixtures come from different captures, so each rank's state file gets
    the uuid of GPU <local_rank> of the NVML replay: the dashboards join ranks to GPUs on uuid
    (power of the job's GPUs, the peak FLOPs behind MFU). `tick()` is one more second of
    training, written with the reporter's own code: each rank takes a step (StepStats, with
    the fixture's tokens and model FLOPs per step) and its Flight Recorder ring moves on by as
    many records as it holds (same collectives, new record ids).
    """

    def __init__(self, fixture: Path, spool: Path, nvml: Path, procfs: Path) -> None:
        shutil.copytree(fixture, spool)
        self.spool = spool
        uuids = [json.loads(path.read_text())["device0"]["uuid"]["ok"]
                 for path in sorted(nvml.glob("*.json"))]
        self.ranks: list[tuple[Path, dict, StepStats, dict]] = []
        for path in sorted(spool.glob("*/rank_*.json")):
            document = json.loads(path.read_text(encoding="utf-8"))
            if document["kind"] != "state":
                continue
            document["identity"]["uuid"] = uuids[document["identity"]["local_rank"]]
            # NCCL's side, as a reporter of today sends it: its NCCL variables (P2P switched
            # off, so the findings panels have one) and a real NCCL log where it names it
            document["identity"]["nccl_env"] = NCCL_ENV
            pid = document["identity"]["pid"]
            log = procfs / str(pid) / "root" / "tmp" / f"nccl.node-a.{pid}.log"
            log.parent.mkdir(parents=True)
            log.write_bytes(NCCL_LOG.read_bytes())
            done = document["step"]
            per_step = {"tokens": done["tokens"] / done["steps"],
                        "model_flops": done["model_flops"] / done["steps"]}
            self.ranks.append((path, document, StepStats(), per_step))
        self.tick()

    def tick(self) -> None:
        for path, document, stats, per_step in self.ranks:
            stats.step(loss=2.0, **per_step)
            document["step"] = stats.snapshot()
            _write(path, document)
        for path in self.spool.glob("*/rank_*.entries.json"):
            document = json.loads(path.read_text(encoding="utf-8"))
            ids = [entry["record_id"] for entry in document["dump"]["entries"]]
            for entry in document["dump"]["entries"]:
                entry["record_id"] += max(ids) - min(ids) + 1
            _write(path, document)


def _write(path: Path, document: dict) -> None:
    write_atomic(str(path.parent), path.name, json.dumps(document).encode())


class Activity(threading.Thread):
    """Moves the copied fixtures forward each second, as a busy node would.

    Static fixtures make every rate() 0, and the rules that divide by a rate (read latency,
    bus bandwidth, the straggler score) are then rightly empty; a node at work is what the
    dashboards are for.
    """

    def __init__(self, procfs: Path, job: Job) -> None:
        super().__init__(daemon=True)
        self.procfs, self.job = procfs, job
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.done.wait(1.0):
                _advance_diskstats(self.procfs / "diskstats")
                self.job.tick()
        except BaseException as exc:  # reported by the fixture: a frozen node is no test
            self.error = exc

    def stop(self) -> None:
        self.done.set()
        if self.is_alive():
            self.join(5)
        if self.error is not None:
            raise self.error


def _prepare(work: Path) -> tuple[dict[str, list[str]], Activity]:
    """Flags per node, and the Activity that keeps the copied procfs and spool moving."""
    shutil.copytree(FIXTURES / "proc", work / "proc")
    args = {node: [*FAST, *flags, f"--path.procfs={work / 'proc'}"]
            for node, flags in NODE_FLAGS.items()}
    for node, flag, path in NODE_INPUTS:
        args[node].append(f"{flag}={path}")
    args["node-a"].append(f"--spool.dir={work / 'spool'}")
    return args, Activity(work / "proc", Job(SPOOL, work / "spool", NVML, work / "proc"))


def _every_second(rules: Path) -> list[str]:
    """The shipped rule files with each group's own `interval` (1m for the NCCL rules, 15m for
    node health) dropped, so every rule is evaluated each second, the global interval: a
    group's first evaluation would otherwise come up to an interval after start."""
    rules.mkdir()
    files = []
    for path in sorted(glob.glob(str(ROOT / "alerts" / "rules" / "*.y*ml"))):
        content = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        for group in content["groups"]:
            group.pop("interval", None)
        out = rules / Path(path).name
        out.write_text(yaml.safe_dump(content, sort_keys=False), encoding="utf-8")
        files.append(str(out))
    return files


def _prometheus_config(targets: dict[str, str], rules: Path) -> dict:
    """1 s scrapes of the exporters; `node` and `cluster` set by relabelling, as deploy/ does."""
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                   "evaluation_interval": "1s"},
        "rule_files": _every_second(rules),
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
    """Both nodes' exporters, a Prometheus scraping them, and their inputs moving."""
    tmp = tmp_path_factory.mktemp("live")
    nodes, activity = _prepare(tmp)
    servers: list[ServeProcess] = []
    process = None
    try:
        for node, args in nodes.items():
            servers.append(ServeProcess(args, tmp / f"{node}.log"))
        for server in servers:
            server.wait_ready()
        activity.start()
        targets = {node: server.url.removeprefix("http://")
                   for node, server in zip(nodes, servers)}
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump(_prometheus_config(targets, tmp / 'rules')), encoding="utf-8")
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
        if process is not None:
            stop_process(process)
        for server in servers:
            server.stop()
        activity.stop()


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
