"""The GPU collector over replayed NVML: the real H200 capture and the 8-GPU fixture."""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import time
from pathlib import Path

import pytest

from llmmon.collectors.gpu import GpuCollector
from llmmon.gpu.clock_events import decompose
from llmmon.sampler import Sampler
from llmmon.sources.nvml_replay import RELOAD_CHECK_S
from tests.conftest import compare_golden
from tests.core.helpers import make_collector, run
from tests.gpu.conftest import CAPTURE, H200X8, PROC, TRACE, edit

UUID = "GPU-5f3c2a10-7d41-4e8b-9c62-0a1b2c3d4e5{}"
XID_TIME = 1_800_000_000.0


def gpu(name: str, index: int, **labels: str) -> tuple[str, tuple]:
    labels.update(gpu=str(index), uuid=UUID.format(index))
    return (name, tuple(sorted(labels.items())))


def captured(name: str, **labels: str) -> tuple[str, tuple]:
    labels.update(gpu="0", uuid="GPU-5f3c2a10-7d41-4e8b-9c62-0a1b2c3d4e5f")
    return (name, tuple(sorted(labels.items())))


@pytest.fixture
def eight(gpu_collector):
    """Two runs over the 8-GPU fixture with 40 instant power ticks and every XID between."""
    collector = gpu_collector(H200X8, power_limit_bounds=True,  # the golden has every family
                              power_instant_latest=True, sm_occupancy=True)
    collector.xid.clock = lambda: XID_TIME
    _, first, _ = run(collector)  # discovers the GPUs; the power sampler learns their limits
    assert first.error_count == 0, first.errors
    for tick in range(40):
        collector.power.tick(tick * 0.05)
    while collector.xid.poll(0):
        pass
    return run(collector)


def test_golden_exposition_of_eight_gpus(eight) -> None:
    _, ctx, text = eight
    assert ctx.error_count == 0, ctx.errors
    assert ctx.watched == 8
    compare_golden("gpu.prom", text)


def test_power_limit_bounds_the_latest_instant_sample_and_occupancy_are_off_by_default(
        gpu_collector) -> None:
    collector = gpu_collector(H200X8)
    run(collector)  # the power sampler learns the limits
    collector.power.tick(0.0)
    samples, ctx, _ = run(collector)
    assert ctx.error_count == 0, ctx.errors
    names = {name for name, _ in samples}
    assert {"llmmon_gpu_power_limit_watts", "llmmon_gpu_power_instant_min_ratio",
            "llmmon_gpu_power_instant_min_watts"} <= names
    assert "llmmon_gpu_power_limit_bound_watts" not in names
    assert "llmmon_gpu_power_instant_watts" not in names
    assert "llmmon_gpu_sm_active_ratio" in names and "llmmon_gpu_sm_occupancy_ratio" not in names


def test_promtool_lints_the_exposition_clean(eight) -> None:
    result = subprocess.run(["promtool", "check", "metrics"], input=eight[2].encode(),
                            capture_output=True, timeout=30)
    assert result.returncode == 0 and result.stdout + result.stderr == b"", result


