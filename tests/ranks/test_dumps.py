"""Flight Recorder dumps: requests through real FIFOs, and a bounded number of kept dump sets."""

from __future__ import annotations

import os
from pathlib import Path

from fastapi.testclient import TestClient

from llmmon.serve.app import create_app
from llmmon.serve.routes import collector_routes
from llmmon.ranks.dumps import MARKER, request
from llmmon_reporter.dumppipe import DumpPipe
from llmmon_reporter.layout import pipe_path
from llmmon.sampler import Sampler
from tests.ranks.jobs import make_collector, scrape, series
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


def dump_files(job: Path, written: float, *names: str) -> None:
    job.mkdir(parents=True, exist_ok=True)
    for name in names:
        (job / name).write_text(name)
        os.utime(job / name, (written, written))


def kept_sets(fr: Path) -> list[str]:
    return sorted(str(p.parent.relative_to(fr)) for p in fr.rglob("rank_0"))


def test_settled_dumps_are_kept_in_sets_and_each_job_keeps_only_its_newest(
        tmp_path: Path) -> None:
    fr = tmp_path / "fr"
    collector = make_collector(tmp_path / "spool", tmp_path, dumps_keep=2)
    now = 1_800_000_000.0
    dump_files(fr / "b", now - 10, "rank_0", "rank_1.json", "notes.txt")
    for minute in range(3):  # job a dumps three times
        dump_files(fr / "a", now + 60 * minute - 10, "rank_0", "rank_1.json")
        samples = scrape(collector, now + 60 * minute)[0]
    fresh = fr / "a" / "rank_2"
    fresh.write_text("still being written")
    os.utime(fresh, (now + 119.5, now + 119.5))
    samples = scrape(collector, now + 120)[0]

    assert kept_sets(fr) == ["a/dump-20270115T080100Z", "a/dump-20270115T080200Z",
                             "b/dump-20270115T080000Z"]
    assert sorted(p.name for p in (fr / "a" / "dump-20270115T080200Z").iterdir()) == \
        [MARKER, "rank_0", "rank_1.json"]
    assert fresh.exists() and (fr / "b" / "notes.txt").exists()  # not settled; not ours
    assert series(samples, "llmmon_nccl_dumps_kept") == {(): 3}


def test_directories_named_like_dump_sets_never_cost_a_job_its_kept_sets(
        tmp_path: Path) -> None:
    """Another user's empty dump-9999999N directories, beside the real job's sets or under a
    job of their own, neither count towards retention nor are deleted."""
    fr = tmp_path / "fr"
    collector = make_collector(tmp_path / "spool", tmp_path, dumps_keep=2)
    now = 1_800_000_000.0
    for n in range(8):
        (fr / "other" / f"dump-9999999{n}").mkdir(parents=True)
    (fr / "real" / "dump-99999999").mkdir(parents=True)
    (fr / "real" / "dump-99999998").mkdir()
    (fr / "real" / "dump-99999998" / MARKER).write_text("planted")
    os.chown(fr / "real" / "dump-99999998", 4242, 4242)  # someone else's, marker and all
    for minute in range(2):
        dump_files(fr / "real", now + 60 * minute - 10, "rank_0", "rank_1.json")
        scrape(collector, now + 60 * minute)
    for later in range(1, 6):  # runs go by
        samples = scrape(collector, now + 60 + later)[0]

    assert kept_sets(fr) == ["real/dump-20270115T080000Z", "real/dump-20270115T080100Z"]
    planted = sorted(str(p.relative_to(fr)) for p in fr.glob("*/dump-9*"))
    assert planted == [f"other/dump-9999999{n}" for n in range(8)] + \
        ["real/dump-99999998", "real/dump-99999999"]
    assert series(samples, "llmmon_nccl_dumps_kept") == {(): 2}
    # A planted directory at the very name of the next set is not used either.
    (fr / "real" / "dump-20270115T080500Z").mkdir()
    dump_files(fr / "real", now + 290, "rank_0")
    scrape(collector, now + 300)
    assert kept_sets(fr) == ["real/dump-20270115T080100Z", "real/dump-20270115T080500Z.1"]
    assert not list((fr / "real" / "dump-20270115T080500Z").iterdir())


def test_a_dump_is_requested_over_http_for_a_known_job_only(tmp_path: Path) -> None:
    spool, now = staged(tmp_path, "nccl4")
    collector = make_collector(spool, tmp_path, auto_dump=False)
    scrape(collector, now)
    sampler = Sampler([collector], "test")
    client = TestClient(create_app(sampler, collector_routes([collector])))
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
