"""Flight Recorder dumps: requests through real FIFOs, and a bounded number of kept dump sets."""

from __future__ import annotations

import os
from pathlib import Path

from fastapi.testclient import TestClient

from llmmon.app import create_app
from llmmon.ranks.dumps import DumpKeeper, request
from llmmon_reporter.dumppipe import DumpPipe
from llmmon_reporter.layout import pipe_path
from llmmon.sampler import Sampler
from tests.ranks.jobs import make_collector, scrape
from tests.ranks.test_nccl_dumps import staged


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


def test_a_dump_is_requested_over_http_for_a_known_job_only(tmp_path: Path) -> None:
    spool, now = staged(tmp_path, "nccl4")
    collector = make_collector(spool, tmp_path, auto_dump=False)
    scrape(collector, now)
    sampler = Sampler([collector], "test")
    client = TestClient(create_app(sampler, [collector]))
    pipes = [DumpPipe(pipe_path(str(tmp_path / "pipe"), "llama-8b", rank)) for rank in (0, 2)]
    try:
        answer = client.post("/api/v1/ranks/dump", params={"job_id": "llama-8b"})
        assert answer.status_code == 200
        assert answer.json() == {"job_id": "llama-8b", "ranks": {
            "0": "requested", "1": "no pipe", "2": "requested", "3": "no pipe"}}
        assert all(pipe.requested() for pipe in pipes)
        unknown = client.post("/api/v1/ranks/dump", params={"job_id": "nope"})
        assert unknown.status_code == 400 and "unknown job_id 'nope'" in unknown.json()["error"]
        assert client.get("/api/v1/ranks/dump").status_code == 405  # no side effects on GET
        assert 'llmmon_nccl_dumps_requested_total{job_id="llama-8b"} 1.0' in \
            scrape(collector, now)[2]
    finally:
        for pipe in pipes:
            pipe.close()
