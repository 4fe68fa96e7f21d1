"""Trainer jitter: how long the reporter thread holds up the training (main) thread, per tick kind.

Synchronous training amplifies jitter: one rank held up by tens of milliseconds delays every
step of the job. This bench runs a training loop that timestamps every iteration while a
reporter thread at its default cadences works over a 2,000-entry Flight Recorder ring (one-rank
gloo job on the CPU build of torch), in the same process:

- `python` loop: a fixed pure-Python work unit (~0.5 ms), the worst case for GIL hand-offs;
- `gloo` loop: a small step (Linear forward/backward, all_reduce of the gradients);
- `bf16` loop (a GPU, the H200 variant): a bf16 step on cuda:0 (4 x Linear(4096, 4096), 8192
  tokens), every gradient all-reduced through NCCL, the loss read back (a synchronised step);
  the process group is then NCCL's, so it runs without the `gloo` loop.

The loop's time is cut into blocks (`--block`, 5 s) that cycle off, on, control: the reporter
ticks only in `on` blocks; in `control` blocks a thread at the reporter's priority does, at the
ring cadence, CPU work that holds no GIL and lasts as long as torch's ring dump (a sha256 of a
calibrated buffer): what any C work beside the loop costs it on this machine, whoever does it.
Each block is compared with the `off` block of its cycle, a few seconds away, so the machine's
drift between two long phases does not enter the step-time overhead.

The reporter's ticks are timed on its own thread (status: a tick that dumps the status and
writes the state file; ring: a tick that also reads the ring and appends to the entries log,
with torch's own ring read timed alone as ring-read: without the GIL where the reporter calls
the C++ dump itself (`native`), else one binding call that holds it; in-flight: the read of the
records not yet final, which a healthy job never takes, so a helper thread calls it at the
in-flight cadence to show its cost; stack: the training thread's stack, which the reporter takes
only while nothing completes, taken by the same helper every status second to show its cost
under load). The stall a call adds is the longest main-thread gap
overlapping it minus the median gap of the off blocks (and the calling thread's CPU time in it:
a ring tick's minus torch's ring read's is the Python work that holds the GIL, and summed over
the ticks it bounds what the GIL can take from the loop); its floor is the same measure over
the same window laid on the off block of its cycle (the loop's own pauses: garbage collection,
the OS). Prints a table and writes bench/results/trainer_jitter.json. Targets (issue:
performance): at p99 no tick adds more than 1 ms to the main thread, at most 5 ms at max,
step-time overhead under 0.2 %.

`--sampler pyspy` measures instead what the daemon's stack sampler costs a rank that runs
without the reporter (llmmon/ranks/stacksampler.py): in `on` blocks no reporter runs; a thread
of the bench runs the real `py-spy dump --pid <this process> --json --nonblocking` through
llmmon.sources.pyspy.dump, first at the block's start and then every `--pyspy-interval`
seconds (5: the daemon's default; 2: its quick rate while a job looks still, which 5 s blocks
take three times a block, 0.6 dumps a second), and the control is a no-GIL CPU call that takes
as much CPU as py-spy takes for a dump, at the same interval. py-spy is a process of its own:
what it costs the loop is its reads of this process' memory and the CPU it takes beside it. A
dump's stall is measured as a tick's; its CPU is py-spy's (the children's, as the daemon's
budget counts it) and, apart, the calling thread's (starting py-spy, decoding its JSON: the
daemon's work, done here in the trainer's process, so it overstates the cost). Targets
(issue): step-time overhead at the default rate under 0.5 %; the stall a sample adds.
A cost that small is below what adjacent blocks resolve on a small VM, so several intervals
(`--pyspy-interval 5,1,0.1`) measure it at rates up to tens of times the default, and the step
time one dump costs is fitted to all of them (a line through the origin, weighted by each
rate's standard error): the cost at the default rate is that times its rate, and how well the
rates fit one line says whether scaling it down holds. Writes
bench/results/trainer_jitter_pyspy.json.

    python bench/trainer_jitter.py [--seconds 65] [--block 5] [--loops python,gloo]
                                   [--entries-interval 20]
                                   [--sampler pyspy --pyspy-interval 5[,1,0.1]]

At the default cadence 65 s of on blocks hold three ring ticks, so their "p99" is their
maximum; `--entries-interval 1` gives a ring tick every on-block second, the same read each
time, for a p99 that is one.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import os
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from llmmon_reporter import activity
from llmmon_reporter.stepstats import StepStats
from llmmon_reporter.worker import Cadence, Reporter

ROOT = Path(__file__).resolve().parent.parent
RING = 2000
os.environ.setdefault("TORCH_FR_BUFFER_SIZE", str(RING))
os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", str(RING))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _user_seconds() -> float:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_utime


def _children_seconds() -> float:
    """CPU of the child processes waited for (os.times' children, at getrusage's resolution:
    os.times counts in 10 ms clock ticks)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Ticks:
    """(kind, start, end) of every timed reporter call, on the perf_counter clock."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float]] = []
        self.cpu: dict[float, float] = {}  # a span's start -> its thread's CPU seconds in it
        self.user: dict[float, float] = {}  # ... of them in user space (syscalls drop the GIL)
        self.children: dict[float, float] = {}  # ... of the child processes it waited for
        self.lock = threading.Lock()

    def wrap(self, kind: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started, cpu, user = time.perf_counter(), time.thread_time(), _user_seconds()
            children = _children_seconds()
            try:
                return call(*args, **kwargs)
            finally:
                with self.lock:
                    self.spans.append((kind, started, time.perf_counter()))
                    self.cpu[started] = time.thread_time() - cpu
                    self.user[started] = _user_seconds() - user
                    self.children[started] = _children_seconds() - children
        return timed


def machine_cpu() -> tuple[int, int]:
    """The machine's (steal, all) CPU jiffies so far: a virtual machine's hypervisor takes its
    vCPUs away (steal) most when the guest keeps them all busy."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[7] if len(fields) > 7 else 0, sum(fields[:8])