def test_what_each_gpu_of_the_fixture_shows(eight) -> None:
    samples = eight[0]
    # GPU 1 replays the real trace's starved phase: 2 dips in its first 40 samples, while
    # the 1 s average reads a steady 384 W; its peers at the power cap dip never.
    assert samples[gpu("llmmon_gpu_power_dips_total", 1)] == 2
    assert samples[gpu("llmmon_gpu_power_low_seconds_total", 1)] == pytest.approx(22 * 0.05)
    assert samples[gpu("llmmon_gpu_power_watts", 1)] == pytest.approx(384.264)
    replayed = [s["power_instant"] / 1000 for s in json.loads(TRACE.read_text())["samples"]
                if s["phase"] == "starved"][:40]
    assert samples[gpu("llmmon_gpu_power_instant_min_watts", 1)] == min(replayed)
    assert samples[gpu("llmmon_gpu_power_instant_max_watts", 1)] == max(replayed)
    # the wall's timeline reads the lowest sample's share of the limit, computed here
    for index in range(8):
        assert samples[gpu("llmmon_gpu_power_instant_min_ratio", index)] == pytest.approx(
            samples[gpu("llmmon_gpu_power_instant_min_watts", index)]
            / samples[gpu("llmmon_gpu_power_limit_watts", index)])
    assert samples[gpu("llmmon_gpu_power_instant_min_ratio", 1)] < 0.25  # a blue row
    assert samples[gpu("llmmon_gpu_power_instant_mean_watts", 1)] == \
        pytest.approx(sum(replayed) / 40)
    assert samples[gpu("llmmon_gpu_power_instant_samples_total", 1)] == 40
    assert samples[gpu("llmmon_gpu_power_dips_total", 0)] == 0
    assert samples[gpu("llmmon_gpu_power_low_seconds_total", 0)] == 0
    # GPU 2: downtrained PCIe link.
    assert samples[gpu("llmmon_gpu_pcie_link_width", 2)] == 8
    assert samples[gpu("llmmon_gpu_pcie_link_max_width", 2)] == 16
    # GPU 4: thermal slowdown active, and counted in seconds from NVML's nanoseconds.
    assert samples[gpu("llmmon_gpu_clock_event_active", 4, reason="hw_thermal_slowdown")] == 1
    assert samples[gpu("llmmon_gpu_clock_event_active", 4, reason="sw_power_cap")] == 0
    assert samples[gpu("llmmon_gpu_throttle_seconds_total", 4, reason="thermal")] == 95.25
    # GPU 5: every XID event counted (dcgm's last-value gauge would show one 94).
    assert samples[gpu("llmmon_gpu_xid_errors_total", 5, xid="48")] == 2
    assert samples[gpu("llmmon_gpu_xid_errors_total", 5, xid="94")] == 1
    assert samples[gpu("llmmon_gpu_xid_last_timestamp_seconds", 5, xid="48")] == XID_TIME
    assert samples[gpu("llmmon_gpu_clock_event_active", 5, reason="bit_11")] == 1
    assert samples[gpu("llmmon_gpu_row_remap_pending", 5)] == 1
    assert samples[gpu("llmmon_gpu_ecc_errors_total", 5, severity="uncorrected",
                       scope="volatile")] == 1
    # GPU 6: two pods share it; a host process and an exited one have no pod.
    info = {dict(labels)["pid"]: (dict(labels)["pod_uid"], dict(labels)["container_id"][:12])
            for name, labels in samples if name == "llmmon_gpu_process_info"
            and dict(labels)["gpu"] == "6"}
    assert info == {"41006": ("7c6b5a49-3827-4165-9f4e-3d2c1b0a9f8e", "e455fd6baabc"),
                    "41007": ("3b2a1908-f7e6-4d5c-8b4a-39281706f5e4", "1ded15f9af3a"),
                    "41008": ("", ""), "41009": ("", "")}
    # GPU 7 is the capture: no NVLink there, so no NVLink series (absent, not zero).
    assert not [k for k in samples if k[0].startswith("llmmon_gpu_nvlink")
                and dict(k[1])["gpu"] == "7"]
    assert samples[gpu("llmmon_gpu_nvlink_active_links", 0)] == 18
    assert samples[gpu("llmmon_gpu_nvlink_bytes_total", 0, direction="tx")] == \
        912_000_000_000 * 1024
    assert samples[gpu("llmmon_gpu_peak_flops", 7, dtype="bf16")] == 989.5e12


def test_capture_unchanged_units_and_unsupported_calls(gpu_collector) -> None:
    collector = gpu_collector(CAPTURE)
    samples, ctx, _ = run(collector)
    assert ctx.error_count == 0 and ctx.watched == 1
    # Violation time is in nanoseconds, energy in millijoules, power in milliwatts.
    assert samples[captured("llmmon_gpu_throttle_seconds_total", reason="low_utilization")] == \
        pytest.approx(27.747412928)
    assert samples[captured("llmmon_gpu_energy_joules_total")] == pytest.approx(3248.414)
    assert samples[captured("llmmon_gpu_power_watts")] == pytest.approx(84.078)
    # Memory info v2: used excludes the 645 MB the driver reserves.
    assert samples[captured("llmmon_gpu_memory_bytes", state="used")] == 0
    assert samples[captured("llmmon_gpu_memory_bytes", state="reserved")] == 644939776
    # Idle: only gpu_idle among the 9 supported reasons.
    active = {dict(k[1])["reason"]: v for k, v in samples.items()
              if k[0] == "llmmon_gpu_clock_event_active"}
    assert len(active) == 9 and {r for r, v in active.items() if v} == {"gpu_idle"}
    # Not supported on this VM: absent (no series), not zero and not an error.
    names = {name for name, _ in samples}
    assert not {n for n in names if "nvlink" in n}
    assert "llmmon_gpu_sm_active_ratio" not in names  # GPM SM metrics are not in the capture
    assert "llmmon_gpu_tensor_active_ratio" in names
    unsupported = collector.api()["gpu"]()["gpus"][0]["unsupported"]
    assert "nvlink" in unsupported and "NVML_GPM_METRIC_SM_UTIL" in unsupported


