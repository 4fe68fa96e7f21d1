"""NCCL Flight Recorder dumps (gloo records no durations): the real H200 capture and the
4-rank job derived from it (tests/fixtures/nccl/derive.py), through the real spool parser."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from llmmon.ranks.collectives import bus_factor
from llmmon.ranks.validate import Notes, collective
from tests.conftest import FIXTURES, ROOT, compare_golden, pythonpath
from tests.ranks.jobs import by_rank, make_collector, scrape, series

CAPTURE = json.loads((FIXTURES / "nccl" / "h200_flight_recorder.json").read_text())["trace"]
MEMORY = json.loads((FIXTURES / "nccl" / "h200_torch_memory.json").read_text())
MIB = 1 << 20


def staged(tmp: Path, name: str) -> tuple[Path, float]:
    """A copy of fixture spool `name`, its files dated as the reporter wrote them; returns it
    and a time one second after the newest write."""
    spool = tmp / name
    shutil.copytree(FIXTURES / "spool" / name, spool)
    newest = 0
    for path in spool.rglob("*.json"):
        written = json.loads(path.read_text())["written_ns"]
        os.utime(path, ns=(written, written))
        newest = max(newest, written)
    return spool, newest / 1e9 + 1.0


def test_the_real_h200_capture_durations_bytes_and_allocator(tmp_path: Path) -> None:
    spool, now = staged(tmp_path, "h200")
    samples, ctx, _ = scrape(make_collector(spool, tmp_path), now)
    assert not ctx.errors
    rank = {"job_id": "h200-capture", "rank": "0"}
    head = CAPTURE["entries_head"]  # retired, with duration_ms
    hist = series(samples, "llmmon_nccl_collective_duration_seconds_count", **rank)
    assert list(hist.values()) == [len(head)]
    total = series(samples, "llmmon_nccl_collective_duration_seconds_sum", **rank)
    assert list(total.values()) == [sum(e["duration_ms"] for e in head) / 1000]
    # 1024 x Float = 4096 bytes each; the tail is completed but neither retired nor timed yet
    assert by_rank(samples, "llmmon_nccl_collective_bytes_total", pg="0", coll="all_reduce",
                   dtype="Float") == {0: len(head) * 1024 * 4}
    assert by_rank(samples, "llmmon_nccl_bus_bytes_total", pg="0") == {0: 0.0}  # one rank
    progress = CAPTURE["pg_status"]["0"]
    assert by_rank(samples, "llmmon_nccl_last_started_seq", pg="0") == \
        {0: progress["last_started_collective"]}
    stats = MEMORY["after_fragmentation"]["stats"]
    for name, key in (("reserved", "reserved_bytes.all.current"),
                      ("allocated", "allocated_bytes.all.current"),
                      ("active", "active_bytes.all.current"),
                      ("inactive_split", "inactive_split_bytes.all.current")):
        assert by_rank(samples, f"llmmon_torch_memory_{name}_bytes") == {0: stats[key]}


def test_the_derived_four_rank_job_matches_its_golden_exposition(tmp_path: Path) -> None:
    spool, now = staged(tmp_path, "nccl4")
    collector = make_collector(spool, tmp_path, stall_after="5s")  # the hang is 6 s old
    samples, ctx, text = scrape(collector, now)
    assert not ctx.errors
    compare_golden("../fixtures/nccl/ranks.prom", text)

    # Four timed steps are retired (the fifth is completed but not retired): bytes and bus
    # bytes by nccl-tests' rules for n = 4 (group 0) and n = 2 (group 1).
    gather, scatter, reduce, tp = 4 * MIB * 2, 4 * MIB * 4, MIB * 2, MIB // 2 * 2
    assert by_rank(samples, "llmmon_nccl_collective_bytes_total", pg="0",
                   coll="_all_gather_base", dtype="BFloat16") == {r: 4 * gather for r in range(4)}
    assert by_rank(samples, "llmmon_nccl_collective_bytes_total", pg="0",
                   coll="_reduce_scatter_base", dtype="Float") == {r: 4 * scatter for r in range(4)}
    assert by_rank(samples, "llmmon_nccl_bus_bytes_total", pg="0", coll="all_reduce") == \
        {r: 4 * reduce * 1.5 for r in range(4)}
    assert by_rank(samples, "llmmon_nccl_bus_bytes_total", pg="0", coll="_all_gather_base") == \
        {r: 4 * gather * 0.75 for r in range(4)}
    assert by_rank(samples, "llmmon_nccl_bus_bytes_total", pg="1", coll="all_reduce") == \
        {0: 4 * tp * 1.0, 1: 4 * tp * 1.0}
    # The straggler waits least: its mean all-gather is the shortest; its enqueue lag the largest.
    mean = {r: by_rank(samples, "llmmon_nccl_collective_duration_seconds_sum", pg="0",
                       coll="_all_gather_base")[r] /
            by_rank(samples, "llmmon_nccl_collective_duration_seconds_count", pg="0",
                    coll="_all_gather_base")[r] for r in range(4)}
    assert min(mean, key=mean.__getitem__) == 3
    lag = by_rank(samples, "llmmon_nccl_enqueue_lag_seconds", pg="0")
    assert max(lag, key=lag.__getitem__) == 3 and abs(lag[3] - 0.02985) < 1e-9
    # Rank 2's allocator saw the OOM of the capture.
    assert by_rank(samples, "llmmon_torch_ooms_total") == {0: 0, 1: 0, 2: 1, 3: 0}
    assert by_rank(samples, "llmmon_torch_alloc_retries_total")[2] == 1

    group = [g for g in collector.evidence()["jobs"][0]["groups"] if g["pg"] == "0"][0]
    assert (group["waiting"], group["behind"], group["stalled"]) == ([0, 1, 2], [3], True)
    assert group["op"] == {"seq": 16, "coll": "_all_gather_base",
                           "waiting_seconds": group["op"]["waiting_seconds"]}
    assert group["summary"].startswith("job llama-8b, group 0 (default_pg): ranks 0–2 wait in "
                                       "_all_gather_base #16 for ")
    assert group["summary"].endswith("rank 3 never enqueued it (last enqueued #15)")


def test_bus_factors_are_nccl_tests_own() -> None:
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert bus_factor("allreduce_coalesced", 8) == 2 * 7 / 8
    for coll in ("_all_gather_base", "all_gather_into_tensor_coalesced",
                 "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "all_to_all"):
        assert bus_factor(coll, 8) == 7 / 8
    for coll in ("broadcast", "reduce", "send", "recv"):
        assert bus_factor(coll, 8) == 1.0


def test_a_point_to_point_records_coll_is_its_op_not_its_ranks() -> None:
    """ProcessGroupNCCL names p2p records `nccl:send <rank>-><peer>`, `nccl:recv <rank><-<peer>`
    (group ranks); gloo records none."""
    record = {**CAPTURE["entries_head"][0], "is_p2p": True, "p2p_seq_id": 3}
    for name, coll in (("nccl:send 0->1", "send"), ("nccl:recv 1<-0", "recv"),
                       ("nccl:all_reduce", "all_reduce")):
        notes = Notes()
        entry = collective({**record, "profiling_name": name}, notes)
        assert (entry.coll, entry.seq, entry.is_p2p) == (coll, 3, True)
        assert not notes.sanitised


def test_the_fixture_spools_are_what_the_deriver_writes(tmp_path: Path) -> None:
    """The committed spools are reproducible from the committed captures."""
    work = tmp_path / "repo"
    shutil.copytree(FIXTURES / "nccl", work / "tests" / "fixtures" / "nccl")
    subprocess.run([sys.executable, str(work / "tests/fixtures/nccl/derive.py")], check=True,
                   cwd=work, env={**os.environ, "PYTHONPATH": pythonpath()}, capture_output=True,
                   timeout=60)
    for path in (ROOT / "tests/fixtures/spool").rglob("*.json"):
        if "nccl4" in path.parts or "h200" in path.parts:
            copy = work / path.relative_to(ROOT)
            assert copy.read_bytes() == path.read_bytes(), path


def test_overlapping_dumps_count_each_record_once_and_ring_wraps_are_counted(
        tmp_path: Path) -> None:
    """Successive entries files of one process: overlaps skipped, gaps counted as missed."""
    spool, now = staged(tmp_path, "h200")
    collector = make_collector(spool, tmp_path)
    entries_file = next(spool.rglob("*.entries.json"))
    document = json.loads(entries_file.read_text())
    template = CAPTURE["entries_head"][0]

    def ring(first: int, last: int) -> None:
        document["dump"]["entries"] = [
            dict(template, record_id=r, collective_seq_id=r + 1, retired=True)
            for r in range(first, last + 1)]
        document["dump"]["pg_status"]["0"]["last_completed_collective"] = last + 1
        entries_file.write_text(json.dumps(document))
        os.utime(entries_file, (now - 1, now - 1 + (first + last) / 1e6))  # a new version

    counts = []
    for first, last in ((0, 9), (5, 14), (30, 39)):
        ring(first, last)
        samples = scrape(collector, now)[0]
        counts.append((by_rank(samples, "llmmon_nccl_collective_duration_seconds_count",
                               pg="0")[0],
                       by_rank(samples, "llmmon_nccl_entries_missed_total")[0]))
    assert counts == [(10, 0), (15, 0), (25, 15)]