class Blocks:
    """The loop's time cut into blocks that cycle off, on, control: the reporter ticks only in
    `on` blocks, the control thread works only in `control` blocks, and neither starts work
    within MARGIN of its block's end.  Adjacent blocks see the same machine, so comparing a
    block with the `off` block of its cycle cancels the drift that two long phases carry."""

    KINDS = ("off", "on", "control")
    MARGIN = 0.5  # seconds: a tick or control call started later would run into the next block

    def __init__(self) -> None:
        self.kind = "on"  # while the reporter connects, before the loop
        self.until = float("inf")
        self.spans: list[tuple[str, int, int, float]] = []  # (kind, first stamp, last, start)
        self.cpu: dict[str, list[int]] = {}  # kind -> the machine's [steal, all] jiffies in it

    def only(self, kind: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def gated(*args: Any, **kwargs: Any) -> Any:
            if self.kind == kind and time.perf_counter() < self.until - self.MARGIN:
                return call(*args, **kwargs)
            return None
        return gated

    def run(self, work: Callable[[], None], seconds: float, block: float) -> list[float]:
        """Timestamps of every iteration's end over `seconds` of each kind of block."""
        stamps = [time.perf_counter()]
        for _ in range(max(1, round(seconds / block))):
            for kind in self.KINDS:
                first, self.kind = len(stamps) - 1, kind
                self.until = stamps[-1] + block
                before = machine_cpu()
                while stamps[-1] < self.until:
                    work()
                    stamps.append(time.perf_counter())
                self.spans.append((kind, first, len(stamps) - 1, stamps[first]))
                after, total = machine_cpu(), self.cpu.setdefault(kind, [0, 0])
                total[0] += after[0] - before[0]
                total[1] += after[1] - before[1]
        self.kind = "done"
        return stamps

    def of(self, t: float) -> tuple[str, float, int] | None:
        """(kind, start, cycle) of the block that holds time `t`."""
        for i, (kind, _, _, start) in enumerate(self.spans):
            following = self.spans[i + 1][3] if i + 1 < len(self.spans) else float("inf")
            if start <= t < following:
                return kind, start, i // len(self.KINDS)
        return None

    def shift_to_off(self, start: float, end: float) -> tuple[float, float]:
        """The same window laid on the `off` block of its cycle (same offset in the block)."""
        _, block_start, cycle = self.of(start)  # type: ignore[misc]
        off_start = self.spans[cycle * len(self.KINDS)][3]
        return start - block_start + off_start, end - block_start + off_start

    def gaps(self, stamps: list[float], kind: str) -> list[list[float]]:
        """Per cycle, the iteration gaps of its block of `kind`."""
        return [[b - a for a, b in zip(stamps[first:last], stamps[first + 1:last + 1])]
                for k, first, last, _ in self.spans if k == kind]


def classify(spans: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """Ticks that wrote the entries log are `ring` ticks, the others `status` ticks; torch's
    ring read inside a ring tick is its own kind (`ring-read`: the GIL-holding floor)."""
    rings = [(start, end) for kind, start, end in spans if kind == "ring-write"]
    out = []
    for kind, start, end in spans:
        if kind == "tick":
            kind = "ring" if any(start <= s and e <= end for s, e in rings) else "status"
        if kind == "ring-read" and not any(s <= start and end <= e for s, e in rings):
            continue  # an in-flight read, timed as in-flight
        if kind != "ring-write":
            out.append((kind, start, end))
    return out


def stalls(stamps: list[float], spans: list[tuple[str, float, float]],
           baseline: float) -> dict[str, list[float]]:
    """Per tick kind, the main-thread delay beyond the baseline gap during each of its ticks."""
    out: dict[str, list[float]] = {}
    for kind, start, end in spans:
        first = max(bisect.bisect_left(stamps, start) - 1, 0)
        last = min(bisect.bisect_right(stamps, end) + 1, len(stamps))
        worst = max((b - a for a, b in zip(stamps[first:last], stamps[first + 1:last])),
                    default=0.0)
        out.setdefault(kind, []).append(max(worst - baseline, 0.0))
    return out


def summary(gaps: list[float]) -> dict[str, float]:
    return {"iterations": len(gaps), "mean_ms": statistics.fmean(gaps) * 1e3,
            "median_ms": statistics.median(gaps) * 1e3, "p99_ms": percentile(gaps, 0.99) * 1e3,
            "max_ms": max(gaps) * 1e3}


def overhead(blocks: Blocks, stamps: list[float], kind: str) -> dict[str, float]:
    """Per cycle, the mean gap of its `kind` block against its `off` block's (%): median and
    quartiles over the cycles, and the pooled figure."""
    pairs = list(zip(blocks.gaps(stamps, "off"), blocks.gaps(stamps, kind)))
    ratios = sorted((statistics.fmean(b) / statistics.fmean(a) - 1) * 100 for a, b in pairs)
    pooled = statistics.fmean([g for _, b in pairs for g in b]) \
        / statistics.fmean([g for a, _ in pairs for g in a])
    spread = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else float("inf")
    return {"pairs": len(ratios), "median_pct": statistics.median(ratios),
            "p25_pct": percentile(ratios, 0.25), "p75_pct": percentile(ratios, 0.75),
            "mean_pct": statistics.fmean(ratios), "stderr_pct": spread,
            "pooled_pct": (pooled - 1) * 100}


def per_dump(points: list[tuple[float, float, float]], rate: float) -> dict[str, float]:
    """Step time a dump costs, from (dumps a second, overhead %, its standard error) at several
    rates: the weighted least-squares line through the origin (no dumps, no cost).  A cost too
    small to resolve at the default rate is resolved at rates many times it; the points' fit to
    one line says whether scaling it down holds."""
    weights = [1 / max(err, 1e-9) ** 2 for _, _, err in points]
    slope = sum(w * r * o for w, (r, o, _) in zip(weights, points)) \
        / sum(w * r * r for w, (r, _, _) in zip(weights, points))
    slope_err = sum(w * r * r for w, (r, _, _) in zip(weights, points)) ** -0.5
    chi2 = sum(w * (o - slope * r) ** 2 for w, (r, o, _) in zip(weights, points))
    return {"ms_per_dump": slope * 10, "ms_per_dump_stderr": slope_err * 10,
            "at_rate_pct": slope * rate, "at_rate_pct_upper95": (slope + 1.96 * slope_err) * rate,
            "rate_per_s": rate, "chi2": chi2, "points": len(points)}


def control_call(seconds: float) -> Callable[[], None]:
    """CPU work that holds no GIL and lasts about `seconds` (one sha256 of a calibrated buffer):
    what any other thread's C work, torch's dump or not, costs the loop on this machine."""
    probe = bytes(8 << 20)
    started = time.perf_counter()
    hashlib.sha256(probe).digest()
    size = max(1 << 16, int(len(probe) * seconds / (time.perf_counter() - started)))
    buffer = bytes(size)
    return lambda: hashlib.sha256(buffer).digest() and None


def measure(work: Callable[[], None], seconds: float, block: float, cadence: Cadence,
            pyspy_interval: float | None = None) -> dict[str, Any]:
    """One loop over `seconds` of each kind of block, with a reporter ticking in `on` blocks
    (or, with `pyspy_interval`, py-spy dumping this process) and the control in `control`
    blocks."""
    ticks, blocks = Ticks(), Blocks()
    sample: PySpySample | None = None
    if pyspy_interval is None:
        reporter, native, read_seconds, scheduled = _reporter_calls(ticks, blocks, cadence)
        wake, nice = cadence.status, 10  # as the reporter's
    else:
        reporter, native = None, False
        sample = _pyspy_call()
        # the control: as much CPU as py-spy takes for a dump (most of a dump's time is waits)
        read_seconds = statistics.median(_timed(sample, _children_seconds) for _ in range(5))
        sample.failed = 0  # the calibration's are not the blocks'
        scheduled = [("on", blocks.only("on", ticks.wrap("py-spy", sample)), pyspy_interval)]
        # py-spy runs at the daemon's priority, not the reporter's
        wake, nice = min(0.1, pyspy_interval / 4), 0
    control = control_call(read_seconds)
    if pyspy_interval is not None:  # at the dumps' interval: a call that ran returns non-None
        # (the control returns None, so beside the reporter it runs at every status second)
        control = (lambda call: lambda: call() or True)(control)
    scheduled.append(("control", blocks.only("control", ticks.wrap("control", control)),
                      pyspy_interval or cadence.entries))
    stop = threading.Event()

    def helpers() -> None:  # each call at its cadence, in the blocks of its kind
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        due = [0.0] * len(scheduled)
        while not stop.wait(wake):
            now = time.perf_counter()
            for i, (kind, call, every) in enumerate(scheduled):
                if blocks.kind == kind and now >= due[i] and call() is not None:
                    due[i] = now + every

    helper = threading.Thread(target=helpers, daemon=True)
    helper.start()
    stamps = blocks.run(work, seconds, block)
    if not helper.is_alive():  # its calls stopped part-way: the blocks compare nothing
        raise SystemExit("the helper thread died (its traceback is above); no figures")
    stop.set()
    if reporter is not None:
        reporter.stop()
    helper.join()
    off_gaps = [g for gaps in blocks.gaps(stamps, "off") for g in gaps]
    on_gaps = [g for gaps in blocks.gaps(stamps, "on") for g in gaps]
    baseline = statistics.median(off_gaps)
    # only calls wholly inside the block they started in
    spans = []
    for kind, start, end in classify(ticks.spans):
        where = blocks.of(start)
        if where is not None and blocks.of(end) == where:
            spans.append((kind, start, end))
    kinds = stalls(stamps, spans, baseline)
    # The loop's own noise (GC, the OS): the same windows laid on the off block of their cycle
    floors = stalls(stamps, [(kind, *blocks.shift_to_off(start, end))
                             for kind, start, end in spans], baseline)
    durations: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for kind, start, end in spans:
        durations.setdefault(kind, []).append(end - start)
        cpu.setdefault(kind, []).append(ticks.cpu[start])
    on_seconds = sum(on_gaps)
    # User-space CPU of the reporter's ticks outside torch's GIL-free dump: the most they held
    # the GIL (Python releases it around the system calls that write the files)
    reads = [(start, end) for kind, start, end in spans if kind == "ring-read"]
    held = sum(ticks.user[start] - sum(ticks.user[s] for s, e in reads if start <= s and e <= end)
               for kind, start, end in spans if kind in ("ring", "status"))
    return {
        "block_seconds": block, "without": summary(off_gaps), "with": summary(on_gaps),
        "overhead": overhead(blocks, stamps, "on"),
        "control_overhead": overhead(blocks, stamps, "control"),
        "reporter_gil_bound_pct": held / on_seconds * 100 if native else None,
        "control_seconds": read_seconds, "on_seconds": on_seconds,
        "failed_dumps": sample.failed if sample else 0,
        # the stalls beyond their floors, summed: the step time they can account for
        "stall_share_pct": {kind: (sum(values) - sum(floors[kind])) / on_seconds * 100
                            for kind, values in kinds.items()},
        "steal_pct": {kind: steal / max(total, 1) * 100
                      for kind, (steal, total) in blocks.cpu.items()},
        "ticks": {kind: {"count": len(values),
                         "stall_median_ms": statistics.median(values) * 1e3,
                         "stall_p90_ms": percentile(values, 0.90) * 1e3,
                         "stall_p99_ms": percentile(values, 0.99) * 1e3,
                         "stall_max_ms": max(values) * 1e3,
                         "floor_p99_ms": percentile(floors[kind], 0.99) * 1e3,
                         "floor_max_ms": max(floors[kind]) * 1e3,
                         "tick_median_ms": statistics.median(durations[kind]) * 1e3,
                         "cpu_median_ms": statistics.median(cpu[kind]) * 1e3,
                         "user_median_ms": statistics.median(ticks.user[start] for k, start, _
                                                             in spans if k == kind) * 1e3,
                         "children_cpu_median_ms": statistics.median(
                             ticks.children[start] for k, start, _ in spans if k == kind) * 1e3,
                         "children_cpu_max_ms": max(
                             ticks.children[start] for k, start, _ in spans if k == kind) * 1e3}
                  for kind, values in kinds.items()}}


def _pyspy_call() -> PySpySample:
    """The daemon's stack sample of this process: the real py-spy, from outside."""
    from llmmon.ranks.stacksampler import DUMP_TIMEOUT
    from llmmon.sources import pyspy
    binary = pyspy.find_binary("py-spy")
    if binary is None:
        raise SystemExit("py-spy not found on PATH nor beside this interpreter")
    return PySpySample(binary, os.getpid(), DUMP_TIMEOUT)


class PySpySample:
    """One dump per call.  A dump that failed still ran (py-spy's non-blocking read can catch
    the memory mid-change: "Bad address"): the daemon counts it, and so does this bench."""

    def __init__(self, binary: str, pid: int, timeout: float) -> None:
        self.binary, self.pid, self.timeout = binary, pid, timeout
        self.failed = 0

    def __call__(self) -> bool:
        from llmmon.sources import pyspy
        try:
            pyspy.dump(self.binary, self.pid, self.timeout)
        except pyspy.StackError:
            self.failed += 1
            return False
        return True


def _default_stack_interval() -> float:
    """Seconds between a rank's stack samples at the daemon's defaults."""
    from llmmon.collectors.ranks import RanksCollector
    option = next(o for o in RanksCollector.options if o.key == "stack_interval")
    return option.parse(option.default)


def _reporter_calls(ticks: Ticks, blocks: Blocks, cadence: Cadence) -> tuple[
        Reporter, bool, float, list[tuple[str, Callable[[], Any], float]]]:
    """A reporter ticking in `on` blocks, started and connected; whether torch's ring read is
    its native one; that read's median seconds; the helper's calls in `on` blocks (kind, call,
    seconds between calls)."""
    spool = tempfile.mkdtemp(prefix="llmmon-jitter-spool-")
    os.environ.update(LLMMON_JOB="jitter", RANK="0")
    reporter = Reporter(spool, cadence, StepStats())
    reporter.tick = blocks.only(  # type: ignore[method-assign]
        "on", ticks.wrap("tick", reporter.tick))
    reporter._write_entries = ticks.wrap(  # type: ignore[method-assign]
        "ring-write", reporter._write_entries)
    reporter.start()
    while reporter._session is None:  # connected: the first tick ran
        time.sleep(0.05)
    flight = reporter._session.flight
    if flight.native:  # torch's one call: without the GIL, or through the binding
        read_seconds = statistics.median(_timed(lambda: flight._native(True, False))
                                         for _ in range(5))
        flight._native = ticks.wrap("ring-read", flight._native)
    else:
        read_seconds = statistics.median(
            _timed(lambda: flight._pickled(includeCollectives=True, includeStackTraces=False,
                                           onlyActive=False)) for _ in range(5))
        flight._pickled = ticks.wrap("ring-read", flight._pickled)
    ticks.spans.clear()
    # the in-flight read at its cadence; the training thread's stack every status second
    active = blocks.only("on", ticks.wrap("in-flight", reporter._session.flight.active))
    main_thread = threading.get_ident()
    stack = blocks.only("on", ticks.wrap("stack", lambda: activity.stack(main_thread)))
    return reporter, flight.native, read_seconds, [("on", active, cadence.inflight),
                                                   ("on", stack, 0.0)]


def _timed(call: Callable[[], Any], clock: Callable[[], float] = time.perf_counter) -> float:
    started = clock()
    call()
    return clock() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=65.0,
                        help="per kind of block (off, on, control) and loop (default 65: three "
                        "ring ticks)")
    parser.add_argument("--block", type=float, default=5.0,
                        help="seconds per block (default 5: 13 cycles of off, on, control)")
    parser.add_argument("--loops", default="python,gloo")
    parser.add_argument("--entries-interval", type=float, default=Cadence.entries,
                        help="seconds between ring ticks (default the reporter's 20; a shorter "
                        "one gives enough ring ticks for a p99: each costs the same, the whole "
                        "ring is read whatever is new)")
    parser.add_argument("--whole-ring", action="store_true",
                        help="decode every record of each ring read, as the reporter did before "
                        "it skipped to the first record not yet shipped (a before/after run)")
    parser.add_argument("--sampler", choices=("reporter", "pyspy"), default="reporter",
                        help="what works in `on` blocks: the reporter in the process (default), "
                        "or py-spy dumping it from outside as the daemon samples a rank that "
                        "runs without the reporter")
    parser.add_argument("--pyspy-interval", default="5",
                        type=lambda text: [float(v) for v in text.split(",")],
                        help="with --sampler pyspy, seconds between dumps in an on block "
                        "(default 5: --collector.ranks.stack-interval's; 2: the quick rate); "
                        "several, comma-separated, also fit the step time one dump costs")
    args = parser.parse_args()
    if args.whole_ring:
        from llmmon_reporter import entrylog
        entrylog._Selection.seek = lambda self, text, pos: pos  # type: ignore[method-assign]

    import torch
    import torch.distributed as dist

    names = args.loops.split(",")
    gpu = "bf16" in names
    if gpu and "gloo" in names:
        parser.error("the bf16 loop's process group is NCCL's: run the gloo loop separately")
    work_dir = tempfile.mkdtemp(prefix="llmmon-jitter-")
    if gpu:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if gpu else "gloo", init_method=f"file://{work_dir}/store",
                            rank=0, world_size=1)
    device = "cuda" if gpu else "cpu"
    for _ in range(RING):  # fill the ring
        dist.all_reduce(torch.ones(16, device=device))
    model = torch.nn.Linear(256, 256)
    data = torch.randn(64, 256)
    if gpu:
        model = torch.nn.Sequential(*(torch.nn.Linear(4096, 4096) for _ in range(4))).to(
            device, torch.bfloat16)
        data = torch.randn(8192, 4096, device=device, dtype=torch.bfloat16)

    def python_work() -> None:
        sum(i * i for i in range(6000))

    def step_work() -> None:
        model.zero_grad()
        loss = model(data).float().pow(2).mean()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
        loss.item()  # the step ends when the GPU is done with it

    loops = {"python": python_work, "gloo": step_work, "bf16": step_work}
    cadence = Cadence(entries=args.entries_interval)
    results: dict[str, Any] = {"torch": torch.__version__, "ring": RING,
                               "gpu": torch.cuda.get_device_name(0) if gpu else None,
                               "native": os.environ.get("LLMMON_REPORTER_NATIVE", "1") != "0",
                               "cadence_s": {"status": cadence.status,
                                             "inflight": cadence.inflight,
                                             "entries": cadence.entries},
                               "seconds": args.seconds, "sampler": args.sampler}
    intervals = args.pyspy_interval if args.sampler == "pyspy" else [None]
    runs: dict[str, Any] = {}
    for interval in intervals:
        loops_out: dict[str, Any] = {}
        for name in names:
            load = os.getloadavg()  # another job on this machine shows here
            loops_out[name] = measure(loops[name], args.seconds, args.block, cadence, interval)
            loops_out[name]["loadavg"] = {"start": load, "end": os.getloadavg()}
            report(name, loops_out[name], args.sampler, interval)
        runs[f"{interval:g}" if interval else "reporter"] = loops_out
    dist.destroy_process_group()
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    if args.sampler == "reporter":
        results["loops"] = runs["reporter"]
        (out / "trainer_jitter.json").write_text(json.dumps(results, indent=1))
        return
    results["intervals"] = runs
    results["per_dump"] = {}
    default = _default_stack_interval()
    for name in names:
        results["per_dump"][name] = {}
        for label, key, kind in (("py-spy", "overhead", "py-spy"),
                                 ("control", "control_overhead", "control")):
            points = [(run[name]["ticks"][kind]["count"] / run[name]["on_seconds"],
                       run[name][key]["mean_pct"], run[name][key]["stderr_pct"])
                      for run in runs.values() if kind in run[name]["ticks"]]
            fit = per_dump(points, 1 / default)
            results["per_dump"][name][label] = fit
            print(f"{name:8}{label:12} per dump, fitted over {fit['points']} rates: "
                  f"{fit['ms_per_dump']:.2f} ± {fit['ms_per_dump_stderr']:.2f} ms of step time; "
                  f"at one dump every {default:g} s {fit['at_rate_pct']:+.3f} % "
                  f"(95 % upper {fit['at_rate_pct_upper95']:+.3f} %); chi2 {fit['chi2']:.1f}")
    (out / "trainer_jitter_pyspy.json").write_text(json.dumps(results, indent=1))


