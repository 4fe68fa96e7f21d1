"""A wedged NVML call: the collector fails after its timeout and nothing else waits on it."""

from __future__ import annotations

import time
from pathlib import Path

from llmmon.collectors.disk import DiskCollector
from llmmon.collectors.gpu import SAMPLER_STUCK_S
from llmmon.sampler import Sampler
from tests.conftest import FIXTURES
from tests.core.helpers import make_collector, run
from tests.helpers import wait_for
from tests.gpu.conftest import edit

HANG = {"hang": True}


def test_hung_call_fails_the_gpu_collector_only(gpu_collector, h200x8: Path) -> None:
    edit(h200x8 / "gpu2.json", lambda doc: doc["device0"].update(temp_gpu_c=HANG))
    gpu = gpu_collector(h200x8, interval=0.1, timeout=0.3)
    disk = make_collector(DiskCollector, FIXTURES / "proc", interval=0.05)
    sampler = Sampler([gpu, disk], "test")
    sampler.start()
    try:
        states = lambda: {s["name"]: s for s in sampler.snapshot_json()}  # noqa: E731
        wait_for(lambda: states()["gpu"]["status"] == "failed", 10)
        assert "timed out after 0.3s" in states()["gpu"]["last_error"]
        first_disk_run = states()["disk"]["last_success"]
        wait_for(lambda: states()["disk"]["last_success"] > first_disk_run, 10)
        body = sampler.body(openmetrics=False, compressed=False).decode()
        assert 'llmmon_exporter_collector_success{collector="gpu"} 0.0' in body
        assert 'llmmon_exporter_collector_success{collector="disk"} 1.0' in body
    finally:
        sampler.stop()  # closes the replay source, which releases the hung call


def test_blocked_power_sampler_is_reported_and_runs_go_on(gpu_collector, tmp_path: Path,
                                                          h200x8: Path) -> None:
    edit(h200x8 / "gpu4.json", lambda doc: doc["field_values"].update(
        NVML_FI_DEV_POWER_INSTANT=HANG))
    collector = gpu_collector(h200x8)
    collector.start()
    run(collector)  # GPU 4 is now sampled, and its read never returns
    started = time.monotonic()
    errors: dict[str, str] = {}
    while "power_sampler" not in errors:
        assert time.monotonic() - started < SAMPLER_STUCK_S + 10, errors
        time.sleep(0.2)
        samples, ctx, _ = run(collector)
        errors = ctx.errors
    assert "does not return" in errors["power_sampler"]
    assert samples[("llmmon_gpu_up", (("gpu", "4"),
                                      ("uuid", "GPU-5f3c2a10-7d41-4e8b-9c62-0a1b2c3d4e54")))] == 1
