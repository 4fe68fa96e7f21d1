"""The cost of one reporter tick, on the CPU build of torch (gloo), with a full ring.

A one-rank gloo job fills the Flight Recorder with 2000 entries, then times the reporter's own
`tick()` on this thread: a status tick (status dump, parse, state file write; nothing completes
between the bench's ticks, so each also takes the training thread's stack and reads the
process' activity, as an idle or stuck rank's reporter does), a tick that also writes the
entries file (the whole ring, every 20 s by default), and the raw dump calls; then the stack
capture of a thread 40 frames deep and the activity read alone.  Prints
medians and p90s in microseconds; writes bench/results/reporter_tick.json.

    python bench/reporter_tick.py [--ticks 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(action: Callable[[], object], count: int) -> dict[str, float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1e6)
    times.sort()
    return {"median_us": statistics.median(times), "p90_us": times[int(len(times) * 0.9)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ticks", type=int, default=200)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    from llmmon_reporter import activity
    from llmmon_reporter.stepstats import StepStats
    from llmmon_reporter.worker import Cadence, Reporter

    sys.path.insert(0, str(ROOT / "bench"))
    from common import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    tensor = torch.ones(1024, dtype=torch.bfloat16)
    for _ in range(2000):
        dist.all_reduce(tensor)
    steps = StepStats()
    for _ in range(100):
        steps.step(tokens=1, loss=1.0)
    release = threading.Event()

    def nested(depth: int) -> None:
        release.wait() if depth == 0 else nested(depth - 1)

    deep = threading.Thread(target=nested, args=(40,), daemon=True)
    deep.start()
    with tempfile.TemporaryDirectory() as spool:
        reporter = Reporter(spool, Cadence(status=1.0, inflight=3600, entries=3600), steps)
        reporter.tick(force=True)  # connects, writes both files once
        session = reporter._session
        assert session is not None
        results = {
            "status tick (status dump, parse, state file)": timed(reporter.tick, args.ticks),
            "tick with entries file (whole ring)": timed(lambda: reporter.tick(True),
                                                         max(args.ticks // 10, 5)),
            "status dump alone": timed(session.flight.status, args.ticks),
            "full dump alone (2000 entries)": timed(session.flight.full,
                                                    max(args.ticks // 10, 5)),
            "step() hook": timed(lambda: steps.step(tokens=1, loss=1.0), args.ticks * 10),
            "stack of a thread 40 frames deep": timed(lambda: activity.stack(deep.ident or 0),
                                                      args.ticks),
            "activity read (3 procfs files)": timed(reporter._meter.read, args.ticks),
        }
        release.set()
        sizes = {path.name: path.stat().st_size for path in Path(spool).rglob("*.json")}
    dist.destroy_process_group()
    for name, result in results.items():
        print(f"{name:48} median {result['median_us']:10.1f} us   p90 {result['p90_us']:10.1f} us")
    print(f"files: {sizes}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "reporter_tick.json").write_text(json.dumps(
        {"torch": torch.__version__, "results": results, "file_bytes": sizes}, indent=1))


if __name__ == "__main__":
    main()
