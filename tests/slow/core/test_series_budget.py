"""The series budget on a whole simulated node: `llmmon simulate` served until every collector
has shown all it will."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import ROOT
from tests.core.served import consistent_scrape
from tests.helpers import stop_process

# Series a real node's reporters add per rank that the simulator does not write: the training
# thread's CPU time, read and written bytes, two context-switch kinds, CPU and IO idle.
ACTIVITY_SERIES_PER_RANK = 7


def test_the_budget_node_fits_the_default_budget_with_room_for_its_reporters(
        tmp_path: Path) -> None:
    """docs/capacity.md's budget node (8 GPUs, 8 RDMA ports, 16 disks, an 8-rank job), served
    by `llmmon simulate --disks 16` at the default flags, stays within the default series
    budget with room for its reporters' activity series: the node-health and hang work once
    took it to 2,020 unnoticed."""
    work = tmp_path / "sim"
    log = open(tmp_path / "simulate.log", "wb")
    sim = subprocess.Popen([sys.executable, "-m", "llmmon", "simulate", f"--dir={work}",
                            "--nodes=1", "--disks=16", "--port=0"], cwd=ROOT,
                           stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        targets = work / "targets.json"
        deadline = time.monotonic() + 120
        while not targets.exists():
            assert sim.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "simulate.log").read_text()
            time.sleep(0.2)
        url = "http://" + json.loads(targets.read_text())[0]["targets"][0]

        def complete(samples: dict) -> bool:
            """The slow GPU calls have run and every rank's collective durations are in."""
            names = [name for name, _ in samples]
            return names.count("llmmon_gpu_energy_joules_total") == 8 and \
                names.count("llmmon_nccl_collective_duration_seconds_count") >= 8

        def ranks_run(samples: dict) -> float:
            """When the ranks collector last succeeded (0: not yet, its first run still on)."""
            return next((value for (name, labels), value in samples.items()
                         if name == "llmmon_exporter_collector_last_success_timestamp_seconds"
                         and dict(labels)["collector"] == "ranks"), 0.0)

        # Complete, and the same count after a later ranks run: the first runs see the job's
        # groups and collectives appear (a scrape of 1,624 series passed `complete` alone).
        steady = None
        while True:
            samples = consistent_scrape(SimpleNamespace(url=url))[0]
            now = (ranks_run(samples), samples[("llmmon_exporter_series", ())])
            if complete(samples) and steady and now[0] > steady[0] and now[1] == steady[1]:
                break
            if complete(samples) and now[0] and (steady is None or now[0] > steady[0]):
                steady = now
            assert time.monotonic() < deadline, "the node never showed every series"
            time.sleep(0.5)
    finally:
        stop_process(sim, 30)
    series = samples[("llmmon_exporter_series", ())]
    per_collector = {dict(labels)["collector"]: value for (name, labels), value in samples.items()
                     if name == "llmmon_exporter_collector_series"}
    print("series:", series, "per collector:", per_collector)  # for the dated result
    assert samples[("llmmon_exporter_series_budget_exceeded", ())] == 0, per_collector
    assert series + ACTIVITY_SERIES_PER_RANK * 8 <= \
        samples[("llmmon_exporter_series_budget", ())] == 2000, per_collector
