"""bench/capacity.py's accounting: what each process of a run used (read from /proc), and the
iterations a ruler missed over the measured window."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import capacity  # noqa: E402  (bench/capacity.py is a script; this directory is not named bench,
# which would shadow the bench package the fault tests import)

BUSY_S = 0.5
DEADLINE_S = 120.0  # a spinning process gets half a second of CPU long before this, however loaded


def test_cores_used_tell_a_spinning_process_from_a_sleeping_one(tmp_path: Path) -> None:
    procs = capacity.Processes(tmp_path)
    try:
        procs.start("spinning", [sys.executable, "-c", "while True: pass"])
        procs.start("sleeping", [shutil.which("sleep") or "sleep", "600"])
        before, started = procs.cpu_seconds(), time.monotonic()
        after = before
        while after["spinning"] - before["spinning"] < BUSY_S:
            assert time.monotonic() - started < DEADLINE_S, "the spinning process got no CPU"
            time.sleep(0.05)
            after = procs.cpu_seconds()
        cores = capacity.cores_used(before, after, time.monotonic() - started)
        assert cores["spinning"] > 0
        assert after["sleeping"] - before["sleeping"] <= 0.05  # its exec's last ticks at most
        # The machine's busy time includes the spinning process's (both in clock ticks).
        assert after["machine"] - before["machine"] >= 0.9 * (after["spinning"] - before["spinning"])
    finally:
        procs.stop()
    assert procs.started == []


def test_missed_iterations_count_the_window_apart_from_the_start() -> None:
    """Iterations missed while the store took in the fleet's first scrapes are not the
    window's: it counts the difference, and the count since the start is kept beside it."""
    head = "# TYPE prometheus_rule_group_iterations_missed_total counter\n"
    line = 'prometheus_rule_group_iterations_missed_total{{rule_group="/r/alerts.yaml;{}"}} {}\n'
    before = capacity.parse_metrics(head + line.format("llmmon.training", 3) + line.format("llmmon.gpu", 1))
    after = capacity.parse_metrics(head + line.format("llmmon.training", 3) + line.format("llmmon.gpu", 2)
                                   + line.format("llmmon.node", 1))
    missed = capacity.missed_iterations(before, after, "prometheus_rule_group_iterations_missed_total",
                                        "rule_group")
    assert missed == {"llmmon.training": {"missed": 0, "missed_since_start": 3},
                      "llmmon.gpu": {"missed": 1, "missed_since_start": 2},
                      "llmmon.node": {"missed": 1, "missed_since_start": 1}}
