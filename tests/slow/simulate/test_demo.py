"""`llmmon demo` end to end: the page arrives on the console, Ctrl-C stops every process."""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.conftest import ROOT

TIMEOUT = 240.0  # the page usually arrives in ~15 s; the bound is for a loaded CI machine


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and b"zombie" not in Path(f"/proc/{pid}/status") \
        .read_bytes().lower()


def test_demo_pages_on_the_console_and_ctrl_c_stops_everything() -> None:
    demo = subprocess.Popen(
        [sys.executable, "-u", "-m", "llmmon", "demo", "--nodes=1", "--scenario=thermal",
         "--for=5s", "--scrape-interval=1s", f"--duration={TIMEOUT}",
         "--serve-arg=--collector.gpu.interval=1s"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    pids: list[int] = []
    prometheus: re.Match[str] | None = None
    simulated: Path | None = None
    try:
        assert demo.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(demo.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + TIMEOUT
        paged, pending = False, ""
        # Read the pipe itself, never through a buffered readline(): two notifications that
        # arrive in one read would leave the second in Python's buffer, where select() cannot
        # see it (a page was once missed that way, behind a ticket printed with it).
        while not paged and time.monotonic() < deadline and demo.poll() is None:
            if not selector.select(timeout=1.0):
                continue
            chunk = os.read(demo.stdout.fileno(), 65536).decode(errors="replace")
            *lines, pending = (pending + chunk).split("\n")
            for line in lines:
                output.append(line + "\n")
                control = re.search(r"> (\S+)/scenarios$", line.strip())
                if control:
                    simulated = Path(control.group(1))
                    pids = [e["pid"] for e in json.loads(
                        (simulated / "exporters.json").read_text())]
                prometheus = re.match(r"Prometheus: (http://\S+)", line) or prometheus
                paged = paged or \
                    "[pager] firing: GPUThermalThrottle (critical) node=sim-00 gpu=6" in line
        if not paged:
            raise AssertionError("no page from the demo:\n" + "".join(output) + pending
                                 + _prometheus_alerts(prometheus))
        assert prometheus is not None
        with urllib.request.urlopen(prometheus.group(1) + "/api/v1/targets", timeout=5) as r:
            targets = json.load(r)["data"]["activeTargets"]
        assert [t["labels"]["node"] for t in targets if t["health"] == "up"] == ["sim-00"]
        assert pids and all(_alive(pid) for pid in pids)
        demo.send_signal(signal.SIGINT)
        assert demo.wait(30) == 0, "".join(output)
        assert not any(_alive(pid) for pid in pids)
    finally:
        if demo.poll() is None:  # a failed assertion: stop it as a user would, then harder
            demo.send_signal(signal.SIGINT)
            try:
                demo.wait(30)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait(10)
        if simulated is not None:  # what a killed demo could not stop or remove
            servers = simulated.parent / "servers.json"
            if servers.exists():
                pids += [s["pid"] for s in json.loads(servers.read_text())]
            for pid in pids:
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(simulated.parent, ignore_errors=True)


def _prometheus_alerts(prometheus: re.Match[str] | None) -> str:
    """What Prometheus itself thought, for the failure message."""
    if prometheus is None:
        return "\n(no Prometheus URL printed)"
    try:
        with urllib.request.urlopen(prometheus.group(1) + "/api/v1/alerts", timeout=5) as r:
            return "\nPrometheus alerts: " + r.read().decode()[:4000]
    except OSError as exc:
        return f"\nPrometheus alerts unavailable: {exc}"

