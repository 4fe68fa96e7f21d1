"""The real NVML backend over nvidia-ml-py, returning the snapshot vocabulary's plain values.

`nvmlInit` happens on first use, in the collector's worker thread, so a driver that hangs
while initialising blocks one collector run (which then times out) and never `serve` itself.
A missing library or driver raises NvmlUnavailable: a node without GPUs is not an error.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, NoReturn, Sequence

from llmmon.sources.nvml import (
    DRIVER_NOT_LOADED,
    LIBRARY_NOT_FOUND,
    LOST_CODES,
    TIMEOUT,
    EventSet,
    Field,
    NvmlError,
    NvmlSource,
    NvmlUnavailable,
    XidEvent,
    XID_CRITICAL_EVENT,
)

try:
    import pynvml
except ImportError:  # the exporter still serves every other collector
    pynvml = None

# Fields read per link; scope 0xFFFFFFFF asks for the sum over all links (as Datadog's agent).
ALL_LINKS_SCOPE = 0xFFFFFFFF
SUMMED_FIELDS = frozenset({"NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
                           "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
                           "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX",
                           "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX"})


def plain(value: Any) -> Any:
    """pynvml results (ctypes structs, friendly objects, bytes, tuples) as JSON values."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, ctypes.Structure):
        return {name: plain(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, (list, tuple, ctypes.Array)):
        return [plain(v) for v in value]
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {k: plain(v) for k, v in vars(value).items()}
    return value


def _device_calls(nv: Any) -> dict[str, Callable[..., Any]]:
    """Snapshot name -> call on a device handle; names and shapes as in the H200 capture."""
    def fabric_info(handle: Any) -> Any:
        """nvmlDeviceGetGpuFabricInfoV with the v2 struct: state, status and healthMask."""
        info = nv.c_nvmlGpuFabricInfo_v2_t()
        info.version = nv.nvmlGpuFabricInfo_v2
        nv.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        return info

    def threshold(kind: str) -> Callable[[Any], Any]:
        return lambda h: nv.nvmlDeviceGetTemperatureThreshold(
            h, getattr(nv, f"NVML_TEMPERATURE_THRESHOLD_{kind}"))

    def clock(kind: str, getter: Callable[[Any, int], Any]) -> Callable[[Any], Any]:
        return lambda h: getter(h, getattr(nv, f"NVML_CLOCK_{kind}"))

    def ecc(error: str, counter: str) -> Callable[[Any], Any]:
        return lambda h: nv.nvmlDeviceGetTotalEccErrors(
            h, getattr(nv, f"NVML_MEMORY_ERROR_TYPE_{error}"), getattr(nv, f"NVML_{counter}_ECC"))

    def nvlink(h: Any, link: str, what: str) -> Any:
        getter = {"state": nv.nvmlDeviceGetNvLinkState,
                  "version": nv.nvmlDeviceGetNvLinkVersion}[what]
        return getter(h, int(link))

    return {
        "name": nv.nvmlDeviceGetName,
        "uuid": nv.nvmlDeviceGetUUID,
        "serial": nv.nvmlDeviceGetSerial,
        "index": nv.nvmlDeviceGetIndex,
        "minor": nv.nvmlDeviceGetMinorNumber,
        "pci": nv.nvmlDeviceGetPciInfo,
        "arch": nv.nvmlDeviceGetArchitecture,
        "cuda_cc": nv.nvmlDeviceGetCudaComputeCapability,
        "brand": nv.nvmlDeviceGetBrand,
        "vbios": nv.nvmlDeviceGetVbiosVersion,
        "numa": nv.nvmlDeviceGetNumaNodeId,
        "power_usage_mw": nv.nvmlDeviceGetPowerUsage,
        "power_limit_enforced_mw": nv.nvmlDeviceGetEnforcedPowerLimit,
        "power_limit_mw": nv.nvmlDeviceGetPowerManagementLimit,
        "power_limit_default_mw": nv.nvmlDeviceGetPowerManagementDefaultLimit,
        "power_limit_constraints_mw": nv.nvmlDeviceGetPowerManagementLimitConstraints,
        "total_energy_mj": nv.nvmlDeviceGetTotalEnergyConsumption,
        "temp_gpu_c": lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "temp_threshold_shutdown": threshold("SHUTDOWN"),
        "temp_threshold_slowdown": threshold("SLOWDOWN"),
        "temp_threshold_gpu_max": threshold("GPU_MAX"),
        "temp_threshold_mem_max": threshold("MEM_MAX"),
        "clock_sm_mhz": clock("SM", nv.nvmlDeviceGetClockInfo),
        "clock_mem_mhz": clock("MEM", nv.nvmlDeviceGetClockInfo),
        "clock_graphics_mhz": clock("GRAPHICS", nv.nvmlDeviceGetClockInfo),
        "clock_video_mhz": clock("VIDEO", nv.nvmlDeviceGetClockInfo),
        "max_clock_sm_mhz": clock("SM", nv.nvmlDeviceGetMaxClockInfo),
        "max_clock_mem_mhz": clock("MEM", nv.nvmlDeviceGetMaxClockInfo),
        "app_clock_sm_mhz": clock("SM", nv.nvmlDeviceGetApplicationsClock),
        "clocks_event_reasons": nv.nvmlDeviceGetCurrentClocksEventReasons,
        "supported_clocks_event_reasons": nv.nvmlDeviceGetSupportedClocksEventReasons,
        "utilization": nv.nvmlDeviceGetUtilizationRates,
        "memory_info": nv.nvmlDeviceGetMemoryInfo,
        "memory_info_v2": lambda h: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2),
        "bar1": nv.nvmlDeviceGetBAR1MemoryInfo,
        "pstate": nv.nvmlDeviceGetPerformanceState,
        "persistence": nv.nvmlDeviceGetPersistenceMode,
        "compute_mode": nv.nvmlDeviceGetComputeMode,
        "ecc_mode": nv.nvmlDeviceGetEccMode,
        "ecc_vol_corrected": ecc("CORRECTED", "VOLATILE"),
        "ecc_vol_uncorrected": ecc("UNCORRECTED", "VOLATILE"),
        "ecc_agg_corrected": ecc("CORRECTED", "AGGREGATE"),
        "ecc_agg_uncorrected": ecc("UNCORRECTED", "AGGREGATE"),
        "remapped_rows": nv.nvmlDeviceGetRemappedRows,
        "retired_pages_sbe": lambda h: nv.nvmlDeviceGetRetiredPages(
            h, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        # Samples a 20 ms window per call: for snapshots only, never on a default path.
        "pcie_tx_kbps": lambda h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES),
        "pcie_rx_kbps": lambda h: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES),
        "pcie_replay": nv.nvmlDeviceGetPcieReplayCounter,
        "pcie_gen": nv.nvmlDeviceGetCurrPcieLinkGeneration,
        "pcie_width": nv.nvmlDeviceGetCurrPcieLinkWidth,
        "pcie_max_gen": nv.nvmlDeviceGetMaxPcieLinkGeneration,
        "pcie_max_width": nv.nvmlDeviceGetMaxPcieLinkWidth,
        "fan": nv.nvmlDeviceGetFanSpeed,
        "mig_mode": nv.nvmlDeviceGetMigMode,
        "compute_procs": nv.nvmlDeviceGetComputeRunningProcesses,
        "supported_event_types": nv.nvmlDeviceGetSupportedEventTypes,
        "gpm_support": nv.nvmlGpmQueryDeviceSupport,
        "violation_status": lambda h, policy: nv.nvmlDeviceGetViolationStatus(
            h, getattr(nv, policy)),
        "nvlink": nvlink,
        "fabric_info": fabric_info,
    }


