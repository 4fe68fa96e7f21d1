"""`llmmon capture` of a simulated node and `llmmon serve --replay` of the archive: both real
processes serve the same exposition but for the lines `llmmon.bundle.VOLATILE` names."""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Callable

import pytest
import requests

from llmmon.bundle import VOLATILE, CaptureError, replay_settings
from llmmon.cli import build_parser
from llmmon.collectors import discover
from llmmon.config import Settings, build_settings
from tests.conftest import ROOT, ServeProcess
from tests.simulate.test_node import ticked

MASK = re.compile(r"^((?:" + "|".join(VOLATILE) + r").*\}) .*$", re.M)


# A collector run that outlives its timeout on a loaded machine would read as a difference;
# so would a rank that turns stale (30 s by default), stalled or dumped between the live
# scrape and the replayed one: the simulated ranks stop writing once ticked, and the replay
# keeps their age.  With these bounds out of reach the comparison does not depend on speed.
PATIENT = [f"--collector.{cls.name}.timeout=60s" for cls in discover()] + [
    "--collector.ranks.stale-after=24h", "--collector.ranks.stall-after=24h",
    "--collector.ranks.drop-after=720h", "--collector.ranks.auto-dump=false"]


def settings_for(*flags: str) -> Settings:
    args: argparse.Namespace = build_parser().parse_args(["serve", *PATIENT, *flags])
    return build_settings(args, discover())


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


def test_replayed_ranks_are_as_old_as_at_capture(work: Path) -> None:
    """Each spool file is re-dated by the time since capture, so ranks keep their age."""
    node = ticked(work / "sim").nodes[0]
    archive = work / "node.tar.gz"
    subprocess.run([sys.executable, "-m", "llmmon", "capture", f"--output={archive}",
                    *node.paths.serve_args()], cwd=ROOT, check=True, capture_output=True,
                   timeout=120)
    with tarfile.open(archive) as tar:
        captured = {Path(m.name).name: m.mtime for m in tar.getmembers()
                    if "/spool/" in m.name and m.isfile()}
        manifest = json.load(tar.extractfile("llmmon-capture/manifest.json"))  # type: ignore
    before = time.time()
    settings = replay_settings(str(archive), settings_for(), into=str(work / "replay"))
    after = time.time()
    replayed = {p.name: p.stat().st_mtime
                for p in Path(settings.collectors["ranks"]["spool_dir"]).rglob("rank_*")}
    assert replayed.keys() == captured.keys() and len(captured) == 16
    for name, mtime in replayed.items():
        shift = mtime - captured[name]
        assert before - manifest["captured_at"] - 1e-3 <= shift <= \
            after - manifest["captured_at"] + 1e-3


def _tar(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize("content, reason", [
    (b"not an archive", "not a usable llmmon capture"),
    (_tar({"../escape": b"x"}), "not a usable llmmon capture"),
    (_tar({"llmmon-capture/manifest.json": b'{"format": 99}'}), "capture format 99"),
])
def test_bad_archives_are_refused(work: Path, content: bytes, reason: str) -> None:
    archive = work / "bad.tar.gz"
    archive.write_bytes(content)
    with pytest.raises(CaptureError, match=reason):
        replay_settings(str(archive), settings_for(), into=str(work / "replay"))
    assert not (work / "escape").exists()
