"""The entries log of a real gloo rank: its reporter appends only new records; the daemon reads
only what was appended and counts every record once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from llmmon_reporter import entrylog
from tests.helpers import wait_for
from tests.ranks.jobs import base_env, make_collector, scrape, series
from tests.ranks.test_entry_log import BYTES, segments

# One gloo rank whose reporter ticks only when told: phase k issues argv[k] all_reduces of 16
# floats, waits until the Flight Recorder has them all retired, ticks (writing the state and
# the log), says so, and waits for the test's go.
RANK = r"""
import json, os, sys, time
import torch, torch.distributed as dist
from llmmon_reporter.stepstats import StepStats
from llmmon_reporter.worker import Cadence, Reporter
out, spool = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=0, world_size=1)
reporter = Reporter(spool, Cadence(3600, 3600, 3600), StepStats())
for phase, count in enumerate(int(c) for c in sys.argv[3:]):
    for _ in range(count):
        dist.all_reduce(torch.ones(16))
    # gloo retires the last one a moment after all_reduce returns; its pg_status can stay a
    # record behind for good (out-of-order completions), so the ring says when all are done
    while not all(e["retired"] for e in json.loads(torch._C._distributed_c10d.
                                                   _dump_fr_trace_json())["entries"]):
        time.sleep(0.01)
    reporter.tick(force=True)
    open(f"{out}/phase{phase}", "w").close()
    while not os.path.exists(f"{out}/go{phase}"):
        time.sleep(0.02)
"""
PHASES = [2000, 10, 0, 100, 2500]  # the last wraps the 2,000-record ring past 500 unread



def test_a_refresh_reads_only_what_was_appended_and_counts_each_record_once(
        tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    collector = make_collector(spool, tmp_path)
    env = base_env(LLMMON_JOB="log", RANK="0", TORCH_FR_BUFFER_SIZE="2000")
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(tmp_path), str(spool),
                             *map(str, PHASES)], env=env, stderr=subprocess.PIPE)
    try:
        read_before, size_before, issued = 0.0, 0, 0
        for phase, count in enumerate(PHASES):
            wait_for(lambda: (tmp_path / f"phase{phase}").exists() or rank.poll() is not None,
                     120, f"phase {phase}")
            assert rank.poll() is None, rank.stderr.read().decode()[-2000:]  # type: ignore
            issued += count
            log = next(spool.glob("log/*.entries.jsonl"))
            samples = scrape(collector)[0]
            read = series(samples, "llmmon_ranks_spool_read_bytes_total")[()]
            state = next(spool.glob("log/rank_0.*[0-9].json")).stat().st_size
            size = log.stat().st_size
            # the state file whole; of the log its header line (the same file?) and what was
            # appended since the last read
            header = len(log.read_bytes().split(b"\n", 1)[0]) + 1 if phase else 0
            assert read - read_before == state + header + size - size_before
            segment = segments(log)[-1]
            assert len(segments(log)) == phase + 1
            # at most MAX_NEW (500) records a tick, the newest; the ring's older new ones and
            # those that left it unread are counted as missed
            assert len(segment["entries"]) == min(count, entrylog.MAX_NEW)
            assert segment["last_record"] == issued - 1
            assert segment["first_record"] == max(0, issued - 2000)
            assert segment.get("cut_record") == (issued - 500 if count > 500 else None)
            missed = series(samples, "llmmon_nccl_entries_missed_total").get(
                (("job_id", "log"), ("rank", "0")), 0.0)
            assert missed == {0: 1500, len(PHASES) - 1: 1500 + 2000}.get(phase, 1500)
            counted = series(samples, "llmmon_nccl_collective_bytes_total", coll="all_reduce",
                             dtype="Float")
            assert list(counted.values()) == [(issued - missed) * BYTES]
            read_before, size_before = read, size
            (tmp_path / f"go{phase}").touch()
        rank.wait(timeout=60)
    finally:
        rank.kill()
        rank.wait()
