"""What the ranks collector says about the spool, in its log and its series, over time:
a bad file still there is not "recovered", a file name cannot forge logfmt fields, and a
job's dump counter leaves with the job.  Through a real `llmmon serve`."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import requests

from tests.conftest import FIXTURES
from tests.core.served import collector, runs_after, value
from tests.helpers import wait_for

# logfmt: key=value or key="quoted, with \" and \\ escapes"
PAIR = re.compile(r'\s*([^\s=]+)=("(?:[^"\\]|\\.)*"|[^\s"]*)')


def logfmt(line: str) -> list[tuple[str, str]]:
    """The fields of one logfmt line, quoted values unquoted; the whole line must parse."""
    fields, position = [], 0
    while position < len(line):
        match = PAIR.match(line, position)
        assert match, f"not logfmt from {position}: {line!r}"
        key, raw = match.groups()
        fields.append((key, json.loads(raw) if raw.startswith('"') else raw))
        position = match.end()
    return fields


def one_rank_spool(tmp_path: Path) -> Path:
    spool = tmp_path / "spool"
    (spool / "good").mkdir(parents=True)
    shutil.copy(FIXTURES / "spool" / "bad" / "good" / "rank_0.1000.json", spool / "good")
    return spool


def serve_ranks(serve, spool: Path, tmp_path: Path, *extra: str):  # type: ignore[no-untyped-def]
    server = serve("--collector.disable-defaults", "--collector.ranks", f"--spool.dir={spool}",
                   "--collector.ranks.interval=200ms",
                   f"--collector.ranks.fr-dir={tmp_path / 'fr'}",
                   f"--collector.ranks.pipe-dir={tmp_path / 'pipe'}", *extra)
    server.wait_collected()
    return server


def test_a_bad_file_still_in_place_is_not_logged_as_recovered_until_it_is_gone(
        serve, tmp_path: Path) -> None:
    spool = one_rank_spool(tmp_path)
    bad = spool / "good" / "rank_1.1001.json"
    bad.write_text("{not json")
    server = serve_ranks(serve, spool, tmp_path, "--collector.ranks.stale-after=1h")
    problem = f"problem={bad}"
    wait_for(lambda: problem in server.log(), 60, "the bad file logged")
    runs_after(server, "ranks", 3)
    assert f"{problem}: recovered" not in server.log()
    assert server.log().count(problem) == 1  # logged once, as it is counted once
    assert collector(server, "ranks")["errors_total"] == 1
    assert str(bad) in collector(server, "ranks")["last_error"]  # still reported as active

    bad.unlink()
    wait_for(lambda: f"{problem}: recovered" in server.log(), 60, "recovery once it is gone")


def test_a_file_name_with_quotes_cannot_add_fields_to_a_logfmt_line(
        serve, tmp_path: Path) -> None:
    spool = one_rank_spool(tmp_path)
    name = 'evil\\" level=\\"error\\" injected=\\"yes'
    (spool / "good" / name).write_text("x")
    server = serve_ranks(serve, spool, tmp_path, "--collector.ranks.stale-after=1h")
    wait_for(lambda: "unexpected name" in server.log(), 60, "the odd file logged")
    lines = [line for line in server.log().splitlines() if line.startswith("ts=")]
    for line in lines:
        assert [key for key, _ in logfmt(line)] == ["ts", "level", "logger", "msg"], line
    (line,) = [line for line in lines if "unexpected name" in line]
    assert f"{spool / 'good' / name}: unexpected name" in dict(logfmt(line))["msg"]


def test_a_jobs_dump_counter_is_dropped_with_its_ranks(serve, tmp_path: Path) -> None:
    spool = one_rank_spool(tmp_path)
    state = spool / "good" / "rank_0.1000.json"
    alive = threading.Event()
    alive.set()

    def report() -> None:  # the rank's reporter: rewrites its file until the job ends
        while alive.is_set():
            if state.exists():
                os.utime(state)
            time.sleep(0.2)

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        server = serve_ranks(serve, spool, tmp_path, "--collector.ranks.stale-after=1s",
                             "--collector.ranks.drop-after=2s")
        wait_for(lambda: value(server, "llmmon_rank_up", job_id="good", rank="0") == 1, 60,
                 "the rank up")
        dump = requests.post(server.url + "/api/v1/ranks/dump", params={"job_id": "good"},
                             timeout=10)
        assert dump.status_code == 200, dump.text
        wait_for(lambda: value(server, "llmmon_nccl_dumps_requested_total", job_id="good") == 1, 60,
                 "the dump counted")
    finally:
        alive.clear()
        reporter.join(5)
    wait_for(lambda: value(server, "llmmon_rank_up", job_id="good", rank="0") is None, 60,
             "the job's ranks dropped after drop_after")
    runs_after(server, "ranks")
    assert value(server, "llmmon_nccl_dumps_requested_total", job_id="good") is None
