"""The daemon's cost to ingest a node's spool: 8 ranks x 2,000 NCCL Flight Recorder records.

Writes 8 ranks' state files and rings of 2,000 records shaped like the H200 capture (timed
all-gathers, reduce-scatters and all-reduces), in both entries formats side by side:
- `log`: the entries log the reporter writes (llmmon_reporter/entrylog.py, the same code);
- `whole ring`: the whole-ring document 0.1 reporters rewrote every entries tick.
After a cold run (every file new), each refresh rewrites every state file and advances every
rank's ring by 0, 10, 100 or 2,000 new records, then times one run of the ranks collector
(read, parse, count, hang evidence, metric families) plus rendering: wall and CPU
milliseconds (medians of --repeat), and the spool bytes the daemon read. The daemon's work
per refresh should follow the new records, not the ring. Writes bench/results/ranks_ingest.json.

    python bench/ranks_ingest.py [--ranks 8] [--entries 2000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmmon.collector import Context, Environment  # noqa: E402
from llmmon.collectors.ranks import RanksCollector  # noqa: E402
from llmmon.config import collector_options  # noqa: E402
from llmmon_reporter import entrylog, layout, spoolfile  # noqa: E402
from llmmon_reporter.flight import ranges  # noqa: E402
from llmmon.exposition import render  # noqa: E402
from llmmon.sources.fs import RootedFS  # noqa: E402

CAPTURE = ROOT / "tests" / "fixtures" / "nccl" / "h200_flight_recorder.json"
COLLS = [("nccl:_all_gather_base", "BFloat16", [[1048576]], [[8388608]]),
         ("nccl:_reduce_scatter_base", "Float", [[8388608]], [[1048576]]),
         ("nccl:all_reduce", "BFloat16", [[1048576]], [[1048576]])]


def ring(template: dict, world: int, first: int, count: int, now_ns: int) -> dict:
    entries = []
    for offset in range(count):
        record = first + offset
        name, dtype, inputs, outputs = COLLS[record % 3]
        entry = dict(template, record_id=record, collective_seq_id=record + 1,
                     op_id=record + 1, profiling_name=name, input_sizes=inputs,
                     input_dtypes=[dtype], output_sizes=outputs, output_dtypes=[dtype],
                     time_created_ns=now_ns - (count - offset) * 1_000_000,
                     duration_ms=0.1 + (record % 7) * 0.01, retired=True, state="completed")
        entries.append(entry)
    last = str(first + count)
    return {"version": "2.10", "comm_lib_version": "2.28.9",
            "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                "ranks": json.dumps(list(range(world)))}},
            "pg_status": {"0": {"last_enqueued_collective": last,
                                "last_started_collective": last,
                                "last_completed_collective": last}},
            "entries": entries}


class Node:
    """A spool of `ranks` ranks writing their entries in one format."""

    def __init__(self, spool: str, ranks: int, template: dict, fmt: str) -> None:
        self.spool, self.ranks, self.template, self.fmt = spool, ranks, template, fmt
        self.directory = layout.job_dir(spool, "bench-job")
        os.makedirs(self.directory, exist_ok=True)
        self.logs = {rank: entrylog.EntryLog(self.directory, layout.log_name(rank, 10_000 + rank),
                                             {"job_id": "bench-job", "rank": rank,
                                              "pid": 10_000 + rank})
                     for rank in range(ranks)}

    def write(self, first: int, count: int) -> None:
        now = time.time_ns()
        for rank in range(self.ranks):
            pid = 10_000 + rank
            self._state(rank, pid, first + count, now)
            records = ring(self.template, self.ranks, first, count, now)
            if self.fmt == "log":
                self.logs[rank].write(entrylog.of(records), now)
                continue
            header = {"schema": layout.SCHEMA, "kind": "entries", "written_ns": now,
                      "identity": {"job_id": "bench-job", "rank": rank, "pid": pid}}
            spoolfile.write_atomic(self.directory, layout.entries_name(rank, pid),
                                   spoolfile.compose(header,
                                                     {"dump": json.dumps(records).encode()}))

    def _state(self, rank: int, pid: int, completed: int, now: int) -> None:
        last = str(completed)
        status = json.dumps({"pg_status": {"0": {"last_enqueued_collective": last,
                                                 "last_started_collective": last,
                                                 "last_completed_collective": last}}}).encode()
        state = {"schema": layout.SCHEMA, "kind": "state", "written_ns": now,
                 "identity": {"job_id": "bench-job", "rank": rank, "local_rank": rank,
                              "world_size": self.ranks, "pod": "bench", "namespace": "ml",
                              "pid": pid, "uuid": f"GPU-{rank:08d}", "gpu_name": "NVIDIA H200",
                              "allocator_config": ""},
                 "reporter": {"errors_total": 0, "disabled": False},
                 "pgs": {"0": {"desc": "default_pg", "size": self.ranks,
                               "ranks": ranges(list(range(self.ranks)))}},
                 "memory": {key: 1 << 30 for key in layout.MEMORY_KEYS}, "step": None}
        spoolfile.write_atomic(self.directory, layout.state_name(rank, pid),
                               spoolfile.compose(state, {"status": status}))


def run(collector: RanksCollector) -> tuple[float, float, float]:
    """Wall ms, CPU ms and spool bytes read of one collector run and its rendering."""
    read_before = _read(collector)
    wall, cpu = time.perf_counter(), time.process_time()
    render(collector.collect(Context()))
    return ((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000,
            _read(collector) - read_before)


def _read(collector: RanksCollector) -> float:
    return float(collector._read_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    template = json.loads(CAPTURE.read_text())["trace"]["entries_head"][0]
    news = (0, 10, 100, args.entries)
    results: dict[str, dict[str, list[tuple[float, float, float]]]] = {
        fmt: {str(n): [] for n in ("cold", *news)} for fmt in ("log", "whole ring")}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeat):
            for fmt, runs in results.items():
                for new in news:
                    spool = os.path.join(tmp, f"{fmt}-{repeat}-{new}".replace(" ", "_"))
                    options = {o.key: o.parse(o.default)
                               for o in collector_options(RanksCollector)}
                    options.update(spool_dir=spool, fr_dir=os.path.join(tmp, "fr"),
                                   pipe_dir=os.path.join(tmp, "pipe"))
                    collector = RanksCollector(
                        Environment(RootedFS("/sys"), RootedFS("/proc")), options)
                    node = Node(spool, args.ranks, template, fmt)
                    node.write(0, args.entries)
                    runs["cold"].append(run(collector))
                    while run(collector)[2]:  # files a loaded run's parse budget left over
                        pass
                    node.write(new, args.entries)  # `new` records past the last read
                    runs[str(new)].append(run(collector))
    summary = {fmt: {key: {"wall_ms": statistics.median(r[0] for r in samples),
                           "cpu_ms": statistics.median(r[1] for r in samples),
                           "read_bytes": statistics.median(r[2] for r in samples)}
                     for key, samples in runs.items()} for fmt, runs in results.items()}
    print(f"{args.ranks} ranks x {args.entries}-record rings; one collector run after every "
          "rank's state and ring advanced (medians of {args.repeat})".replace(
              "{args.repeat}", str(args.repeat)))
    print(f"{'new records/rank':>17} | {'log: cpu ms':>11} {'wall ms':>8} {'read kB':>8} | "
          f"{'whole ring: cpu ms':>18} {'wall ms':>8} {'read kB':>8}")
    for key in ("cold", *map(str, news)):
        log, whole = summary["log"][key], summary["whole ring"][key]
        print(f"{key:>17} | {log['cpu_ms']:>11.1f} {log['wall_ms']:>8.1f} "
              f"{log['read_bytes'] / 1e3:>8.1f} | {whole['cpu_ms']:>18.1f} "
              f"{whole['wall_ms']:>8.1f} {whole['read_bytes'] / 1e3:>8.1f}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "ranks_ingest.json").write_text(json.dumps(
        {"ranks": args.ranks, "entries": args.entries, "median": summary}, indent=1))


if __name__ == "__main__":
    main()
