"""The daemon's cost to ingest a node's spool: 8 ranks x 2,000 NCCL Flight Recorder entries.

Writes 8 ranks' state and entries files the way the reporter does (entries shaped like the
H200 capture: timed all-gathers, reduce-scatters and all-reduces), then times full runs of the
ranks collector (read, parse, count, hang evidence, metric families) plus rendering:
- cold: every file new (8 x 2,000 records parsed and counted);
- state only: the 1 s state files rewritten, entries unchanged (most runs);
- entries refreshed: every rank's ring replaced by 2,000 newer records (each ~20 s).
Prints medians in milliseconds; writes bench/results/ranks_ingest.json.

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
from llmmon_reporter import layout, spoolfile  # noqa: E402
from llmmon_reporter.flight import ranges  # noqa: E402
from llmmon.sampler import render  # noqa: E402
from llmmon.sources.fs import RootedFS  # noqa: E402

CAPTURE = ROOT / "tests" / "fixtures" / "nccl" / "h200_flight_recorder.json"
COLLS = [("nccl:_all_gather_base", "BFloat16", [[1048576]], [[8388608]]),
         ("nccl:_reduce_scatter_base", "Float", [[8388608]], [[1048576]]),
         ("nccl:all_reduce", "BFloat16", [[1048576]], [[1048576]])]


def dump(template: dict, world: int, first: int, count: int, now_ns: int) -> bytes:
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
    return json.dumps({
        "version": "2.10", "comm_lib_version": "2.28.9",
        "pg_config": {"0": {"name": "0", "desc": "default_pg",
                            "ranks": json.dumps(list(range(world)))}},
        "pg_status": {"0": {"last_enqueued_collective": last, "last_started_collective": last,
                            "last_completed_collective": last}},
        "entries": entries}).encode()


def write_rank(spool: str, rank: int, world: int, template: dict, first: int, count: int,
               entries: bool) -> None:
    now = time.time_ns()
    directory = layout.job_dir(spool, "bench-job")
    os.makedirs(directory, exist_ok=True)
    pid = 10_000 + rank
    last = str(first + count)
    status = json.dumps({"pg_status": {"0": {"last_enqueued_collective": last,
                                             "last_started_collective": last,
                                             "last_completed_collective": last}}}).encode()
    state = {"schema": layout.SCHEMA, "kind": "state", "written_ns": now,
             "identity": {"job_id": "bench-job", "rank": rank, "local_rank": rank,
                          "world_size": world, "pod": "bench", "namespace": "ml", "pid": pid,
                          "uuid": f"GPU-{rank:08d}", "gpu_name": "NVIDIA H200",
                          "allocator_config": ""},
             "reporter": {"errors_total": 0, "disabled": False},
             "pgs": {"0": {"desc": "default_pg", "size": world,
                           "ranks": ranges(list(range(world)))}},
             "memory": {key: 1 << 30 for key in layout.MEMORY_KEYS}, "step": None}
    spoolfile.write_atomic(directory, layout.state_name(rank, pid),
                           spoolfile.compose(state, {"status": status}))
    if entries:
        header = {"schema": layout.SCHEMA, "kind": "entries", "written_ns": now,
                  "identity": {"job_id": "bench-job", "rank": rank, "pid": pid}}
        spoolfile.write_atomic(directory, layout.entries_name(rank, pid), spoolfile.compose(
            header, {"dump": dump(template, world, first, count, now)}))


def run(collector: RanksCollector) -> tuple[float, int, int]:
    started = time.perf_counter()
    families = collector.collect(Context())
    text = render(families)[0]
    return (time.perf_counter() - started) * 1000, len(text), sum(
        len(f.samples) for f in families)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    template = json.loads(CAPTURE.read_text())["trace"]["entries_head"][0]
    results: dict[str, list[float]] = {"cold": [], "state only": [], "entries refreshed": []}
    series = size = 0
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeat):
            spool = os.path.join(tmp, f"spool{repeat}")
            options = {o.key: o.parse(o.default) for o in collector_options(RanksCollector)}
            options.update(spool_dir=spool, fr_dir=os.path.join(tmp, "fr"),
                           pipe_dir=os.path.join(tmp, "pipe"))
            collector = RanksCollector(Environment(RootedFS("/sys"), RootedFS("/proc")),
                                       options)
            for rank in range(args.ranks):
                write_rank(spool, rank, args.ranks, template, 0, args.entries, True)
            results["cold"].append(run(collector)[0])
            for rank in range(args.ranks):
                write_rank(spool, rank, args.ranks, template, 0, args.entries, False)
            results["state only"].append(run(collector)[0])
            for rank in range(args.ranks):
                write_rank(spool, rank, args.ranks, template, args.entries, args.entries, True)
            elapsed, size, series = run(collector)
            results["entries refreshed"].append(elapsed)
    summary = {name: statistics.median(times) for name, times in results.items()}
    for name, median in summary.items():
        print(f"{name:18} median {median:8.1f} ms  (runs: "
              f"{', '.join(f'{t:.1f}' for t in results[name])})")
    print(f"{args.ranks} ranks x {args.entries} entries: {series} samples, {size} bytes of text")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "ranks_ingest.json").write_text(json.dumps(
        {"ranks": args.ranks, "entries": args.entries, "median_ms": summary, "runs_ms": results,
         "samples": series, "text_bytes": size}, indent=1))


if __name__ == "__main__":
    main()
