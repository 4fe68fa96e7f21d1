"""Flight Recorder dumps: requests through real FIFOs, and a bounded number of kept dump sets."""

from __future__ import annotations

import os
from pathlib import Path

from exporter.ranks_dumps import DumpKeeper, request
from exporter.reporter.dumppipe import DumpPipe


def test_a_request_reaches_a_listening_pipe_and_says_why_it_did_not_elsewhere(
        tmp_path: Path) -> None:
    job = tmp_path / "pipe" / "job"
    listening = DumpPipe(str(job / "rank_0.pipe"))
    os.mkfifo(job / "rank_1.pipe")  # nobody reads it
    (job / "rank_2.pipe").write_text("a plain file")
    (job / "rank_3.pipe").symlink_to(job / "rank_0.pipe")
    try:
        results = request(str(tmp_path / "pipe"), "job", [0, 1, 2, 3, 4])
        assert results == {0: "requested", 1: "nobody listening", 2: "not a pipe",
                           3: "not a pipe", 4: "no pipe"}
        assert listening.requested() and not listening.requested()  # once per request
    finally:
        listening.close()


def test_settled_dumps_are_kept_in_sets_and_only_the_newest_sets_stay(tmp_path: Path) -> None:
    keeper = DumpKeeper(str(tmp_path), keep=2, settle=2.0)
    now = 1_800_000_000.0
    for offset, job in enumerate(("a", "b", "c")):
        (tmp_path / job).mkdir()
        for name in ("rank_0", "rank_1.json", "notes.txt"):
            path = tmp_path / job / name
            path.write_text(name)
            os.utime(path, (now - 10, now - 10))
        assert keeper.harvest(now + 60 * offset) == min(offset + 1, 2)
    fresh = tmp_path / "c" / "rank_2"
    fresh.write_text("still being written")
    os.utime(fresh, (now + 119.5, now + 119.5))
    assert keeper.harvest(now + 120) == 2
    kept = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("rank_*"))
    assert kept == ["b/dump-20270115T080100Z/rank_0", "b/dump-20270115T080100Z/rank_1.json",
                    "c/dump-20270115T080200Z/rank_0", "c/dump-20270115T080200Z/rank_1.json",
                    "c/rank_2"]
    assert (tmp_path / "a" / "notes.txt").exists()  # not ours: left alone