def test_lost_gpu_is_down_and_the_others_stay(gpu_collector, h200x8: Path) -> None:
    lost = {"nvml_error": "GPU is lost", "code": 15}
    edit(h200x8 / "gpu3.json", lambda doc: doc["device0"]["power_usage_mw"].update(
        {"sequence": [{"ok": 680000}, lost]}))
    collector = gpu_collector(h200x8)
    before, ctx, _ = run(collector)
    assert before[gpu("llmmon_gpu_up", 3)] == 1 and ctx.error_count == 0
    after, ctx, _ = run(collector)
    assert after[gpu("llmmon_gpu_up", 3)] == 0
    assert "gpu3" in ctx.errors and ctx.watched == 8
    # Only up and info remain of GPU 3, no stale counters; the other seven are complete.
    assert {name for name, labels in after if dict(labels).get("gpu") == "3"} == \
        {"llmmon_gpu_up", "llmmon_gpu_info"}
    for index in (0, 1, 2, 4, 5, 6, 7):
        assert after[gpu("llmmon_gpu_up", index)] == 1
        assert gpu("llmmon_gpu_energy_joules_total", index) in after
    # Still lost on the next run: counted once, when it happened.
    _, ctx, _ = run(collector)
    assert ctx.error_count == 0


def test_gpu_lost_before_it_was_ever_identified(gpu_collector, h200x8: Path) -> None:
    edit(h200x8 / "gpu6.json",
         lambda doc: doc["device0"].update(uuid={"nvml_error": "Unknown Error", "code": 999}))
    samples, ctx, _ = run(gpu_collector(h200x8))
    assert samples[("llmmon_gpu_up", (("gpu", "6"), ("uuid", "")))] == 0
    assert samples[gpu("llmmon_gpu_up", 7)] == 1 and "gpu6" in ctx.errors


def test_failing_call_is_counted_and_the_rest_exported(gpu_collector, h200x8: Path) -> None:
    edit(h200x8 / "gpu2.json", lambda doc: doc["device0"].update(
        temp_gpu_c={"nvml_error": "Insufficient Size", "code": 7}))
    samples, ctx, _ = run(gpu_collector(h200x8))
    assert list(ctx.errors) == ["gpu2/temp_gpu_c"]
    assert gpu("llmmon_gpu_temperature_celsius", 2, sensor="gpu") not in samples
    assert samples[gpu("llmmon_gpu_temperature_celsius", 2, sensor="memory")] == 72
    assert samples[gpu("llmmon_gpu_up", 2)] == 1


def test_processes_can_be_turned_off(gpu_collector) -> None:
    samples, _, _ = run(gpu_collector(H200X8, processes=False))
    assert not [k for k in samples if k[0].startswith("llmmon_gpu_process")]


def test_clock_event_bits_are_decomposed_and_unknown_ones_kept() -> None:
    assert decompose(0x4, 0x1FF) == [
        ("gpu_idle", 0), ("applications_clocks_setting", 0), ("sw_power_cap", 1),
        ("hw_slowdown", 0), ("sync_boost", 0), ("sw_thermal_slowdown", 0),
        ("hw_thermal_slowdown", 0), ("hw_power_brake_slowdown", 0),
        ("display_clock_setting", 0)]
    # An active bit outside the supported mask is still reported.
    assert decompose(0x1001, 0x3) == [("gpu_idle", 1), ("applications_clocks_setting", 0),
                                      ("bit_12", 1)]
    assert [r for r, _ in decompose(0, None)][-1] == "display_clock_setting"


def test_no_nvml_is_nothing_to_watch() -> None:
    """The real backend: on machines without the NVIDIA driver (CI), an empty, healthy run."""
    collector = make_collector(GpuCollector, PROC)
    sampler = Sampler([collector], "test")
    sampler.run_once(collector)
    (state,) = sampler.snapshot_json()
    collector.close()
    if ctypes.util.find_library("nvidia-ml") is None:
        assert state["status"] == "empty", state
        assert state["message"] == "nothing to watch: GPUs (no NVML: NVML Shared Library Not Found)"
        assert state["errors_total"] == 0 and state["series"] == 0
    else:  # a GPU node: the same path finds real GPUs
        assert state["status"] == "ok" and state["watched"] > 0, state


def test_bad_replay_path_is_a_clear_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such replay file or directory"):
        make_collector(GpuCollector, PROC, settings={"nvml.replay": str(tmp_path / "missing.json")})
    with pytest.raises(ValueError, match="low .* < busy"):
        make_collector(GpuCollector, PROC, settings={"nvml.replay": str(CAPTURE)},
                       power_low_fraction=0.6)


def test_a_broken_rewrite_keeps_the_last_good_answers(gpu_collector, h200x8: Path) -> None:
    collector = gpu_collector(h200x8)
    run(collector)
    (h200x8 / "gpu4.json").write_text("{ truncated")
    time.sleep(RELOAD_CHECK_S * 1.5)  # the source looks for changed files this often
    samples, ctx, _ = run(collector)
    assert samples[gpu("llmmon_gpu_temperature_celsius", 4, sensor="gpu")] == 88
    assert [k for k in ctx.errors if k.startswith("source:")] == [f"source:{h200x8 / 'gpu4.json'}"]
