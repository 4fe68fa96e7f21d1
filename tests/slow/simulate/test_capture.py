"""`llmmon capture` of a simulated node and `llmmon serve --replay` of the archive: both real
processes serve the same exposition but for the lines `llmmon.bundle.VOLATILE` names."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import requests

from llmmon.bundle import VOLATILE
from tests.conftest import ROOT, ServeProcess
from tests.simulate.test_capture import PATIENT
from tests.simulate.test_node import ticked

MASK = re.compile(r"^((?:" + "|".join(VOLATILE) + r").*\}) .*$", re.M)


def scraped(server: ServeProcess) -> str:
    """/metrics of a real `llmmon serve` once every collector ran, the 20 Hz power sampler has
    a window for every GPU and every GPU has its GPM ratios, which need a second GPU run
    (masked).  Under load the first scrape can come between the two runs."""
    server.wait_collected(timeout=90)
    deadline = time.monotonic() + 60
    while True:
        text = requests.get(server.url + "/metrics", timeout=10).text
        gpus = text.count("\nllmmon_gpu_info{")
        windows = text.count("\nllmmon_gpu_power_instant_min_watts{")
        gpm = text.count("\nllmmon_gpu_sm_active_ratio{")
        if (gpus and windows == gpus == gpm) or time.monotonic() > deadline:
            return MASK.sub(r"\1 <volatile>", text)
        time.sleep(0.2)


def test_capture_of_a_simulated_node_replays_identically(
        work: Path, serve: Callable[..., ServeProcess]) -> None:
    node = ticked(work / "sim", "thermal", "pfc-storm", "straggler").nodes[0]
    flags = [*node.paths.serve_args(), "--collector.topology"]
    live = scraped(serve(*flags, *PATIENT))
    archive = work / "node.tar.gz"
    result = subprocess.run([sys.executable, "-m", "llmmon", "capture", f"--output={archive}",
                             *flags], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "8 GPU snapshot(s); 0 problem(s)" in result.stdout

    replayed = scraped(serve("--replay", str(archive), *PATIENT))
    assert replayed == live
    assert 'llmmon_gpu_nearest_nic_info{device="mlx5_0",gpu="0"' in replayed
    assert 'llmmon_rank_up{job_id="pretrain-0",rank="3"} 1.0' in replayed
    assert 'reason="hw_thermal_slowdown"' in replayed
