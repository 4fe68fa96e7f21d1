"""`llmmon capture` of a simulated node: replayed ranks keep their age, bad archives are refused
(tests/slow/simulate/test_capture.py compares a live and a replayed `llmmon serve`)."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from llmmon.bundle import CaptureError, replay_settings
from llmmon.cli import build_parser
from llmmon.collectors import discover
from llmmon.config import Settings, build_settings
from tests.conftest import ROOT
from tests.simulate.test_node import ticked

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
