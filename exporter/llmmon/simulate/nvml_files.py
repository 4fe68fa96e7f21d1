"""NVML replay files of a simulated GPU, in the format `--fake-nvml` reads.

Each GPU starts as the real H200 capture (`data/h200_nvml.json`: every call as the hardware
answered it, unsupported field ids left out, which answers Not Supported just the same) with
its own identity.  Every tick rewrites the changing answers.  Instant power is a 20 Hz
`sequence` cut from the real trace (`data/h200_power.json`: a busy bf16 matmul, the starved
0.4 s / 0.6 s pattern, idle with a context) long enough to last until the next rewrite; the
1 s average power is the mean of that second, as the driver's running average is.
"""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmmon.simulate.conditions import (
    GPU_IDLE,
    HW_THERMAL,
    SW_POWER_CAP,
    SW_THERMAL,
    Counters,
    GpuCondition,
)
from llmmon.simulate.hardware import Gpu

DATA = Path(__file__).resolve().parent / "data"
CAPTURE: dict[str, Any] = json.loads((DATA / "h200_nvml.json").read_text(encoding="utf-8"))
TRACE: dict[str, Any] = json.loads((DATA / "h200_power.json").read_text(encoding="utf-8"))
PERIOD = TRACE["period_s"]
NO_CONTEXT_MW = 81_000  # the capture's idle power before any process opened the GPU
GPU_IS_LOST = 15
NVLINKS = 18  # NVLink 4 links of an H200 SXM
PCIE_MAX = (5, 16)  # the capture's Gen5 x16 (pcie_max_gen, pcie_max_width)
# The H200 capture's driver answers these Not Supported; the simulator models a driver that
# counts them, so the peer comparison of alerts/source/health.yaml has inputs.
NVLINK_ERROR_FIELDS = {"NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "nvlink_crc",
                       "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "nvlink_replay"}
THERMAL_POLICY = "NVML_PERF_POLICY_THERMAL"
POWER_POLICY = "NVML_PERF_POLICY_POWER"
IDLE_POLICY = "NVML_PERF_POLICY_LOW_UTILIZATION"
# load -> utilisation gpu %, memory %; GPM SM, tensor, occupancy, DRAM %
ACTIVITY = {"busy": (100, 45, 92.0, 58.0, 44.0, 38.0),
            "starved": (61, 18, 37.0, 24.0, 18.0, 15.0)}
# load -> SM MHz, clock-event reasons
CLOCKS = {"busy": (1455, SW_POWER_CAP), "starved": (1590, SW_POWER_CAP), "idle": (1980, GPU_IDLE),
          "off": (345, GPU_IDLE)}


def _ok(value: Any) -> dict[str, Any]:
    return {"ok": value}


@dataclass
class Process:
    pid: int
    reserved: float  # PyTorch's cache; the process holds this plus its context


@dataclass
class GpuFiles:
    """One GPU's replay document and the state that carries between ticks."""

    gpu: Gpu
    counters: Counters
    temperature: float | None = None  # follows power; starts at its steady state
    xids: list[dict[str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        doc = copy.deepcopy(CAPTURE)
        device = doc["device0"]
        device.update(index=_ok(self.gpu.index), minor=_ok(self.gpu.index),
                      uuid=_ok(self.gpu.uuid), serial=_ok(self.gpu.serial),
                      numa=_ok(self.gpu.switch.numa))
        device["pci"]["ok"].update(busIdLegacy=f"0000:{self.gpu.bus:02X}:00.0",
                                   bus=self.gpu.bus, busId=self.gpu.nvml_bus_id)
        for link, entry in device["nvlink"].items():
            if int(link) < NVLINKS:
                entry.update(state=_ok(1), version=_ok(6))
        doc["system"]["count"] = _ok(1)
        self._base = doc
        self._offset = self.gpu.index * 7  # GPUs do not dip in lockstep to the sample
        self._memory_total = device["memory_info_v2"]["ok"]["total"]
        self._driver_reserved = device["memory_info_v2"]["ok"]["reserved"]

    def _instants(self, cond: GpuCondition, count: int, now: float) -> list[int]:
        if cond.load == "off":
            return [NO_CONTEXT_MW] * count
        template = TRACE["power_instant_mw"]["idle" if cond.load == "idle" else cond.load]
        start = (int(now / PERIOD) + self._offset) % len(template)
        cycle = itertools.islice(itertools.cycle(template), start, start + count)
        return [int(mw * cond.power_scale) for mw in cycle]

    def render(self, cond: GpuCondition, process: Process | None, now: float, seconds: float,
               window: float) -> bytes:
        """The replay document for the `window` seconds from `now`, `seconds` after the last."""
        for xid in cond.xids:
            self.xids.append({"xid": xid})
        if cond.load == "lost":
            return self._lost()
        instants = self._instants(cond, max(int(window / PERIOD), 1), now)
        second = instants[: int(1 / PERIOD)]
        average_mw = sum(second) / len(second)
        key = f"gpu{self.gpu.index}/"
        self.counters.advance(key + "energy_mj", average_mw, seconds)
        sm_mhz, reasons = CLOCKS.get(cond.load, CLOCKS["busy"])
        reasons |= cond.clock_reasons
        if cond.sm_clock_mhz is not None:
            sm_mhz = cond.sm_clock_mhz

        target = 30 + 0.045 * average_mw / 1000 + cond.temperature_offset
        previous = target if self.temperature is None else self.temperature
        temperature = previous + (target - previous) * min(1.0, seconds / 20)
        self.temperature = temperature
        policies = {POWER_POLICY: bool(reasons & SW_POWER_CAP),
                    THERMAL_POLICY: bool(reasons & (SW_THERMAL | HW_THERMAL)),
                    IDLE_POLICY: bool(reasons & GPU_IDLE)}
        for policy, active in policies.items():
            self.counters.advance(key + policy, 1e9 if active else 0.0, seconds)
        busy = cond.load in ACTIVITY
        self.counters.advance(key + "pcie_tx", 3e8 if busy else 1e5, seconds)
        self.counters.advance(key + "pcie_rx", 1.5e9 if busy else 1e5, seconds)
        self.counters.advance(key + "nvlink", 6e9 / 1024 if busy else 0.0, seconds)
        self.counters.advance(key + "nvlink_crc", cond.nvlink_errors, seconds)
        self.counters.advance(key + "nvlink_replay", cond.nvlink_errors / 5, seconds)
        return self._document(cond, process, instants, average_mw, sm_mhz, reasons,
                              temperature)

    def _document(self, cond: GpuCondition, process: Process | None, instants: list[int],
                  average_mw: float, sm_mhz: int, reasons: int, temperature: float) -> bytes:
        key = f"gpu{self.gpu.index}/"
        base = self._base
        device = dict(base["device0"])
        util_gpu, util_mem, sm, tensor, occupancy, dram = ACTIVITY.get(cond.load, (0,) * 6)
        used = int(process.reserved + 1.5 * (1 << 30)) if process else 0
        free = self._memory_total - self._driver_reserved - used
        energy = self.counters[key + "energy_mj"] + 8_600_000_000
        device.update(
            power_usage_mw=_ok(int(average_mw)), total_energy_mj=_ok(energy),
            temp_gpu_c=_ok(round(temperature)), clock_sm_mhz=_ok(sm_mhz),
            clock_graphics_mhz=_ok(sm_mhz), clocks_event_reasons=_ok(reasons),
            utilization=_ok({"gpu": util_gpu, "memory": util_mem}),
            pstate=_ok(0 if process else 8),
            memory_info_v2=_ok({**base["device0"]["memory_info_v2"]["ok"], "used": used,
                                "free": free}),
            memory_info=_ok({"total": self._memory_total, "free": free,
                             "used": used + self._driver_reserved}),
            pcie_gen=_ok(cond.pcie_link[0] if cond.pcie_link else PCIE_MAX[0]),
            pcie_width=_ok(cond.pcie_link[1] if cond.pcie_link else PCIE_MAX[1]),
            compute_procs=_ok([{"pid": process.pid, "usedGpuMemory": used,
                                "gpuInstanceId": 4294967295, "computeInstanceId": 4294967295}]
                              if process else []))
        violations = {policy: dict(entry) for policy, entry in device["violation_status"].items()}
        for policy in (POWER_POLICY, THERMAL_POLICY, IDLE_POLICY):
            violations[policy] = _ok({**violations[policy]["ok"],
                                      "violationTime": self.counters[key + policy]})
        device["violation_status"] = violations
        fields = dict(base["field_values"])
        for name, value in (("NVML_FI_DEV_MEMORY_TEMP", round(temperature + 8)),
                            ("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", energy),
                            ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", self.counters[key + "pcie_tx"]),
                            ("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", self.counters[key + "pcie_rx"]),
                            ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", self.counters[key + "nvlink"]),
                            ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", self.counters[key + "nvlink"])):
            if name in fields:
                fields[name] = {**fields[name], "value": value}
        for name, value in (("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", cond.uncorrectable),
                            ("NVML_FI_DEV_ECC_DBE_AGG_TOTAL", cond.uncorrectable),
                            ("NVML_FI_DEV_REMAPPED_UNC", cond.uncorrectable),
                            ("NVML_FI_DEV_REMAPPED_PENDING", int(cond.uncorrectable > 0))):
            fields[name] = {**fields[name], "value": value}
        for name, counter in NVLINK_ERROR_FIELDS.items():
            fields[name] = {"id": 0, "ret": 0, "type": 1, "value": self.counters[key + counter]}
        instant = fields["NVML_FI_DEV_POWER_INSTANT"]
        fields["NVML_FI_DEV_POWER_INSTANT"] = {
            "sequence": [{**instant, "value": mw} for mw in instants]}
        gpm = dict(base["gpm"])
        for name, value in (("NVML_GPM_METRIC_SM_UTIL", sm),
                            ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", tensor),
                            ("NVML_GPM_METRIC_SM_OCCUPANCY", occupancy),
                            ("NVML_GPM_METRIC_DRAM_BW_UTIL", dram)):
            gpm[name] = {"ret": 0, "value": value}
        doc = {"system": base["system"], "device0": device, "field_values": fields, "gpm": gpm,
               "xid_events": self.xids}
        return json.dumps(doc, separators=(",", ":")).encode()

    def _lost(self) -> bytes:
        """Every device call and field answers GpuIsLost; the XID log stays readable."""
        lost = {"nvml_error": "GPU is lost", "code": GPU_IS_LOST}

        def answer(node: Any) -> Any:
            if isinstance(node, dict) and not ({"ok", "code"} & node.keys()):
                return {key: answer(value) for key, value in node.items()}
            return lost
        base = self._base
        doc = {"system": base["system"], "device0": answer(base["device0"]),
               "field_values": {name: {**entry, "ret": GPU_IS_LOST}
                                for name, entry in base["field_values"].items()},
               "gpm": {"supported": 1, **{name: {"ret": GPU_IS_LOST} for name in base["gpm"]
                                          if name != "supported"}},
               "xid_events": self.xids}
        return json.dumps(doc, separators=(",", ":")).encode()
