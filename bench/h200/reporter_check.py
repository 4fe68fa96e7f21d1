"""The reporter on a real GPU: a one-rank NCCL job with timing on, checked end to end.

    PYTHONPATH=. python3 bench/h200/reporter_check.py $OUT        # on the H200, ~1.5 min

A worker process trains a small bf16 model (4 x Linear(4096, 4096), 8192 tokens a step, every
gradient all-reduced through NCCL) with TORCH_NCCL_ENABLE_TIMING=1, alternating ~10 s phases
without and with the reporter (thread + step hook).  At the end it takes
torch.cuda.memory_stats(), makes the reporter write its files, and asks ProcessGroupNCCL for a
Flight Recorder dump through the dump pipe, as the daemon does.  This process then reads the
spool with the ranks collector and compares: allocator numbers with memory_stats(), durations
and bytes with the raw Flight Recorder entries, step counters with what was trained, the GPU
UUID with nvidia-smi.  Every wait is bounded; the worker is killed by PID on timeout.

$OUT receives (flat, 7 files): summary.json, state.json, entries.jsonl, fr_dump_rank_0,
metrics.prom, ranks.json, worker.log.  Exit status 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

JOB = "h200-check"
LAYERS, WIDTH, TOKENS = 4, 4096, 8192
PHASE_SECONDS = 10.0
WORKER_TIMEOUT = 150.0
NAN_STEP = 7  # in each reporter phase: the step hook must count these non-finite losses


# -- the training process ------------------------------------------------------------------
def worker(work: Path, port: int, dry_run: bool) -> None:
    import torch
    import torch.distributed as dist

    from llmmon.ranks import dumps as fr_dumps
    from llmmon_reporter import layout
    from llmmon_reporter.stepstats import StepStats
    from llmmon_reporter.worker import Cadence, Reporter

    device, backend = ("cpu", "gloo") if dry_run else ("cuda", "nccl")
    width, tokens, phase_seconds = (256, 256, 2.0) if dry_run else (WIDTH, TOKENS, PHASE_SECONDS)
    if not dry_run:
        torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=60))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(LAYERS)])
    model = model.to(device=device, dtype=torch.bfloat16)
    optimiser = torch.optim.SGD(model.parameters(), lr=1e-6)
    data = torch.randn(tokens, width, device=device, dtype=torch.bfloat16)
    flops = 6 * sum(p.numel() for p in model.parameters()) * tokens
    steps = StepStats()

    def sync() -> None:
        if not dry_run:
            torch.cuda.synchronize()

    def step(report: bool, number: int) -> None:
        loss = model(data).float().pow(2).mean()
        optimiser.zero_grad(set_to_none=False)
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
        optimiser.step()
        if report:
            reported = torch.full((), float("nan"), device=device) if number == NAN_STEP \
                else loss.detach()
            steps.step(tokens=tokens, loss=reported, model_flops=flops)

    for number in range(10):  # warm up: cuBLAS, the NCCL communicator, the allocator
        step(False, number)
    sync()
    started = time.perf_counter()
    for number in range(10):
        step(False, number)
    sync()
    count = max(int(10 / (time.perf_counter() - started) * phase_seconds), 20)
    spool = work / "spool"
    spool.mkdir()
    phases: list[dict[str, Any]] = []
    reporter: Reporter | None = None
    for phase in range(4):  # without, with, without, with: drift hits both alike
        on = phase % 2 == 1
        if on:
            reporter = Reporter(str(spool), Cadence(), steps)
            reporter.start()
        sync()
        started = time.perf_counter()
        for number in range(count):
            step(on, number)
        sync()
        elapsed = time.perf_counter() - started
        phases.append({"reporter": on, "steps": count, "seconds": elapsed,
                       "steps_per_second": count / elapsed})
        if on and phase < 3:
            assert reporter is not None
            reporter.stop()
    assert reporter is not None
    sync()
    stats = torch.cuda.memory_stats(0) if not dry_run else {}
    flushed = reporter.flush(30)  # nothing allocates between memory_stats() and this
    props = None if dry_run else torch.cuda.get_device_properties(0)
    result = {
        "torch": torch.__version__, "dry_run": dry_run,
        "nccl": "" if dry_run else str(torch.cuda.nccl.version()),
        "device": props.name if props else "cpu",
        "torch_uuid": str(getattr(props, "uuid", "")), "phases": phases, "flushed": flushed,
        "memory_stats": {key: stats.get(key) for key in layout.MEMORY_KEYS},
        "reported_steps": steps.steps, "tokens_per_step": tokens, "flops_per_step": flops,
        "nan_losses": sum(p["reporter"] for p in phases),  # one at NAN_STEP of each such phase
        "param_numels": [p.numel() for p in model.parameters()],
    }
    result["health"] = reporter.health()
    (work / "worker.json").write_text(json.dumps(result))  # in case the dump hangs
    # the daemon's request, through the dump pipe (ProcessGroupNCCL's; the reporter's on gloo)
    started = time.monotonic()
    result["dump_request"] = fr_dumps.request(str(work / "pipe"), JOB, [0])
    prefix = Path(layout.file_prefix(str(work / "fr"), JOB))
    while time.monotonic() - started < 20 and not any(
            p.stat().st_size for p in prefix.parent.glob(prefix.name + "0*")):
        time.sleep(0.2)
    time.sleep(1.0)  # let the writer finish
    result["dump_seconds"] = round(time.monotonic() - started, 2)
    result["dump_bytes"] = sum(p.stat().st_size for p in prefix.parent.glob(prefix.name + "0*"))
    result["health"] = reporter.health()
    reporter.stop()
    (work / "worker.json").write_text(json.dumps(result))
    dist.destroy_process_group()


# -- the checks ------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_worker(work: Path, out: Path, dry_run: bool) -> dict[str, Any]:
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1",
           "LLMMON_JOB": JOB, "TORCH_NCCL_ENABLE_TIMING": "1",
           "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
           "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(work / "fr" / JOB / "rank_"),
           "TORCH_FR_DUMP_TEMP_FILE": str(work / "fr" / JOB / "rank_"),
           "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(work / "pipe" / JOB / "rank_")}
    for directory in (work / "fr" / JOB, work / "pipe" / JOB):
        directory.mkdir(parents=True)
    with open(out / "worker.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, __file__, "--worker", str(work),
                                 "--port", str(free_port())] + ["--dry-run"] * dry_run,
                                env=env, stdout=log,
                                stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            proc.wait(timeout=WORKER_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    path = work / "worker.json"
    if not path.exists():
        raise RuntimeError(f"worker exited {proc.returncode} without results (see worker.log)")
    return {**json.loads(path.read_text()), "worker_exit": proc.returncode}


def prometheus_available() -> bool:
    """prometheus_client, from .device/wheels if the machine lacks it; False if neither."""
    def importable() -> bool:
        try:
            importlib.import_module("prometheus_client")
            return True
        except ImportError:
            return False

    wheels = ROOT / ".device" / "wheels"
    if importable() or not list(wheels.glob("prometheus_client-*.whl")):
        return importable()
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                        "--find-links", str(wheels), "prometheus-client"],
                       capture_output=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return False
    return importable()


def exported(spool: Path, work: Path, out: Path) -> tuple[dict[tuple[str, str], float], Any]:
    """(metric, label-string) -> value through the ranks collector, and its hang evidence.

    Without prometheus_client on the machine the same ledger is read directly (the numbers
    the collector would render)."""
    from llmmon.ranks.stall import evidence

    now = time.time()
    if prometheus_available():
        from prometheus_client.parser import text_string_to_metric_families

        from llmmon.collector import Context, Environment
        from llmmon.collectors.ranks import RanksCollector
        from llmmon.exposition import render
        from llmmon.sources.fs import RootedFS

        from llmmon.config import collector_options

        config = {o.key: o.parse(o.default) for o in collector_options(RanksCollector)}
        config.update(spool_dir=str(spool), fr_dir=str(work / "fr"), pipe_dir=str(work / "pipe"),
                      auto_dump=False)
        collector = RanksCollector(Environment(RootedFS("/sys"), RootedFS("/proc")), config)
        text = render(collector.collect_at(Context(), now))[0].decode()
        (out / "metrics.prom").write_text(text)
        values = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())
                                  if k not in ("job_id", "rank"))
                values[(sample.name, labels)] = sample.value
        return values, collector.evidence()
    from llmmon.ranks.ingest import SpoolIngest
    from llmmon.ranks.ledger import Ledger
    from llmmon.sources.spool import SpoolSource

    ledger = Ledger(8, 8)
    SpoolIngest(SpoolSource(str(spool), 64 << 20, 64, 64), ledger, 30, 600, 1 << 30).run(now)
    track = ledger.tracks[(JOB, 0)]
    values = {}
    for key, value in track.state.memory.items():
        values[(key, "")] = value
    for (pg, coll, dtype), value in track.collective_bytes.items():
        values[("llmmon_nccl_collective_bytes_total", f"coll={coll},dtype={dtype},pg={pg}")] = value
    for (pg, coll), hist in track.durations.items():
        values[("llmmon_nccl_collective_duration_seconds_count", f"coll={coll},pg={pg}")] = \
            sum(hist.counts)
        values[("llmmon_nccl_collective_duration_seconds_sum", f"coll={coll},pg={pg}")] = \
            hist.total
    (out / "metrics.prom").write_text("# prometheus_client missing: ledger values\n" +
                                      json.dumps({f"{k[0]}{{{k[1]}}}": v
                                                  for k, v in values.items()}, indent=1))
    return values, evidence(ledger, now, 30, 60)


MEMORY = {"llmmon_torch_memory_reserved_bytes": "reserved_bytes.all.current",
          "llmmon_torch_memory_allocated_bytes": "allocated_bytes.all.current",
          "llmmon_torch_memory_active_bytes": "active_bytes.all.current",
          "llmmon_torch_memory_inactive_split_bytes": "inactive_split_bytes.all.current",
          "llmmon_torch_alloc_retries_total": "num_alloc_retries",
          "llmmon_torch_ooms_total": "num_ooms"}


def ring(log: Path) -> dict[str, Any]:
    """The records an entries log carried (each in its last, final form) and its last status."""
    segments = [json.loads(line) for line in log.read_bytes().splitlines()[1:]]
    records = {e["record_id"]: e for segment in segments for e in segment["entries"]}
    return {"pg_status": segments[-1]["pg_status"],
            "entries": [records[r] for r in sorted(records)]}


def check(worker_result: dict[str, Any], spool: Path, work: Path, out: Path) -> dict[str, Any]:
    """Every check: True or False (None where it cannot apply, on a --dry-run without a GPU)."""
    gpu = not worker_result["dry_run"]
    checks: dict[str, Any] = {}
    state_path = next(p for p in spool.rglob("rank_0.*.json") if "entries" not in p.name)
    entries_path = next(spool.rglob("rank_0.*.entries.jsonl"))
    shutil.copy(state_path, out / "state.json")
    shutil.copy(entries_path, out / "entries.jsonl")
    state = json.loads(state_path.read_text())
    values, evidence = exported(spool, work, out)
    (out / "ranks.json").write_text(json.dumps(evidence, indent=1))

    # allocator numbers: exported == memory_stats() taken in the job
    stats = worker_result["memory_stats"]
    memory = {}
    for metric, key in MEMORY.items():
        got = values.get((metric, ""), values.get((key, "")))
        memory[metric] = {"exported": got, "memory_stats": stats[key], "equal": got == stats[key]}
    checks["allocator"] = memory
    checks["allocator_equal"] = all(m["equal"] for m in memory.values()) if gpu else None

    # durations and bytes: the collector's counters == the raw Flight Recorder entries it read
    dump = ring(entries_path)
    completed = int(dump["pg_status"]["0"]["last_completed_collective"])
    timed = [e for e in dump["entries"] if e.get("duration_ms") is not None]
    done = timed if gpu else [e for e in dump["entries"]
                              if e["retired"] and e["collective_seq_id"] <= completed]
    raw_bytes = sum(math.prod(shape) * 2 for e in done for shape in e["input_sizes"]
                    if e["input_dtypes"] == ["BFloat16"])
    count = values.get(("llmmon_nccl_collective_duration_seconds_count", "coll=all_reduce,pg=0"))
    total = values.get(("llmmon_nccl_collective_duration_seconds_sum", "coll=all_reduce,pg=0"))
    by_size: dict[int, list[float]] = {}
    for entry in timed:
        by_size.setdefault(entry["input_sizes"][0][0], []).append(entry["duration_ms"])
    raw_sum = sum(e["duration_ms"] for e in timed) / 1000
    checks["durations"] = {
        "entries_in_ring": len(dump["entries"]), "timed_entries": len(timed),
        "exported_count": count, "exported_sum_s": total, "raw_sum_s": raw_sum,
        "median_ms_by_numel": {str(k): statistics.median(v) for k, v in by_size.items()},
        "pg_status": dump.get("pg_status")}
    checks["durations_equal"] = (bool(timed) and count == len(timed) and total is not None
                                 and abs(total - raw_sum) < 1e-9) if gpu else None
    exported_bytes = values.get(("llmmon_nccl_collective_bytes_total",
                                 "coll=all_reduce,dtype=BFloat16,pg=0"))
    checks["bytes"] = {"exported": exported_bytes, "raw_bf16_finished": raw_bytes,
                       "finished_entries": len(done),
                       "per_step": 2 * sum(worker_result["param_numels"])}
    checks["bytes_equal"] = bool(done) and exported_bytes == raw_bytes
    sizes = {math.prod(e["input_sizes"][0]) for e in done}
    checks["sizes_match_model"] = sizes == set(worker_result["param_numels"])

    # step hook and identity
    step = state["step"] or {}
    reported = worker_result["reported_steps"]
    checks["steps"] = {"reported": reported, "file": step.get("steps"),
                       "loss_nonfinite": step.get("loss_nonfinite"), "tokens": step.get("tokens")}
    checks["steps_equal"] = (step.get("steps"), step.get("loss_nonfinite"), step.get("tokens")) \
        == (reported, worker_result["nan_losses"], reported * worker_result["tokens_per_step"])
    uuid = state["identity"]["uuid"]
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        smi = []
    expected = smi or [f"GPU-{worker_result['torch_uuid']}"]
    checks["identity"] = {"uuid": uuid, "nvidia_smi": smi, "torch": worker_result["torch_uuid"],
                          "gpu_name": state["identity"]["gpu_name"],
                          "fr_api": state["reporter"]["fr_api"]}
    checks["uuid_matches"] = uuid in expected if gpu else None
    checks["nccl_api"] = state["reporter"]["fr_api"] == "_dump_nccl_trace_json" if gpu else None

    # overhead, and the reporter's own health
    off = [p["steps_per_second"] for p in worker_result["phases"] if not p["reporter"]]
    on = [p["steps_per_second"] for p in worker_result["phases"] if p["reporter"]]
    checks["overhead"] = {
        "steps_per_second_without": off, "steps_per_second_with": on,
        "percent": round((statistics.mean(off) - statistics.mean(on)) /
                         statistics.mean(off) * 100, 3),
        "step_ms_without": 1000 / statistics.mean(off), "step_ms_with": 1000 / statistics.mean(on)}
    health = worker_result["health"]
    checks["reporter_healthy"] = health["errors_total"] == 0 and worker_result["flushed"]

    # the dump through the dump pipe, kept by the daemon's keeper
    from llmmon.ranks.dumps import DumpKeeper

    kept = DumpKeeper(str(work / "fr"), keep=2, settle=0.5).harvest(time.time() + 1)
    dumps = sorted((work / "fr").rglob("rank_0*"))
    if dumps:
        shutil.copy(dumps[0], out / "fr_dump_rank_0")
    checks["fr_dump"] = {"request": worker_result.get("dump_request"),
                         "seconds": worker_result.get("dump_seconds"),
                         "bytes": worker_result.get("dump_bytes"), "kept_sets": kept,
                         "reporter_dumps": health.get("dumps_written")}
    checks["fr_dump_written"] = bool(worker_result.get("dump_bytes")) and kept == 1
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--dry-run", action="store_true",
                        help="No GPU: the same pipeline on a CPU gloo job (for trying it here).")
    parser.add_argument("--worker", metavar="WORKDIR", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(Path(args.worker), args.port, args.dry_run)
        return 0
    out = Path(args.out or os.environ.get("OUT", "reporter_check_out"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    summary: dict[str, Any] = {"ok": False}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            result = run_worker(work, out, args.dry_run)
            summary.update(worker={k: result[k] for k in ("torch", "nccl", "device", "dry_run",
                                                           "phases", "health", "worker_exit")})
            summary["checks"] = check(result, work / "spool", work, out)
            verdicts = {k: v for k, v in summary["checks"].items() if isinstance(v, bool)}
            summary["failed"] = [k for k, v in verdicts.items() if not v]
            summary["ok"] = not summary["failed"]
        except Exception as exc:  # report, never hang or die silently
            summary["error"] = f"{type(exc).__name__}: {exc}"
    summary["seconds"] = round(time.monotonic() - started, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    checks = summary.get("checks", {})
    print(json.dumps({"ok": summary["ok"], "failed": summary.get("failed"),
                      "error": summary.get("error"), "seconds": summary["seconds"],
                      "overhead": checks.get("overhead"),
                      "allocator_equal": checks.get("allocator_equal"),
                      "durations": {k: checks.get("durations", {}).get(k) for k in
                                    ("timed_entries", "exported_count", "median_ms_by_numel")},
                      "bytes": checks.get("bytes"), "fr_dump": checks.get("fr_dump"),
                      "identity": checks.get("identity")}, indent=1, default=str))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
