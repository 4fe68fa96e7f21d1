"""A wall-clock step is neither a stall nor an expiry: the ranks collector measures ages on a
clock that follows the monotonic one (llmmon.ranks.clock), fed here a wall clock that steps."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from llmmon.ranks.clock import DaemonClock
from tests.ranks.jobs import make_collector, scrape
from tests.ranks.test_nccl_dumps import staged


class Time:
    """A wall clock that can step and a monotonic clock that cannot."""

    def __init__(self, wall: float) -> None:
        self.wall, self.mono = wall, 1000.0

    def tick(self, seconds: float = 1.0) -> None:
        self.wall += seconds
        self.mono += seconds


def _collector(spool: Path, tmp_path: Path, time: Time):  # type: ignore[no-untyped-def]
    collector = make_collector(spool, tmp_path, auto_dump=False)
    clock = DaemonClock(wall=lambda: time.wall, monotonic=lambda: time.mono)
    collector.clock, collector.ingest.offset, collector.watch.clock = \
        clock, clock.offset, clock.now
    return collector, clock


def _write(spool: Path, when: float) -> None:
    """The reporters rewrite their files (same content: the group stays where it hangs)."""
    for path in spool.rglob("*.json"):
        os.utime(path, (when, when))


def _run(collector, clock: DaemonClock, time: Time, spool: Path,  # type: ignore
         seconds: int) -> None:
    """`seconds` of a reporting job: each second the reporters write and the collector runs."""
    for _ in range(seconds):
        time.tick()
        _write(spool, time.wall)
        scrape(collector, clock.now())


def _group(collector) -> dict:  # type: ignore[no-untyped-def]
    (job,) = collector.evidence()["jobs"]
    (group,) = [g for g in job["groups"] if g["stalled_seconds"] > 0] or job["groups"][:1]
    return {"stalled": group["stalled_seconds"], "up": [r["up"] for r in job["ranks"]]}


def test_a_step_back_keeps_a_hung_group_hung(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    spool, now = staged(tmp_path, "nccl4")  # job llama-8b, hung in one group
    time = Time(now)
    collector, clock = _collector(spool, tmp_path, time)
    _run(collector, clock, time, spool, 40)
    before = _group(collector)
    assert before["stalled"] >= 40 and all(before["up"])
    with caplog.at_level(logging.WARNING, logger="llmmon.ranks.clock"):
        time.tick()
        time.wall -= 3600
        _write(spool, time.wall)
        scrape(collector, clock.now())
    after = _group(collector)
    assert after["stalled"] >= before["stalled"] + 1 and all(after["up"])
    assert "the wall clock stepped -3600" in caplog.text


def test_a_step_forward_drops_no_live_rank_and_deletes_no_file(tmp_path: Path) -> None:
    spool, now = staged(tmp_path, "nccl4")
    time = Time(now)
    collector, clock = _collector(spool, tmp_path, time)
    _run(collector, clock, time, spool, 5)
    files = sorted(spool.rglob("*.json"))
    time.tick()
    time.wall += 900  # past drop_after (10 min), before the reporters write again
    samples = scrape(collector, clock.now())[0]
    assert sorted(spool.rglob("*.json")) == files
    assert all(_group(collector)["up"]) and len(_group(collector)["up"]) == 4
    assert samples  # the run rendered
