"""The 20 Hz instant power sampler on the real H200 trace, and its thread."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from llmmon.gpu.power import PowerSampler
from llmmon.sources.nvml_open import open_nvml
from tests.core.helpers import run
from tests.gpu.conftest import CAPTURE, TRACE, edit

PHASES = ("idle", "matmul", "starved", "idle_after")


def replay_phase(tmp_path: Path, phase: str, **levels: float) -> tuple[PowerSampler, list]:
    """Feed one phase of the real trace through the sampler, at the trace's own timestamps."""
    samples = [s for s in json.loads(TRACE.read_text())["samples"] if s["phase"] == phase]
    path = tmp_path / f"{phase}.json"
    shutil.copy(CAPTURE, path)
    edit(path, lambda doc: doc["field_values"].update(NVML_FI_DEV_POWER_INSTANT={"sequence": [
        {"id": 186, "ret": 0, "type": 1, "value": s["power_instant"]} for s in samples]}))
    source = open_nvml(str(path))
    sampler = PowerSampler(source, 20.0, **levels)
    sampler.track(0, source.call(0, "power_limit_enforced_mw") / 1000)
    for sample in samples:
        sampler.tick(sample["t"])
    return sampler, samples


@pytest.mark.parametrize("phase, dips", [("idle", 0), ("matmul", 0), ("starved", 5),
                                         ("idle_after", 0)])
def test_dips_on_the_real_trace(tmp_path: Path, phase: str, dips: int) -> None:
    sampler, samples = replay_phase(tmp_path, phase)
    window = sampler.take(0)
    assert window is not None
    assert window.dips_total == dips
    assert window.samples_total == len(samples)
    assert window.min_watts == min(s["power_instant"] for s in samples) / 1000


def test_low_time_tells_starved_from_busy_and_idle(tmp_path: Path) -> None:
    low = {}
    for phase in PHASES:
        sampler, samples = replay_phase(tmp_path, phase)
        window = sampler.take(0)
        low[phase] = window.low_seconds_total / (samples[-1]["t"] - samples[0]["t"])
    assert low["matmul"] < 0.05  # only the ramp-up samples
    assert 0.4 < low["starved"] < 0.7  # 0.6 s idle of every 1 s
    assert low["idle"] > 0.9 and low["idle_after"] > 0.9


def test_levels_are_configurable_fractions_of_the_limit(tmp_path: Path) -> None:
    # A low level of 0.175 x 700 W = 122.5 W: only the deepest of the five dips (118.8 W).
    deep_only, _ = replay_phase(tmp_path, "starved", busy_fraction=0.5, low_fraction=0.175)
    assert deep_only.take(0).dips_total == 1
    with pytest.raises(ValueError, match="need 0 < low"):
        PowerSampler(open_nvml(str(CAPTURE)), 20.0, busy_fraction=0.3, low_fraction=0.5)


def test_the_window_resets_per_take_and_counters_do_not(tmp_path: Path) -> None:
    sampler, _ = replay_phase(tmp_path, "starved")
    first = sampler.take(0)
    second = sampler.take(0)
    assert second.mean_watts is None and second.min_watts is None
    assert second.dips_total == first.dips_total == 5
    assert second.last_watts == first.last_watts


def test_unknown_power_limit_means_no_dips_not_zero_dips() -> None:
    sampler = PowerSampler(open_nvml(str(CAPTURE)))
    sampler.track(0, None)
    sampler.tick(0.0)
    window = sampler.take(0)
    assert window.mean_watts == pytest.approx(84.937)
    assert window.dips_total is None and window.low_seconds_total is None


def test_the_thread_samples_without_the_collector_and_stops(gpu_collector) -> None:
    collector = gpu_collector(CAPTURE, power_sample_rate=50.0)
    collector.start()
    run(collector)  # discovery: from now on the thread samples GPU 0
    deadline = time.monotonic() + 10
    while collector.power.take(0) is None or collector.power.take(0).samples_total < 5:
        assert time.monotonic() < deadline, "the sampler thread took no samples"
        time.sleep(0.02)
    collector.close()
    assert not collector.power.running
    after = collector.power.take(0).samples_total
    time.sleep(0.1)
    assert collector.power.take(0).samples_total == after
