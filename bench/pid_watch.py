"""The ranks' PID watch: its thread's CPU with nothing to follow, with real processes it holds a
pidfd of, and with processes it can only poll (seen through a copied procfs, as from another PID
namespace), side by side in one run.

    python bench/pid_watch.py [--ranks 8] [--seconds 30]

With nothing to follow or every pidfd held it polls once a second (exits wake the thread
through the pidfds); polling only, every `--collector.ranks.pid-poll` (100 ms), as every case
did before: the first two cases run again with the slow poll turned off (`HELD_POLL` set to
100 ms), for the figures before the change.
CPU time is the thread's `/proc/self/task/TID/schedstat` (nanoseconds the scheduler charged).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llmmon.ranks import liveness
from llmmon.ranks.liveness import PidWatch
from llmmon.sources import procstat
from llmmon.sources.fs import RootedFS

INTERVAL = 0.1  # the shipped pid_poll


def thread_ns(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/schedstat") as handle:
        return int(handle.read().split()[0])


def measure(procfs: str, followed: dict[tuple[str, int, int], int], seconds: float,
            held_poll: float) -> float:
    """Percent of a core the watch's thread used over `seconds`, after it saw every process."""
    liveness.HELD_POLL = held_poll
    watch = PidWatch(RootedFS(procfs), INTERVAL)
    watch.start()
    try:
        watch.follow(followed)
        deadline = time.monotonic() + 30
        while not all((p := watch.get(k)) and p.visible for k in followed):
            if time.monotonic() > deadline:
                raise RuntimeError("the watch did not see every process within 30 s")
            time.sleep(0.05)
        time.sleep(1.0)  # its pidfds registered
        tid = watch._thread.native_id  # noqa: SLF001 (the bench reads the real thread's CPU)
        start, began = thread_ns(tid), time.monotonic()
        time.sleep(seconds)
        return 100 * (thread_ns(tid) - start) / 1e9 / (time.monotonic() - began)
    finally:
        watch.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    children = [subprocess.Popen(["sleep", "3600"]) for _ in range(args.ranks)]
    work = Path(tempfile.mkdtemp(prefix="llmmon-pidwatch-"))
    try:
        own = RootedFS("/proc")
        ticks = {c.pid: procstat.read(own, c.pid).start_ticks for c in children}
        copied = work / "proc"
        for n, child in enumerate(children):  # numbers no process here has (> 2**22)
            (copied / str(4_500_000 + n)).mkdir(parents=True)
            shutil.copy(f"/proc/{child.pid}/stat", copied / str(4_500_000 + n) / "stat")
        held = {("bench", n, c.pid): ticks[c.pid] for n, c in enumerate(children)}
        polled = {("bench", n, 4_500_000 + n): ticks[c.pid] for n, c in enumerate(children)}
        shipped = liveness.HELD_POLL
        cases = {
            "nothing to follow": ("/proc", {}, shipped),
            "nothing to follow, polled every 100 ms (before)": ("/proc", {}, INTERVAL),
            f"{args.ranks} processes, pidfds held": ("/proc", held, shipped),
            f"{args.ranks} processes, pidfds held, polled every 100 ms (before)": (
                "/proc", held, INTERVAL),
            f"{args.ranks} processes, polled only (another procfs)": (str(copied), polled, shipped),
        }
        print(f"{'case':<66}{'% of a core':>12}")
        for name, (procfs, followed, held_poll) in cases.items():
            print(f"{name:<66}{measure(procfs, followed, args.seconds, held_poll):>12.3f}",
                  flush=True)
    finally:
        for child in children:
            child.kill()
            child.wait()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
