"""Cost of the GPU collector on the 8-GPU replay fixture, and what it adds to scrapes.

    python bench/gpu_collector.py [--cycles 200] [--sampler-seconds 10] [--count 500]

1. Collector run time per cycle (fast cycles, and cycles that include the slow calls), with
   the replay answering instantly, and again with the H200's measured call latencies put on
   the slow calls (energy/field batch 4 ms, violation status 0.74 ms per policy).
2. CPU used by the instant power sampler at 20 Hz x 8 GPUs (target: under 2 % of one core),
   from the process's CPU time while only that thread runs.
3. Scrape latency of `llmmon serve` with the disk collector alone and with the GPU collector
   added: scrapes read pre-rendered bytes, so the GPU collector should not move them.

Prints a table and writes bench/results/gpu_collector.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import free_port, scrape_times, stop, wait_http

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmmon.collector import Context  # noqa: E402
from llmmon.collectors.gpu import GpuCollector  # noqa: E402
from llmmon.gpu.power import PowerSampler  # noqa: E402
from llmmon.sources.nvml import VIOLATION_POLICIES  # noqa: E402
from llmmon.sources.nvml_open import open_nvml  # noqa: E402
from llmmon.exposition import render  # noqa: E402
from tests.core.helpers import make_collector  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "nvml" / "h200x8"
PROC = ROOT / "tests" / "fixtures" / "gpu" / "proc"
H200_FIELD_BATCH_S = 0.0040  # fixtures/h200 call_latency fields_8 median
H200_VIOLATION_S = 0.00074  # fixtures/h200 call_latency violation_power median


def with_h200_latencies(workdir: Path) -> Path:
    """A copy of the fixture whose slow calls take as long as they did on the H200."""
    target = workdir / "h200x8-latency"
    shutil.copytree(FIXTURE, target)
    for path in sorted(target.glob("*.json")):
        doc = json.loads(path.read_text())
        doc["field_values"]["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["delay_s"] = \
            H200_FIELD_BATCH_S
        for policy in VIOLATION_POLICIES:
            doc["device0"]["violation_status"][policy]["delay_s"] = H200_VIOLATION_S
        path.write_text(json.dumps(doc))
    return target


def percentiles(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {"median_ms": round(statistics.median(values) * 1000, 3),
            "p99_ms": round(values[max(int(len(values) * 0.99) - 1, 0)] * 1000, 3)}


def _cycles(fixture: Path, slow_interval: float, cycles: int) -> tuple[list[float], list[float]]:
    """Wall times of collect() and of rendering what it returned, after the first run."""
    collector = make_collector(GpuCollector, PROC, settings={"nvml.replay": str(fixture)},
                               slow_interval=slow_interval)
    collector.collect(Context())  # discovery and static values, once per GPU
    collecting, rendering = [], []
    try:
        for _ in range(cycles):
            time.sleep(0.002)  # lets a 1 ms slow_interval expire: every cycle is a slow one
            started = time.perf_counter()
            families = list(collector.collect(Context()))
            collecting.append(time.perf_counter() - started)
            started = time.perf_counter()
            render(families)
            rendering.append(time.perf_counter() - started)
    finally:
        collector.close()
    return collecting, rendering


def collector_cost(fixture: Path, cycles: int) -> dict[str, dict[str, float]]:
    """Fast cycles (slow calls cached) and slow cycles (every call made), and rendering."""
    fast, rendering = _cycles(fixture, 3600.0, cycles)
    slow, _ = _cycles(fixture, 0.001, max(cycles // 4, 10))
    return {"fast_cycle": percentiles(fast), "slow_cycle": percentiles(slow),
            "render": percentiles(rendering)}


def sampler_cpu(seconds: float, rate: float) -> dict[str, float]:
    """The sampler thread alone in this process: CPU seconds per wall second."""
    source = open_nvml(str(FIXTURE))
    sampler = PowerSampler(source, rate)
    for gpu in range(source.device_count()):
        sampler.track(gpu, 700.0)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = usage.ru_utime + usage.ru_stime
    started = time.monotonic()
    sampler.start()
    time.sleep(seconds)
    sampler.close()
    wall = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - cpu_before
    samples = sampler.take(0).samples_total
    source.close()
    return {"gpus": source.device_count(), "rate_hz": rate, "seconds": round(wall, 2),
            "achieved_hz": round(samples / wall, 1),
            "cpu_percent_of_one_core": round(100 * cpu / wall, 3),
            "cpu_us_per_read": round(1e6 * cpu / (samples * source.device_count()), 1)}


def scrape_latency(with_gpu: bool, count: int) -> dict:
    port = free_port()
    command = [sys.executable, "-m", "llmmon", "serve", f"--web.listen-address=127.0.0.1:{port}",
               "--collector.disable-defaults", "--collector.disk",
               f"--path.procfs={ROOT / 'tests' / 'fixtures' / 'proc'}", "--log.level=warning"]
    if with_gpu:
        command += ["--collector.gpu", f"--fake-nvml={FIXTURE}", "--collector.gpu.interval=1s"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_http(port, "/metrics")
        time.sleep(2.5)  # a few collector cycles, the sampler thread running
        scrape_times(port, "/metrics", 50, {})
        timing = scrape_times(port, "/metrics", count, {})
    finally:
        stop(proc)
    return {"collectors": "disk+gpu" if with_gpu else "disk", **timing.__dict__}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--sampler-seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--count", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {
            "collector_replay_instant": collector_cost(FIXTURE, args.cycles),
            "collector_h200_latencies": collector_cost(with_h200_latencies(Path(tmp)),
                                                       max(args.cycles // 4, 40)),
        }
    results["power_sampler"] = sampler_cpu(args.sampler_seconds, args.rate)
    results["scrape"] = [scrape_latency(False, args.count), scrape_latency(True, args.count)]

    print("GPU collector, 8-GPU replay fixture (ms per cycle, median / p99)")
    for key in ("collector_replay_instant", "collector_h200_latencies"):
        row = results[key]
        print(f"  {key:<26} fast {row['fast_cycle']['median_ms']:7.2f} / "
              f"{row['fast_cycle']['p99_ms']:7.2f}   slow {row['slow_cycle']['median_ms']:7.2f} / "
              f"{row['slow_cycle']['p99_ms']:7.2f}   render {row['render']['median_ms']:6.2f}")
    power = results["power_sampler"]
    print(f"power sampler: {power['gpus']} GPUs x {power['rate_hz']:g} Hz for {power['seconds']}s:"
          f" {power['cpu_percent_of_one_core']:.2f} % of one core, {power['achieved_hz']} Hz "
          f"achieved, {power['cpu_us_per_read']} µs CPU per read")
    print(f"{args.count} scrapes: {'collectors':<10}{'median ms':>10}{'p99 ms':>8}{'bytes':>9}")
    for row in results["scrape"]:
        print(f"{'':<13}{row['collectors']:<10}{row['median_ms']:>10.2f}{row['p99_ms']:>8.2f}"
              f"{row['bytes']:>9}")
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "gpu_collector.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
