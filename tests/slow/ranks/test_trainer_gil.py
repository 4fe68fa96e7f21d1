"""What the reporter costs the training thread, in one-rank gloo jobs with a full ring: torch's
ring dump runs without the GIL, and a whole-ring tick, paced, keeps the training thread waiting
only a sliver of its CPU time (the pure tests are in tests/ranks/test_trainer_gil.py).

The timing claims are checked as ratios inside one process, never against a wall-clock limit:
with the switch interval raised to a second, a thread that does not give the GIL away itself
keeps it, so how long the other thread is kept waiting shows directly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ranks.jobs import base_env

# One gloo rank with a full ring; prints what the test asserts as one JSON line.
PROBE = r"""
import json, os, sys, tempfile, threading, time
import torch, torch.distributed as dist
from llmmon_reporter import entrylog, flight, native
c10d = torch._C._distributed_c10d
dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0,
                        world_size=1)
for _ in range(int(os.environ["TORCH_FR_BUFFER_SIZE"]) + 100):
    dist.all_reduce(torch.ones(16))
# gloo retires the last record a moment after all_reduce returns: two reads compare the same ring
while not all(e["retired"] for e in json.loads(c10d._dump_fr_trace_json())["entries"]):
    time.sleep(0.01)
out = {"off": native.load(torch.__file__, "_dump_fr_trace_json",
                          {"LLMMON_REPORTER_NATIVE": "0"}) is None}
dump = native.load(torch.__file__, "_dump_fr_trace_json", os.environ)
binding = c10d._dump_fr_trace_json
out["same"] = json.loads(dump(includeCollectives=True, onlyActive=False))["entries"] == \
    json.loads(binding(includeCollectives=True, onlyActive=False))["entries"]
recorder = flight.FlightRecorder(c10d, "_dump_fr_trace_json", dump)
pickled = flight.FlightRecorder(c10d, "_dump_fr_trace_json")
out["native"], out["pickled_native"] = recorder.native, pickled.native
ring = lambda fr: json.loads(json.dumps(fr.ring(entrylog.project)["entries"]))
out["ring_same"] = ring(recorder) == ring(pickled)
out["records"] = len(ring(recorder))
class Counted(entrylog._Selection):  # a ring tick's selection, counting the records it decodes
    decoded = 0
    def __call__(self, entry):
        self.decoded += 1
        return super().__call__(entry)
last = max(e["record_id"] for e in json.loads(binding(includeCollectives=True,
                                                      onlyActive=False))["entries"])
ticked, sifted = Counted(last - 10), Counted(last - 10)
out["tick_new"] = recorder.ring(ticked)["entries"] == pickled.ring(sifted)["entries"]
out["tick_ids"] = [ticked.first, ticked.last, ticked.pending] == \
    [sifted.first, sifted.last, sifted.pending]
out["tick_decoded"], out["sift_decoded"] = ticked.decoded, sifted.decoded

sys.setswitchinterval(1.0)  # a thread holding the GIL keeps it for up to a second
count, stop, running = [0], threading.Event(), threading.Event()
def spin():
    running.set()
    while not stop.is_set():
        count[0] += 1
thread = threading.Thread(target=spin)
thread.start()
running.wait()
def progress(call):
    before = count[0]
    call(includeCollectives=True, onlyActive=False)
    return count[0] - before
out["spun_native"], out["spun_binding"] = progress(dump), progress(binding)
stop.set()
thread.join()
print(json.dumps(out))
"""

def run_one_rank(code: str, *args: str, ring: int = 2000) -> dict:
    """Run `code` as one gloo rank with a ring of `ring` records; the JSON line it prints."""
    env = base_env(TORCH_FR_BUFFER_SIZE=str(ring), LLMMON_JOB="gil", RANK="0")
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not __import__("llmmon_reporter.native").native.supported(),
                    reason="the native dump is x86-64 Linux only; elsewhere the binding is used")
def test_the_native_dump_answers_what_the_binding_does_without_holding_the_gil(
        tmp_path: Path) -> None:
    out = run_one_rank(PROBE)
    assert out["off"], "LLMMON_REPORTER_NATIVE=0 must leave the native dump out"
    assert out["same"] and out["ring_same"] and out["records"] == 2000
    assert out["native"] and not out["pickled_native"]
    # A tick after 10 new records decodes the first record, the last one shipped and the 10
    # from torch's own dump, not the 2,000 of the ring, and keeps what reading them all keeps.
    assert out["tick_new"] and out["tick_ids"]
    assert (out["tick_decoded"], out["sift_decoded"]) == (12, 2000)
    # Another thread ran while the native dump did; none while the binding did (which is why).
    assert out["spun_native"] > 0
    assert out["spun_binding"] == 0


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