def report(name: str, loop: dict[str, Any], sampler: str, interval: float | None) -> None:
    """One loop's figures, as it ends."""
    title = f"py-spy every {interval:g} s" if interval else "reporter"
    print(f"\n{name}, {title}\n{'loop':8}{'kind':12}{'count':>6}{'call med':>10}{'cpu med':>9}"
          f"{'user med':>9}{'stall med':>11}{'stall p90':>11}{'stall p99':>11}{'stall max':>11}"
          f"{'floor p99':>11}{'floor max':>11}   (ms; targets p99 <= 1, max <= 5)")
    for kind, tick in sorted(loop["ticks"].items()):
        print(f"{name:8}{kind:12}{tick['count']:>6}{tick['tick_median_ms']:>10.2f}"
              f"{tick['cpu_median_ms']:>9.2f}{tick['user_median_ms']:>9.2f}"
              f"{tick['stall_median_ms']:>11.2f}"
              f"{tick['stall_p90_ms']:>11.2f}{tick['stall_p99_ms']:>11.2f}"
              f"{tick['stall_max_ms']:>11.2f}"
              f"{tick['floor_p99_ms']:>11.2f}{tick['floor_max_ms']:>11.2f}")
    print(f"{name:8}{'gaps':12} without: median {loop['without']['median_ms']:.3f} p99 "
          f"{loop['without']['p99_ms']:.3f} max {loop['without']['max_ms']:.2f}; with: "
          f"median {loop['with']['median_ms']:.3f} p99 {loop['with']['p99_ms']:.3f} max "
          f"{loop['with']['max_ms']:.2f}")
    for label, key in ((sampler, "overhead"), ("control", "control_overhead")):
        o = loop[key]
        print(f"{name:8}{label:12} step-time overhead against the off block of each of "
              f"{o['pairs']} cycles: median {o['median_pct']:+.2f} % (quartiles "
              f"{o['p25_pct']:+.2f} to {o['p75_pct']:+.2f}), mean {o['mean_pct']:+.2f} "
              f"± {o['stderr_pct']:.2f} %, pooled {o['pooled_pct']:+.2f} %")
    print(f"{name:8}{'steal':12} the hypervisor's share of the machine's CPU time: "
          + ", ".join(f"{kind} blocks {pct:.1f} %" for kind, pct in loop["steal_pct"].items()))
    if loop["reporter_gil_bound_pct"] is not None:
        print(f"{name:8}{'GIL bound':12} the reporter's user CPU outside torch's GIL-free dump: "
              f"{loop['reporter_gil_bound_pct']:.3f} % of the on blocks' time (target "
              "< 0.2 %: the most the GIL can have taken from the loop); control call "
              f"{loop['control_seconds'] * 1e3:.1f} ms")
    if "py-spy" in loop["ticks"]:
        dumps = loop["ticks"]["py-spy"]
        print(f"{name:8}{'py-spy':12} {dumps['count']} dumps in {loop['on_seconds']:.0f} s "
              f"of on blocks; py-spy's CPU per dump (the daemon's): median "
              f"{dumps['children_cpu_median_ms']:.1f} ms, max "
              f"{dumps['children_cpu_max_ms']:.1f} ms; control call "
              f"{loop['control_seconds'] * 1e3:.1f} ms; {loop['failed_dumps']} failed; "
              f"stalls beyond their floors "
              f"{loop['stall_share_pct']['py-spy']:+.3f} % of the on blocks' time")
    print(f"{name:8}{'load':12} load average (1, 5, 15 min) at the start "
          + ", ".join(f"{v:.2f}" for v in loop["loadavg"]["start"]) + "; at the end "
          + ", ".join(f"{v:.2f}" for v in loop["loadavg"]["end"]))

if __name__ == "__main__":
    main()
