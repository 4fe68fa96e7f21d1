"""One real stack for every scenario: `llmmon simulate`, Prometheus and Alertmanager.

`llmmon simulate` runs one node per scenario (each with its own job) and serves each with the
unmodified exporter; Debian's Prometheus scrapes them every 2 s and evaluates the shipped
rules with every `for:` cut to 15 s by `alerts.render --for-override` and the hang window
(`hang_window_seconds`) cut from the shipped 180 s to 30 s by `--set`, which `llmmon diagnose`
is given too (`--alerts-config`); Alertmanager routes
with the shipped tree and inhibit rules (only group_wait/group_interval shortened) to a
webhook receiver inside the test, one path per receiver.  Scenario time runs 20 times faster,
rates stay real.  All scenarios share the wall clock, so the suite takes as long as its
slowest alert: the data loader's starvation, whose 5-minute rates need ~2 minutes of it (the
hang, at the shipped window, took 3 minutes of no progress).  Every process is
stopped by PID, including the daemons, should the simulator itself not stop.  The stack alone
keeps a 2-core machine busy (thirteen daemons): it runs for its module only, and 2 s cadences
(not 1 s) keep it from starving itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from llmmon.simulate import hardware, stack
from tests.conftest import ROOT
from tests.helpers import stop_process, wait_for
from tests.slow.e2e.cases import CASES, Case

SPEED = 20
INTERVAL = "2s"  # collectors, scrapes and rule evaluation
# Longer than a few collector intervals: a 1 s link flap that an rdma run happens to see stays
# in the exposition for that interval, and must not read as a down link.
FOR = "15s"
# The hang window, of the rules and of `llmmon diagnose` (--alerts-config): what the hang page
# says and whom it names do not depend on its length (the shipped 180 s made this module wait
# three minutes for it; test_victoriametrics.py cuts it too)
HANG_WINDOW = 30
START_TIMEOUT = 150.0
COLLECTORS = ("gpu", "rdma", "nic", "ranks", "disk", "netdev")


@dataclass
class Alert:
    receiver: str
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]


@dataclass
class Stack:
    work: Path
    prometheus: stack.ServiceProcess
    alertmanager: stack.ServiceProcess
    receiver: stack.WebhookReceiver
    started: float  # time.monotonic() when the stack was up

    def node(self, case: Case) -> hardware.NodeLayout:
        index = CASES.index(case)
        return hardware.build(f"sim-{index:02d}", index)

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

    suppressed: Callable[[], list[dict[str, Any]]]  # SuppressedHistory.seen
    # An alerts/config.yaml-shaped file of the thresholds the rules were rendered with, for
    # `llmmon diagnose --alerts-config`: it judges with the rules' hang window
    alerts_config: str


def alertmanager_alerts(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url + "/api/v2/alerts", timeout=5) as response:
        return json.load(response)


class SuppressedHistory:
    """Every alert Alertmanager has held suppressed by an inhibition, from the first time it
    was seen: an inhibition lasts only while both alerts fire (an OOM's increase() window), and
    on a slow machine a scenario's turn may come after it ended."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._seen: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            try:
                alerts = alertmanager_alerts(self._url)
            except (OSError, ValueError):  # a busy Alertmanager: the next poll
                continue
            with self._lock:
                for alert in alerts:
                    if alert["status"]["state"] == "suppressed" and \
                            alert["status"]["inhibitedBy"]:
                        self._seen.setdefault(alert["fingerprint"], alert)

    def seen(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._seen.values())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


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
    servers: list[stack.ServiceProcess] = []
    history: SuppressedHistory | None = None
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
        wait_for(lambda: targets.exists() or simulator.poll() is not None, START_TIMEOUT,
                 "the simulator's targets file", interval=0.5)
        assert simulator.poll() is None, (work / "simulate.log").read_text()
        servers.append(stack.start_alertmanager(
            alertmanager_bin, work / "alertmanager",
            stack.alertmanager_config(receiver.url, group_wait="1s", group_interval="2s")))
        rules = stack.rules_dir(work, FOR, {"hang_window_seconds": HANG_WINDOW})
        servers.append(stack.start_prometheus(
            prometheus_bin, work / "prometheus",
            stack.prometheus_config(targets, rules, servers[0].url.removeprefix("http://"),
                                    INTERVAL)))
        history = SuppressedHistory(servers[0].url)
        thresholds = work / "alerts-config.yaml"
        thresholds.write_text(json.dumps({"hang_window_seconds": {
            "value": HANG_WINDOW, "why": "this module's hang window (the rules': --set)"}}))
        # Deadlines count from here: the daemons are up, so the hang's window has begun.
        yield Stack(work, servers[1], servers[0], receiver, time.monotonic(), history.seen,
                    str(thresholds))
    finally:
        if history is not None:
            history.close()
        for server in reversed(servers):
            server.stop()
        stop_process(simulator, 30)
        _kill_daemons(work / "sim" / "exporters.json")
        receiver.close()
        shutil.rmtree(work, ignore_errors=True)
