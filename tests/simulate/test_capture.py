"""`llmmon capture` of a simulated node, replayed: the daemon serves the same exposition."""

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

import pytest

from exporter.capture import VOLATILE, CaptureError, replay_settings
from exporter.cli import build_parser
from exporter.collectors import discover
from exporter.config import Settings, build_settings
from exporter.daemon import build
from tests.conftest import ROOT
from tests.simulate.test_node import ticked

MASK = re.compile(r"^((?:" + "|".join(VOLATILE) + r").*\}) .*$", re.M)


# A collector run that outlives its timeout on a loaded machine would read as a difference.
PATIENT = [f"--collector.{cls.name}.timeout=60s" for cls in discover()]


def settings_for(*flags: str) -> Settings:
    args: argparse.Namespace = build_parser().parse_args(["serve", *PATIENT, *flags])
    return build_settings(args, discover())


def served(settings: Settings) -> str:
    """What `llmmon serve` with these settings serves once every collector ran (masked)."""
    daemon = build(settings)
    daemon.sampler.start()
    try:
        assert daemon.sampler.wait_first_cycle(90)
        text = daemon.sampler.body(openmetrics=False, compressed=False).decode()
    finally:
        daemon.sampler.stop()
    return MASK.sub(r"\1 <volatile>", text)


def test_capture_of_a_simulated_node_replays_identically(work: Path) -> None:
    node = ticked(work / "sim", "thermal", "pfc-storm", "straggler").nodes[0]
    flags = [*node.paths.serve_args(), "--collector.topology"]
    live = served(settings_for(*flags))
    archive = work / "node.tar.gz"
    result = subprocess.run([sys.executable, "-m", "exporter", "capture", f"--output={archive}",
                             *flags], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "8 GPU snapshot(s); 0 problem(s)" in result.stdout

    replayed = served(replay_settings(str(archive), settings_for(), into=str(work / "replay")))
    assert replayed == live
    assert 'llmmon_gpu_nearest_nic_info{device="mlx5_0",gpu="0"' in replayed
    assert 'llmmon_rank_up{job_id="pretrain-0",rank="3"} 1.0' in replayed
    assert 'reason="hw_thermal_slowdown"' in replayed


def test_replayed_ranks_are_as_old_as_at_capture(work: Path) -> None:
    """Each spool file is re-dated by the time since capture, so ranks keep their age."""
    node = ticked(work / "sim").nodes[0]
    archive = work / "node.tar.gz"
    subprocess.run([sys.executable, "-m", "exporter", "capture", f"--output={archive}",
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
