"""The entries log: the daemon counts every record once, and refuses or skips what a hostile
writer puts there (tests/slow/ranks/test_entry_log.py: a real rank's reporter appends only new
records, and the daemon reads only what was appended)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmmon.collectors.ranks import RanksCollector
from llmmon_reporter import entrylog, layout
from tests.ranks.hostile import state, write
from tests.ranks.jobs import make_collector, scrape, series

BYTES = 16 * 4  # an all_reduce of 16 floats

def segments(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_bytes().splitlines()[1:]]


def _ring(first: int, count: int, unfinished: int = 0) -> dict:
    """A ring shaped like torch 2.13's pickled gloo dump (tests/fixtures/nccl shapes)."""
    last = first + count
    entries = [{"record_id": r, "pg_id": 0, "process_group": ("0", "default_pg"),
                "collective_seq_id": r + 1, "p2p_seq_id": 0, "is_p2p": False, "op_id": r + 1,
                "profiling_name": "gloo:all_reduce", "input_sizes": [[16]],
                "input_dtypes": ["Float"], "output_sizes": [[16]], "output_dtypes": ["Float"],
                "time_created_ns": 1_700_000_000_000_000_000 + r, "state": "scheduled",
                "retired": r < last - unfinished, "thread_name": "python", "timeout_ms": 1000,
                "time_discovered_started_ns": None}
               for r in range(first, last)]
    done = last - unfinished
    return {"version": "2.10", "pg_status": {"0": {"last_enqueued_collective": last,
                                                   "last_started_collective": -1,
                                                   "last_completed_collective": done}},
            "entries": entries}


def _rank(tmp: Path) -> tuple[RanksCollector, entrylog.EntryLog, Path]:
    """A collector on a spool where rank 0 of `job` (pid 4242) has a state file, and that
    rank's entries log (not yet written) and its path."""
    spool = tmp / "spool"
    write(spool, "job", layout.state_name(0, 4242), state("job", 0, 4242))
    log = entrylog.EntryLog(str(spool / "job"), layout.log_name(0, 4242),
                            {"job_id": "job", "rank": 0, "pid": 4242})
    return make_collector(spool, tmp), log, spool / "job" / layout.log_name(0, 4242)


def _bytes(collector: RanksCollector) -> float:
    samples = scrape(collector)[0]
    return sum(series(samples, "llmmon_nccl_collective_bytes_total").values())


def test_a_record_in_flight_is_shipped_again_until_it_is_final_and_counted_once(
        tmp_path: Path) -> None:
    collector, log, path = _rank(tmp_path)
    log.write(entrylog.of(_ring(0, 10, unfinished=2)), 1)
    assert _bytes(collector) == 8 * BYTES
    log.write(entrylog.of(_ring(0, 12, unfinished=0)), 2)  # the two finished, two new
    assert [len(s["entries"]) for s in segments(path)] == [10, 4]
    assert _bytes(collector) == 12 * BYTES
    log.write(entrylog.of(_ring(0, 12)), 3)
    assert [len(s["entries"]) for s in segments(path)] == [10, 4, 0]
    assert _bytes(collector) == 12 * BYTES
    log.close()


def test_a_log_past_its_size_or_wiped_starts_over_and_nothing_is_counted_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    collector, log, path = _rank(tmp_path)
    monkeypatch.setattr(entrylog, "MAX_BYTES", 20_000)
    log.write(entrylog.of(_ring(0, 40)), 1)
    inode = path.stat().st_ino
    assert _bytes(collector) == 40 * BYTES
    log.write(entrylog.of(_ring(0, 80)), 2)  # appended: past 20 kB now
    assert path.stat().st_ino == inode and _bytes(collector) == 80 * BYTES
    log.write(entrylog.of(_ring(0, 90)), 3)  # started over with the whole ring
    assert path.stat().st_ino != inode and len(segments(path)) == 1
    assert _bytes(collector) == 90 * BYTES
    path.unlink()  # the spool wiped under the rank: the next write makes a new file
    log.write(entrylog.of(_ring(0, 95)), 4)
    assert [len(s["entries"]) for s in segments(path)] == [95]
    assert _bytes(collector) == 95 * BYTES
    log.close()


def test_hostile_logs_lose_nothing_of_what_is_good(tmp_path: Path) -> None:
    collector, _, path = _rank(tmp_path)
    header = json.dumps({"schema": 1, "kind": "entries-log", "written_ns": 1,
                         "identity": {"job_id": "job", "rank": 0, "pid": 4242}})

    def segment(first: int, count: int) -> str:
        ring = _ring(first, count)
        ring["entries"] = [dict(e, process_group=list(e["process_group"]))
                           for e in ring["entries"]]
        return json.dumps({"written_ns": 2, "first_record": 0, "last_record": first + count - 1,
                           "pg_status": ring["pg_status"], "entries": ring["entries"]})

    # a garbage line, a line whose range is no range and one whose cut is outside its range
    # sit between good segments
    path.write_text("\n".join([header, segment(0, 5), "{not json", json.dumps(
        {"written_ns": 3, "first_record": 9, "last_record": 2, "entries": []}), json.dumps(
        {"written_ns": 3, "first_record": 0, "last_record": 2, "cut_record": 7, "entries": []}),
        segment(5, 5)]) + "\n" + segment(10, 5)[:40])  # ... and a line still being written
    ctx_errors = _errors(collector)
    assert _bytes(collector) == 10 * BYTES
    assert any("dropped 3 item(s)" in e for e in ctx_errors), ctx_errors
    with path.open("a") as handle:  # the writer finishes its line
        handle.write(segment(10, 5)[40:] + "\n")
    assert _bytes(collector) == 15 * BYTES
    # a log claiming another rank is refused whole, once, and stays refused while it grows
    path.unlink()
    path.write_text(header.replace('"pid": 4242', '"pid": 1') + "\n" + segment(15, 5) + "\n")
    errors = _errors(collector)
    assert any("another rank or pid" in e for e in errors), errors
    with path.open("a") as handle:
        handle.write(segment(20, 5) + "\n")
    assert _errors(collector) == [] and _bytes(collector) == 15 * BYTES


def _errors(collector: RanksCollector) -> list[str]:
    """The errors one collector run counted (reported for the first time)."""
    ctx = scrape(collector)[1]
    return list(ctx.errors.values()) if ctx.error_count else []
