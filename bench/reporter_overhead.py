"""Training-loop overhead of the reporter: steps per second with and without it, side by side.

A CPU gloo job (--world ranks, one thread each) trains a Linear(1024, 1024) with an all_reduce
of the bf16 gradients every step.  The same processes alternate phases without and with a
reporter thread (default cadences: status 1 s, in-flight 5 s, entries 20 s, so each 20 s "on"
phase holds one or two full Flight Recorder dumps of the 2000-entry ring); every phase runs
the same number of steps, calibrated first.  Also reads the CPU time the reporter thread
itself used (/proc), which bounds its cost where a shared machine's noise swamps the steps/s
comparison.  Prints a table, writes bench/results/reporter_overhead.json.  Target: under 0.5 %.

    python bench/reporter_overhead.py [--phases 8] [--phase-seconds 20] [--world 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def thread_cpu_seconds(reporter: object) -> float:
    """User + system CPU time of the reporter's thread so far (Linux /proc, 10 ms ticks)."""
    tid = reporter._thread.native_id  # type: ignore[attr-defined]
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from llmmon_reporter.stepstats import StepStats
    from llmmon_reporter.worker import Cadence, Reporter

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=600))
    model = torch.nn.Linear(1024, 1024)
    data = torch.randn(64, 1024)
    steps = StepStats()

    def train(count: int, hook: bool = False) -> float:
        started = time.perf_counter()
        for _ in range(count):
            model.zero_grad()
            model(data).pow(2).mean().backward()
            for param in model.parameters():
                grad = param.grad.to(torch.bfloat16)
                dist.all_reduce(grad)
                param.grad.copy_(grad)
            if hook:
                steps.step(tokens=64)
        return time.perf_counter() - started

    # calibrate: rank 0 decides how many steps make one phase
    rate = 200 / train(200)
    decided = torch.tensor([int(rate * args.phase_seconds)])
    dist.broadcast(decided, 0)
    count = int(decided)
    phases = []
    for phase in range(args.phases):
        on = phase % 2 == 1
        reporter = Reporter(args.spool, Cadence(), steps) if on else None
        if reporter is not None:
            reporter.start()
        elapsed = train(count, hook=on)
        cpu = 0.0
        if reporter is not None:
            cpu = thread_cpu_seconds(reporter)
            reporter.stop()
            assert reporter.errors_total == 0, reporter.last_error
        phases.append({"reporter": on, "steps": count, "steps_per_second": count / elapsed,
                       "reporter_cpu_share": cpu / elapsed})
    if args.rank == 0:
        print(json.dumps(phases))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phases", type=int, default=8)
    parser.add_argument("--phase-seconds", type=float, default=20.0)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--spool", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, str(ROOT / "bench"))
    from common import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as spool:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        procs = [subprocess.Popen(
            [sys.executable, __file__, "--worker", "--rank", str(rank), "--world",
             str(args.world), "--port", str(port), "--spool", spool, "--phases",
             str(args.phases), "--phase-seconds", str(args.phase_seconds)],
            env=env, stdout=subprocess.PIPE, text=True) for rank in range(args.world)]
        try:
            out = procs[0].communicate(timeout=args.phases * args.phase_seconds * 3 + 120)[0]
            for proc in procs[1:]:
                proc.wait(timeout=60)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
    phases = json.loads(out.strip().splitlines()[-1])
    off = [p["steps_per_second"] for p in phases if not p["reporter"]]
    on = [p["steps_per_second"] for p in phases if p["reporter"]]
    overhead = (statistics.median(off) - statistics.median(on)) / statistics.median(off) * 100
    print(f"{'phase':>5} {'reporter':>8} {'steps':>7} {'steps/s':>9}")
    for number, phase in enumerate(phases):
        print(f"{number:>5} {'on' if phase['reporter'] else 'off':>8} {phase['steps']:>7} "
              f"{phase['steps_per_second']:>9.2f}")
    share = statistics.mean(p["reporter_cpu_share"] for p in phases if p["reporter"]) * 100
    print(f"median steps/s without {statistics.median(off):.2f}, with "
          f"{statistics.median(on):.2f}: overhead {overhead:+.2f} % "
          f"(phase spread without: {min(off):.2f}-{max(off):.2f})")
    print(f"reporter thread CPU time (rank 0): {share:.3f} % of the phase's wall time")
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "reporter_overhead.json").write_text(json.dumps(
        {"world": args.world, "phase_seconds": args.phase_seconds, "phases": phases,
         "median_without": statistics.median(off), "median_with": statistics.median(on),
         "overhead_percent": overhead, "reporter_cpu_percent": share}, indent=1))


if __name__ == "__main__":
    main()
