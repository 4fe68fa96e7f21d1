"""One real stack for every scenario: `llmmon simulate`, Prometheus and Alertmanager.

`llmmon simulate` runs one node per scenario (each with its own job) and serves each with the
unmodified exporter; Debian's Prometheus scrapes them every second and evaluates the shipped
rules with every `for:` cut to 5 s by `alerts.render --for-override`; Alertmanager routes
with the shipped tree and inhibit rules (only group_wait/group_interval shortened) to a
webhook receiver inside the test, one path per receiver.  Scenario time runs 20 times faster,
rates stay real.  All scenarios share the wall clock, so the suite takes as long as its
slowest alert: the hang, whose shipped window is 180 s of no progress.  Every process is
stopped by PID, including the daemons, should the simulator itself not stop.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import pytest

from llmmon.simulate import layout, stack
from tests.conftest import ROOT
from tests.e2e.cases import CASES, Case

SPEED = 20
INTERVAL = "1s"
# Longer than a few collector intervals (5 s): a 1 s link flap that rdma runs happen to see
# stays in the exposition for that interval, and must not read as a down link.
FOR = "15s"
START_TIMEOUT = 150.0
COLLECTORS = ("gpu", "rdma", "nic", "ranks", "disk", "netdev")
T = TypeVar("T")


@dataclass
class Alert:
    receiver: str
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]


@dataclass
class Stack:
    work: Path
    prometheus: stack.Server
    alertmanager: stack.Server
    receiver: stack.WebhookReceiver
    started: float  # time.monotonic() when the stack was up

    def node(self, case: Case) -> layout.NodeLayout:
        index = CASES.index(case)
        return layout.build(f"sim-{index:02d}", index)

    def job(self, case: Case) -> str:
        return f"pretrain-{CASES.index(case)}"

    def notified(self) -> list[Alert]:
        return [Alert(n.receiver, alert["status"], alert["labels"], alert["annotations"])
                for n in self.receiver.snapshot() for alert in n.payload["alerts"]]

    def about(self, case: Case) -> list[Alert]:
        """Notified alerts that name the case's node or job."""
        node, job = self.node(case).name, self.job(case)
        return [a for a in self.notified()
                if a.labels.get("node") == node or a.labels.get("job_id") == job]

    def daemons(self) -> list[dict[str, Any]]:
        """The simulator's manifest: node, url, pid of each daemon."""
        return json.loads((self.work / "sim" / "exporters.json").read_text())

    def alertmanager_alerts(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.alertmanager.url + "/api/v2/alerts", timeout=5) as r:
            return json.load(r)


def wait_for(what: str, probe: Callable[[], T | None], deadline: float) -> T:
    """Poll `probe` until it returns something; fail at `deadline` (time.monotonic())."""
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _kill_daemons(manifest: Path) -> None:
    """Daemons the simulator started and did not stop (it was killed): stop them by PID."""
    if not manifest.exists():
        return
    for entry in json.loads(manifest.read_text()):
        try:
            cmdline = Path(f"/proc/{entry['pid']}/cmdline").read_bytes()
        except OSError:
            continue
        if b"exporter" in cmdline:
            os.kill(entry["pid"], signal.SIGKILL)


@pytest.fixture(scope="module")  # stopped after test_paging: never beside the other tests
def e2e() -> Iterator[Stack]:
    prometheus_bin = stack.find_binary("prometheus")
    alertmanager_bin = stack.find_binary("alertmanager", "prometheus-alertmanager")
    assert prometheus_bin and alertmanager_bin, \
        "prometheus and prometheus-alertmanager are not installed: scripts/install.sh --test"
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix="llmmon-e2e-", dir=shm))
    receiver = stack.WebhookReceiver()
    servers: list[stack.Server] = []
    scenarios = [arg for index, case in enumerate(CASES) if case.name != "healthy"
                 for arg in ("--scenario", case.scenario.replace(":", f"@sim-{index:02d}:", 1)
                             if ":" in case.scenario else f"{case.scenario}@sim-{index:02d}")]
    with open(work / "simulate.log", "wb") as log:
        simulator = subprocess.Popen(
            [sys.executable, "-m", "llmmon", "simulate", f"--dir={work / 'sim'}",
             f"--nodes={len(CASES)}", "--job-nodes=1", "--port=0", f"--speed={SPEED}",
             *(f"--serve-arg=--collector.{c}.interval={INTERVAL}" for c in COLLECTORS),
             *scenarios], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        targets = work / "sim" / "targets.json"
        wait_for("the simulator's targets file",
                 lambda: targets.exists() or simulator.poll() is not None,
                 time.monotonic() + START_TIMEOUT)
        assert simulator.poll() is None, (work / "simulate.log").read_text()
        servers.append(stack.start_alertmanager(
            alertmanager_bin, work / "alertmanager",
            stack.alertmanager_config(receiver.url, group_wait="1s", group_interval="2s")))
        servers.append(stack.start_prometheus(
            prometheus_bin, work / "prometheus",
            stack.prometheus_config(targets, stack.rules_dir(work, FOR),
                                    servers[0].url.removeprefix("http://"), INTERVAL)))
        # Deadlines count from here: the daemons are up, so the hang's 180 s have begun.
        yield Stack(work, servers[1], servers[0], receiver, time.monotonic())
    finally:
        for server in reversed(servers):
            server.stop()
        if simulator.poll() is None:
            simulator.terminate()
            try:
                simulator.wait(30)
            except subprocess.TimeoutExpired:
                simulator.kill()
                simulator.wait(10)
        _kill_daemons(work / "sim" / "exporters.json")
        receiver.close()
        shutil.rmtree(work, ignore_errors=True)
