"""What a whole-ring reporter tick costs the training thread, paced and unpaced: two one-rank
gloo jobs with an 8,000-record ring (the pure tests are in tests/ranks/test_trainer_gil.py)."""

from __future__ import annotations

from pathlib import Path

from tests.ranks.test_trainer_gil import run_one_rank

# A reporter tick over a full ring on a helper thread while the main thread, which gives the GIL
# away every iteration, notes its gaps; prints the longest gap and the tick thread's CPU time.
TICK = r"""
import json, os, sys, tempfile, threading, time
import torch, torch.distributed as dist
from llmmon_reporter.stepstats import StepStats
from llmmon_reporter.worker import Cadence, Reporter
from llmmon_reporter import entrylog, timeslice
dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0,
                        world_size=1)
for _ in range(int(os.environ["TORCH_FR_BUFFER_SIZE"]) + 100):
    dist.all_reduce(torch.ones(16))
entrylog.MAX_NEW = 10 ** 9  # the whole ring, as a ring tick without the cap decodes it
reporter = Reporter(sys.argv[1], Cadence(3600, 3600, 3600), StepStats())
if sys.argv[2] == "unpaced":
    reporter._pace.budget = float("inf")
reporter.tick(force=True)  # connects; the timed tick below is a second whole-ring tick
sys.setswitchinterval(1.0)
cpu, done = [], threading.Event()
def tick():
    started = time.thread_time()
    reporter.tick(force=True)
    cpu.append(time.thread_time() - started)
    done.set()
thread = threading.Thread(target=tick)
stamps = [time.perf_counter()]
thread.start()
while not done.is_set():
    time.sleep(0.0001)  # gives the GIL away, as a training step's kernels and I/O do
    stamps.append(time.perf_counter())
thread.join()
gap = max(b - a for a, b in zip(stamps, stamps[1:]))
print(json.dumps({"gap": gap, "cpu": cpu[0], "pauses": reporter._pace.pauses,
                  "native": reporter._session.flight.native}))
"""



def test_a_whole_ring_tick_never_keeps_the_training_thread_waiting_long(
        tmp_path: Path) -> None:
    """Paced, the longest wait is a sliver of the tick's CPU time; unpaced (the same tick, with
    pauses switched off) the training thread waits for the whole decoding of the ring (the
    native dump itself, about half the tick, runs without the GIL either way)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    paced = run_one_rank(TICK, str(spool), "paced", ring=8000)
    unpaced = run_one_rank(TICK, str(spool), "unpaced", ring=8000)
    assert paced["pauses"] > 10 and unpaced["pauses"] == 0
    assert paced["gap"] < 0.1 * paced["cpu"], paced
    assert unpaced["gap"] > 0.15 * unpaced["cpu"], unpaced  # the test can tell the two apart
