"""NVML as a source: one interface over the real library and over replayed snapshot files.

Calls are named as in `fixtures/h200/nvml_snapshot.json` (`power_usage_mw`, `memory_info_v2`,
`violation_status/<policy>`, ...), and results are plain JSON values (numbers, strings, lists,
dicts of a struct's fields).  The real backend (`nvml_real`) converts pynvml results to that
shape, the replay backend (`nvml_replay`) reads it from files, and `nvml_snapshot` writes it,
so one vocabulary serves the hardware, the tests and the simulator.

Errors keep NVML's return codes: a collector asks `NvmlError.absent` (not supported here: export
nothing) and `NvmlError.lost` (the GPU is gone: mark it down) instead of matching classes.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

# NVML return codes (nvml.h `nvmlReturn_t`; the same numbers as pynvml's NVML_ERROR_*).
SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
UNKNOWN = 999

# Not available on this GPU, driver or permission level: the series is absent, not an error.
# InvalidArgument is how drivers answer field ids newer than themselves (see the H200 capture).
ABSENT_CODES = frozenset({INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND,
                          FUNCTION_NOT_FOUND})
# The GPU stopped answering: llmmon_gpu_up goes to 0 and the other GPUs carry on.
LOST_CODES = frozenset({GPU_IS_LOST, RESET_REQUIRED, UNKNOWN})

# The vocabulary: the device calls of the H200 capture, which every backend answers.
DEVICE_CALLS = (
    "name", "uuid", "serial", "index", "minor", "pci", "arch", "cuda_cc", "brand", "vbios",
    "numa", "power_usage_mw", "power_limit_enforced_mw", "power_limit_mw",
    "power_limit_default_mw", "power_limit_constraints_mw", "total_energy_mj", "temp_gpu_c",
    "temp_threshold_shutdown", "temp_threshold_slowdown", "temp_threshold_gpu_max",
    "temp_threshold_mem_max", "clock_sm_mhz", "clock_mem_mhz", "clock_graphics_mhz",
    "clock_video_mhz", "max_clock_sm_mhz", "max_clock_mem_mhz", "app_clock_sm_mhz",
    "clocks_event_reasons", "supported_clocks_event_reasons", "utilization", "memory_info",
    "bar1", "pstate", "persistence", "compute_mode", "ecc_mode", "ecc_vol_corrected",
    "ecc_vol_uncorrected", "ecc_agg_corrected", "ecc_agg_uncorrected", "remapped_rows",
    "retired_pages_sbe", "pcie_tx_kbps", "pcie_rx_kbps", "pcie_replay", "pcie_gen",
    "pcie_width", "pcie_max_gen", "pcie_max_width", "fan", "mig_mode", "compute_procs",
    "supported_event_types", "gpm_support", "memory_info_v2", "fabric_info",
)
SYSTEM_CALLS = ("driver", "nvml", "cuda_driver", "count")
# `violation_status/<policy>`: time clocks were held down by each perf policy, in ns.
VIOLATION_POLICIES = (
    "NVML_PERF_POLICY_POWER", "NVML_PERF_POLICY_THERMAL", "NVML_PERF_POLICY_SYNC_BOOST",
    "NVML_PERF_POLICY_BOARD_LIMIT", "NVML_PERF_POLICY_LOW_UTILIZATION",
    "NVML_PERF_POLICY_RELIABILITY", "NVML_PERF_POLICY_TOTAL_APP_CLOCKS",
    "NVML_PERF_POLICY_TOTAL_BASE_CLOCKS",
)
XID_CRITICAL_EVENT = 0x8  # nvmlEventTypeXidCriticalError
NVLINK_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS in nvidia-ml-py 13.615


class NvmlError(Exception):
    """An NVML call's failure, with its return code."""

    def __init__(self, code: int, text: str = "") -> None:
        super().__init__(text or f"NVML error {code}")
        self.code = code

    @property
    def absent(self) -> bool:
        return self.code in ABSENT_CODES

    @property
    def lost(self) -> bool:
        return self.code in LOST_CODES


class NvmlUnavailable(Exception):
    """No NVML on this node (library or driver missing): nothing to watch, not a failure."""


@dataclass(frozen=True)
class Field:
    """One `nvmlDeviceGetFieldValues` result, as `c_nvmlFieldValue_t` and the capture hold it."""

    id: int
    ret: int
    type: int
    value: Any
    latency_us: int = 0

    def get(self) -> Any:
        """The value, or the field's NvmlError."""
        if self.ret != SUCCESS:
            raise NvmlError(self.ret, f"field {self.id}: NVML error {self.ret}")
        return self.value


@dataclass(frozen=True)
class XidEvent:
    gpu: int
    xid: int


class EventSet(abc.ABC):
    """XID events of the GPUs registered at creation."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> XidEvent | None:
        """The next event, or None after `timeout` seconds without one."""

    @abc.abstractmethod
    def close(self) -> None: ...


class NvmlSource(abc.ABC):
    """What collectors read NVML through.  Every method may raise NvmlError."""

    description: str = ""

    @abc.abstractmethod
    def device_count(self) -> int:
        """Number of GPUs; raises NvmlUnavailable when there is no NVML here."""

    @abc.abstractmethod
    def system(self, name: str) -> Any:
        """A system-wide call: `driver`, `nvml`, `cuda_driver`, `count`."""

    @abc.abstractmethod
    def call(self, gpu: int, name: str, *args: str) -> Any:
        """A device call by its snapshot name; `args` select e.g. a policy or an NVLink."""

    @abc.abstractmethod
    def field_values(self, gpu: int, names: Sequence[str]) -> dict[str, Field]:
        """One batched read of `NVML_FI_*` fields, each with its own return code."""

    @abc.abstractmethod
    def gpm(self, gpu: int, names: Sequence[str]) -> dict[str, Field]:
        """GPM metrics (`NVML_GPM_METRIC_*`, 0-100) over the time since the previous call.

        The first call on real hardware only takes a sample and returns {}."""

    @abc.abstractmethod
    def xid_event_set(self, gpus: Sequence[int]) -> EventSet:
        """Register `gpus` for XID critical-error events."""

    @abc.abstractmethod
    def field_names(self) -> list[str]:
        """Every `NVML_FI_*` name this source can answer, for snapshots."""

    @abc.abstractmethod
    def gpm_names(self) -> list[str]:
        """Every `NVML_GPM_METRIC_*` name this source can answer, for snapshots."""

    def problems(self) -> Mapping[str, str]:
        """Problems of the source itself (e.g. a replay file that failed to reload)."""
        return {}

    def close(self) -> None:
        """Release the library or files; blocked replay calls return."""


@dataclass(frozen=True)
class GpuIdentity:
    """What other collectors (topology) need to name a GPU and find it in sysfs."""

    index: int
    uuid: str
    pci_bus_id: str  # as NVML reports it: 00000000:18:00.0

    @property
    def sysfs_pci_address(self) -> str:
        """The PCI address as /sys/bus/pci/devices names it: 0000:18:00.0."""
        domain, bus, devfn = self.pci_bus_id.split(":")
        return f"{int(domain, 16):04x}:{bus}:{devfn}".lower()


def list_gpus(source: NvmlSource) -> list[GpuIdentity]:
    """Index, UUID and PCI bus id of every GPU that answers; lost GPUs are left out.

    Raises NvmlUnavailable when there is no NVML on this node."""
    gpus = []
    for index in range(source.device_count()):
        try:
            gpus.append(GpuIdentity(index, source.call(index, "uuid"),
                                    source.call(index, "pci")["busId"]))
        except NvmlError:
            continue
    return gpus