def _raise(exc: Exception) -> NoReturn:
    raise NvmlError(getattr(exc, "value", -1), str(exc)) from None


class RealNvml(NvmlSource):
    description = "nvml"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = False
        self._handles: dict[int, Any] = {}
        self._gpm_samples: dict[int, Any] = {}
        self._calls: dict[str, Callable[..., Any]] = {}

    def _init(self) -> Any:
        with self._lock:
            if self._ready:
                return pynvml
            if pynvml is None:
                raise NvmlUnavailable("nvidia-ml-py is not installed")
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                if exc.value in (LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED):
                    raise NvmlUnavailable(str(exc)) from None
                _raise(exc)
            self._calls = _device_calls(pynvml)
            self._ready = True
            return pynvml

    def _handle(self, gpu: int) -> Any:
        handle = self._handles.get(gpu)
        if handle is None:
            handle = self._handles[gpu] = self._init().nvmlDeviceGetHandleByIndex(gpu)
        return handle

    def _run(self, gpu: int, fn: Callable[[Any], Any]) -> Any:
        try:
            return fn(self._handle(gpu))
        except pynvml.NVMLError as exc:
            if exc.value in LOST_CODES:  # the handle of a lost GPU may be stale after a reset
                self._handles.pop(gpu, None)
            _raise(exc)

    def device_count(self) -> int:
        nv = self._init()
        try:
            return nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            _raise(exc)

    def system(self, name: str) -> Any:
        nv = self._init()
        calls = {"driver": nv.nvmlSystemGetDriverVersion, "nvml": nv.nvmlSystemGetNVMLVersion,
                 "cuda_driver": nv.nvmlSystemGetCudaDriverVersion, "count": nv.nvmlDeviceGetCount}
        try:
            return plain(calls[name]())
        except nv.NVMLError as exc:
            _raise(exc)

    def call(self, gpu: int, name: str, *args: str) -> Any:
        self._init()
        fn = self._calls.get(name)
        if fn is None:
            raise KeyError(f"unknown NVML call {name!r}")
        return plain(self._run(gpu, lambda h: fn(h, *args)))

    def field_names(self) -> list[str]:
        nv = self._init()
        return sorted(n for n in dir(nv) if n.startswith("NVML_FI_") and n != "NVML_FI_MAX")

    def gpm_names(self) -> list[str]:
        nv = self._init()
        return sorted(n for n in dir(nv)
                      if n.startswith("NVML_GPM_METRIC_") and n != "NVML_GPM_METRIC_MAX")

    def field_values(self, gpu: int, names: Sequence[str]) -> dict[str, Field]:
        nv = self._init()
        ids = [(getattr(nv, name), ALL_LINKS_SCOPE) if name in SUMMED_FIELDS else getattr(nv, name)
               for name in names]
        values = self._run(gpu, lambda h: nv.nvmlDeviceGetFieldValues(h, ids))
        return {name: _field(v) for name, v in zip(names, values)}

    def gpm(self, gpu: int, names: Sequence[str]) -> dict[str, Field]:
        nv = self._init()

        def sample(handle: Any) -> Any:
            buffer = nv.nvmlGpmSampleAlloc()
            try:
                return nv.nvmlGpmSampleGet(handle, buffer)
            except nv.NVMLError:
                nv.nvmlGpmSampleFree(buffer)
                raise

        current = self._run(gpu, sample)
        previous = self._gpm_samples.pop(gpu, None)
        self._gpm_samples[gpu] = current
        if previous is None:
            return {}
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(names)
        request.sample1, request.sample2 = previous, current
        for slot, name in zip(request.metrics, names):
            slot.metricId = getattr(nv, name)
        try:
            nv.nvmlGpmMetricsGet(request)
        except nv.NVMLError as exc:
            _raise(exc)
        finally:
            nv.nvmlGpmSampleFree(previous)
        return {name: Field(m.metricId, m.nvmlReturn, nv.NVML_VALUE_TYPE_DOUBLE,
                            m.value if m.nvmlReturn == 0 else None)
                for name, m in zip(names, request.metrics)}

    def xid_event_set(self, gpus: Sequence[int]) -> EventSet:
        nv = self._init()
        try:
            handle_set = nv.nvmlEventSetCreate()
            by_address = {}
            for gpu in gpus:
                handle = self._handle(gpu)
                nv.nvmlDeviceRegisterEvents(handle, XID_CRITICAL_EVENT, handle_set)
                by_address[ctypes.cast(handle, ctypes.c_void_p).value] = gpu
        except nv.NVMLError as exc:
            _raise(exc)
        return _RealEventSet(nv, handle_set, by_address)

    def close(self) -> None:
        with self._lock:
            if self._ready:
                for sample in self._gpm_samples.values():
                    pynvml.nvmlGpmSampleFree(sample)
                self._gpm_samples.clear()
                pynvml.nvmlShutdown()
                self._ready = False
                self._handles.clear()


def _field(value: Any) -> Field:
    ret = value.nvmlReturn
    if ret != 0:
        return Field(value.fieldId, ret, value.valueType, None, value.latencyUsec)
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
              6: "usVal"}.get(value.valueType, "ullVal")
    return Field(value.fieldId, ret, value.valueType, getattr(value.value, member),
                 value.latencyUsec)


class _RealEventSet(EventSet):
    def __init__(self, nv: Any, handle_set: Any, by_address: dict[int | None, int]) -> None:
        self._nv = nv
        self._set = handle_set
        self._by_address = by_address

    def wait(self, timeout: float) -> XidEvent | None:
        try:
            data = self._nv.nvmlEventSetWait(self._set, max(int(timeout * 1000), 0))
        except self._nv.NVMLError as exc:
            if exc.value == TIMEOUT:
                return None
            _raise(exc)
        gpu = self._by_address.get(ctypes.cast(data.device, ctypes.c_void_p).value)
        if gpu is None or not data.eventType & XID_CRITICAL_EVENT:
            return None
        return XidEvent(gpu, int(data.eventData))

    def close(self) -> None:
        try:
            self._nv.nvmlEventSetFree(self._set)
        except self._nv.NVMLError:
            pass
