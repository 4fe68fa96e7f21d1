"""GPUs over NVML: power (1 s average and 20 Hz instant with dips), throttling, memory, errors,
tensor activity, processes and their pods.

Reads go through an `NvmlSource` (the real library, or `--fake-nvml` replay files).  Each run
reads the cheap gauges (~2 µs a call); calls that block for milliseconds (energy, the field
batch, violation status) run every `slow_interval` and their last values are re-exported in
between; the 20 ms PCIe throughput call is never made.  A GPU that answers GpuIsLost, Unknown
or ResetRequired gets `llmmon_gpu_up 0` and the others carry on; a call the GPU does not
support leaves its series out.  No NVML on the node means nothing to watch, not a failure.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from prometheus_client.core import Metric

from llmmon.collector import Collector, Context, Environment
from llmmon.gpu.cgroup import owners_of
from llmmon.gpu.clock_events import decompose
from llmmon.gpu.peak_flops import peak_flops
from llmmon.gpu.power import PowerSampler
from llmmon.gpu.xid import XidWatcher
from llmmon.gpu.xid_catalog import action
from llmmon.gpu.xid_history import XidHistory, history, pci_key
from llmmon.metrics import Families, MetricSpec
from llmmon.options import Option
from llmmon.sources.nvml import (
    NVLINK_MAX_LINKS,
    VIOLATION_POLICIES,
    Field,
    NvmlError,
    NvmlSource,
    NvmlUnavailable,
)
from llmmon.sources.kmsg import KmsgError, read_kmsg
from llmmon.sources.nvml_open import open_nvml

LABELS = ("gpu", "uuid")
MHZ = 1e6


FABRIC_NOT_SUPPORTED = 0  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: no NVSwitch fabric
FABRIC_COMPLETED = 3
DEGRADED_BW_SHIFT, DEGRADED_BW_WIDTH, DEGRADED_BW_TRUE, DEGRADED_BW_FALSE = 0, 0x3, 1, 2


def _spec(name: str, kind: str, help_text: str, *extra: str) -> MetricSpec:
    return MetricSpec(name, kind, help_text, LABELS + extra)


INFO = _spec("llmmon_gpu_info", "info", "GPU identity; value 1.", "model", "pci_bus_id",
             "driver_version", "cuda_driver_version", "vbios_version", "serial",
             "compute_capability")
UP = _spec("llmmon_gpu_up", "gauge",
           "1 if the GPU answered NVML this cycle, 0 if it is lost (GpuIsLost, Unknown, "
           "ResetRequired).")
POWER = _spec("llmmon_gpu_power_watts", "gauge",
              "Power draw as NVML reports it: a 1 s running average on Ampere and newer.")
POWER_INSTANT = _spec("llmmon_gpu_power_instant_watts", "gauge",
                      "Latest instant power sample (NVML_FI_DEV_POWER_INSTANT).")
POWER_MIN = _spec("llmmon_gpu_power_instant_min_watts", "gauge",
                  "Lowest instant power sample since the previous collector run.")
POWER_MIN_RATIO = _spec("llmmon_gpu_power_instant_min_ratio", "gauge",
                        "Lowest instant power sample since the previous collector run, as a "
                        "share of the enforced power limit (the wall's power timeline: one "
                        "series a GPU, no join to the limit at query time).")
POWER_MEAN = _spec("llmmon_gpu_power_instant_mean_watts", "gauge",
                   "Mean of the instant power samples since the previous collector run.")
POWER_MAX = _spec("llmmon_gpu_power_instant_max_watts", "gauge",
                  "Highest instant power sample since the previous collector run.")
POWER_SAMPLES = _spec("llmmon_gpu_power_instant_samples_total", "counter",
                      "Instant power samples taken; its rate is the achieved sampling rate.")
POWER_DIPS = _spec("llmmon_gpu_power_dips_total", "counter",
                   "Times instant power fell below the low level after reaching the busy level "
                   "(levels are fractions of the enforced power limit): input starvation.")
POWER_LOW = _spec("llmmon_gpu_power_low_seconds_total", "counter",
                  "Time instant power spent below the low level (idle GPUs accrue 1 s/s).")
POWER_LIMIT = _spec("llmmon_gpu_power_limit_watts", "gauge", "Enforced power limit.")
POWER_LIMIT_BOUND = _spec("llmmon_gpu_power_limit_bound_watts", "gauge",
                          "Power limit the driver allows at least (min), at most (max), and "
                          "sets by default (default).", "bound")
ENERGY = _spec("llmmon_gpu_energy_joules_total", "counter",
               "Energy consumed since the driver was loaded.")
TEMPERATURE = _spec("llmmon_gpu_temperature_celsius", "gauge",
                    "Temperature of the GPU die (sensor=gpu) or its memory (sensor=memory).",
                    "sensor")
TEMPERATURE_THRESHOLD = _spec(
    "llmmon_gpu_temperature_threshold_celsius", "gauge",
    "Temperatures at which the GPU slows down (slowdown), shuts down (shutdown), and the "
    "maximum operating temperatures of the die (gpu_max) and memory (mem_max).", "threshold")
CLOCK = _spec("llmmon_gpu_clock_hertz", "gauge", "Current clock.", "clock")
CLOCK_MAX = _spec("llmmon_gpu_clock_max_hertz", "gauge", "Maximum clock.", "clock")
CLOCK_EVENT = _spec("llmmon_gpu_clock_event_active", "gauge",
                    "1 while this reason holds the clocks down; one series per supported "
                    "reason, unknown bits as bit_N.", "reason")
THROTTLE = _spec("llmmon_gpu_throttle_seconds_total", "counter",
                 "Time clocks were held below the requested clocks, by NVML perf policy "
                 "(nvmlDeviceGetViolationStatus, nanoseconds converted to seconds): power, "
                 "thermal, sync_boost, board_limit, low_utilization, reliability, "
                 "total_app_clocks, total_base_clocks.", "reason")
UTILIZATION = _spec("llmmon_gpu_utilization_ratio", "gauge",
                    "Fraction of the last sample period a kernel was running (coarse: 1 even "
                    "when one SM is busy or ranks spin in a hung collective).")
MEMORY_CONTROLLER = _spec("llmmon_gpu_memory_controller_utilization_ratio", "gauge",
                          "Fraction of the last sample period memory was read or written.")
SM_ACTIVE = _spec("llmmon_gpu_sm_active_ratio", "gauge",
                  "Fraction of SMs busy since the previous run (GPM, Hopper and newer).")
SM_OCCUPANCY = _spec("llmmon_gpu_sm_occupancy_ratio", "gauge",
                     "Resident warps over the maximum since the previous run (GPM).")
TENSOR_ACTIVE = _spec("llmmon_gpu_tensor_active_ratio", "gauge",
                      "Fraction of time the SMs ran any tensor-core op since the previous run "
                      "(GPM).")
DRAM_ACTIVE = _spec("llmmon_gpu_dram_active_ratio", "gauge",
                    "DRAM bandwidth used over its maximum since the previous run (GPM).")
MEMORY = _spec("llmmon_gpu_memory_bytes", "gauge",
               "Frame buffer by state (NVML memory info v2): used excludes the driver's "
               "reserved memory; total = reserved + used + free.", "state")
ECC = _spec("llmmon_gpu_ecc_errors_total", "counter",
            "ECC errors since the last driver load (volatile) or over the GPU's life "
            "(aggregate).", "severity", "scope")
REMAPPED_ROWS = _spec("llmmon_gpu_remapped_rows", "gauge",
                      "Memory rows remapped after correctable or uncorrectable errors.", "cause")
REMAP_PENDING = _spec("llmmon_gpu_row_remap_pending", "gauge",
                      "1 if a row remap waits for the next GPU reset.")
REMAP_FAILURE = _spec("llmmon_gpu_row_remap_failure", "gauge",
                      "1 if a row remap failed: the GPU needs service.")
PCIE_REPLAYS = _spec("llmmon_gpu_pcie_replays_total", "counter", "PCIe replays.")
PCIE_BYTES = _spec("llmmon_gpu_pcie_bytes_total", "counter",
                   "PCIe bytes transferred (NVML field counters; 32-bit on some GPUs, so "
                   "wraps read as resets).", "direction")
PCIE_GENERATION = _spec("llmmon_gpu_pcie_link_generation", "gauge",
                        "Current PCIe link generation (drops at idle to save power).")
PCIE_MAX_GENERATION = _spec("llmmon_gpu_pcie_link_max_generation", "gauge",
                            "Maximum PCIe link generation of the GPU.")
PCIE_WIDTH = _spec("llmmon_gpu_pcie_link_width", "gauge", "Current PCIe link width (lanes).")
PCIE_MAX_WIDTH = _spec("llmmon_gpu_pcie_link_max_width", "gauge",
                       "Maximum PCIe link width; below it the link trained down.")
NVLINK_BYTES = _spec("llmmon_gpu_nvlink_bytes_total", "counter",
                     "NVLink data bytes over all links (NVML reports KiB).", "direction")
NVLINK_ERRORS = _spec("llmmon_gpu_nvlink_errors_total", "counter",
                      "NVLink errors over all links.", "type")
NVLINK_ACTIVE = _spec("llmmon_gpu_nvlink_active_links", "gauge", "NVLinks in the active state.")
RECOVERY_ACTION = _spec("llmmon_gpu_recovery_action", "gauge",
                        "Action the driver asks for: 0 none, 1 GPU reset, 2 node reboot, "
                        "3 drain peer-to-peer, 4 drain and reset.")
FABRIC_STATE = _spec("llmmon_gpu_fabric_state", "gauge",
                     "GPU fabric (NVSwitch) registration: 1 not started, 2 in progress, "
                     "3 completed (NVML GPU fabric info); absent without NVSwitch.")
FABRIC_STATUS = _spec("llmmon_gpu_fabric_status", "gauge",
                      "NVML return code of the fabric registration once completed: 0 success; "
                      "anything else means the fabric manager rejected the GPU.")
FABRIC_DEGRADED = _spec("llmmon_gpu_fabric_degraded_bandwidth", "gauge",
                        "1 if the fabric reports degraded NVLink bandwidth for this GPU (health "
                        "mask), 0 if not; absent where the driver does not say.")
PEAK_FLOPS = _spec("llmmon_gpu_peak_flops", "gauge",
                   "Dense peak tensor FLOP/s of this GPU model by dtype (datasheet): the MFU "
                   "denominator. bf16 only unless --collector.gpu.peak-flops-dtypes says "
                   "more.", "dtype")
XID_ERRORS = _spec("llmmon_gpu_xid_errors_total", "counter",
                   "XID critical-error events, every one counted; at start, the XIDs the "
                   "kernel log holds from before (see llmmon_gpu_xid_kernel_log_read).", "xid")
XID_LAST = _spec("llmmon_gpu_xid_last_timestamp_seconds", "gauge",
                 "When the last event of this XID arrived (increase() misses a first event; "
                 "alert on this too).", "xid")
XID_ACTION = MetricSpec("llmmon_gpu_xid_action_info", "info",
                        "What an XID seen on this node asks for, after NVIDIA's XID catalogue: "
                        "reset_gpu, reboot_node, rma, check_application, none or unknown; "
                        "value 1. Join on xid.", ("xid", "action"))
XID_KERNEL_LOG = MetricSpec("llmmon_gpu_xid_kernel_log_read", "gauge",
                            "1 if the kernel log was read at start, so XIDs from before the "
                            "daemon started are in llmmon_gpu_xid_errors_total; 0 if it could "
                            "not be read (see the log).")
XID_UNATTRIBUTED = MetricSpec("llmmon_gpu_xid_unattributed_errors", "gauge",
                              "XIDs in the kernel log at start whose PCI address no GPU "
                              "answered at (a GPU fallen off the bus).", ("pci_bus_id", "xid"))
XID_WATCHED = _spec("llmmon_gpu_xid_watched", "gauge",
                    "1 if this GPU is registered for XID events.")
PROCESS_INFO = _spec("llmmon_gpu_process_info", "info",
                     "A compute process on the GPU, its Kubernetes pod UID and container ID, "
                     "and its Slurm job and step (from /proc/<pid>/cgroup; empty outside "
                     "Kubernetes, Slurm). The pid joins llmmon_rank_info of a rank followed "
                     "without the reporter (uuid_job_id:llmmon_rank_info:max_up).",
                     "pid", "pod_uid", "container_id", "slurm_job_id", "slurm_step")
PROCESS_MEMORY = _spec("llmmon_gpu_process_memory_bytes", "gauge",
                       "GPU memory used by a compute process.", "pid")

Sample = tuple[MetricSpec, tuple[str, ...], float]  # spec, label values, value
Row = tuple[str, MetricSpec, tuple[str, ...], float]  # NVML name, spec, extra labels, scale
FAST_CALLS: tuple[Row, ...] = (
    ("power_usage_mw", POWER, (), 1e-3),
    ("temp_gpu_c", TEMPERATURE, ("gpu",), 1),
    ("clock_sm_mhz", CLOCK, ("sm",), MHZ),
    ("clock_mem_mhz", CLOCK, ("memory",), MHZ),
    ("clock_graphics_mhz", CLOCK, ("graphics",), MHZ),
    ("clock_video_mhz", CLOCK, ("video",), MHZ),
)
STATIC_CALLS: tuple[Row, ...] = (
    ("temp_threshold_slowdown", TEMPERATURE_THRESHOLD, ("slowdown",), 1),
    ("temp_threshold_shutdown", TEMPERATURE_THRESHOLD, ("shutdown",), 1),
    ("temp_threshold_gpu_max", TEMPERATURE_THRESHOLD, ("gpu_max",), 1),
    ("temp_threshold_mem_max", TEMPERATURE_THRESHOLD, ("mem_max",), 1),
    ("max_clock_sm_mhz", CLOCK_MAX, ("sm",), MHZ),
    ("max_clock_mem_mhz", CLOCK_MAX, ("memory",), MHZ),
    ("power_limit_default_mw", POWER_LIMIT_BOUND, ("default",), 1e-3),
    ("pcie_max_gen", PCIE_MAX_GENERATION, (), 1),
    ("pcie_max_width", PCIE_MAX_WIDTH, (), 1),
)
SLOW_CALLS: tuple[Row, ...] = (
    ("pcie_gen", PCIE_GENERATION, (), 1),
    ("pcie_width", PCIE_WIDTH, (), 1),
)
FAST_FIELDS: tuple[Row, ...] = (("NVML_FI_DEV_MEMORY_TEMP", TEMPERATURE, ("memory",), 1),)
SLOW_FIELDS: tuple[Row, ...] = (
    ("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", ENERGY, (), 1e-3),
    ("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", ECC, ("corrected", "volatile"), 1),
    ("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", ECC, ("uncorrected", "volatile"), 1),
    ("NVML_FI_DEV_ECC_SBE_AGG_TOTAL", ECC, ("corrected", "aggregate"), 1),
    ("NVML_FI_DEV_ECC_DBE_AGG_TOTAL", ECC, ("uncorrected", "aggregate"), 1),
    ("NVML_FI_DEV_REMAPPED_COR", REMAPPED_ROWS, ("correctable",), 1),
    ("NVML_FI_DEV_REMAPPED_UNC", REMAPPED_ROWS, ("uncorrectable",), 1),
    ("NVML_FI_DEV_REMAPPED_PENDING", REMAP_PENDING, (), 1),
    ("NVML_FI_DEV_REMAPPED_FAILURE", REMAP_FAILURE, (), 1),
    ("NVML_FI_DEV_PCIE_REPLAY_COUNTER", PCIE_REPLAYS, (), 1),
    ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", PCIE_BYTES, ("tx",), 1),
    ("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", PCIE_BYTES, ("rx",), 1),
    ("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", RECOVERY_ACTION, (), 1),
    ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", NVLINK_BYTES, ("tx",), 1024),
    ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", NVLINK_BYTES, ("rx",), 1024),
    ("NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", NVLINK_ERRORS, ("crc_flit",), 1),
    ("NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", NVLINK_ERRORS, ("crc_data",), 1),
    ("NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", NVLINK_ERRORS, ("replay",), 1),
    ("NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", NVLINK_ERRORS, ("recovery",), 1),
    ("NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL", NVLINK_ERRORS, ("ecc_data",), 1),
)
GPM_METRICS = (
    ("NVML_GPM_METRIC_SM_UTIL", SM_ACTIVE),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", SM_OCCUPANCY),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", TENSOR_ACTIVE),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", DRAM_ACTIVE),
)
NVLINK_ACTIVE_STATE = 1
SAMPLER_STUCK_S = 2.0  # no sampler tick for this long (or 3 periods): its NVML read is blocked



def fabric(info: dict[str, Any] | None) -> list[Sample]:
    """The fabric series of one `fabric_info` answer (nvmlGpuFabricInfo_v2_t's fields)."""
    if not info or info.get("state", FABRIC_NOT_SUPPORTED) == FABRIC_NOT_SUPPORTED:
        return []
    out: list[Sample] = [(FABRIC_STATE, (), float(info["state"]))]
    if info["state"] == FABRIC_COMPLETED and "status" in info:
        out.append((FABRIC_STATUS, (), float(info["status"])))
    degraded = (int(info.get("healthMask", 0)) >> DEGRADED_BW_SHIFT) & DEGRADED_BW_WIDTH
    if degraded in (DEGRADED_BW_TRUE, DEGRADED_BW_FALSE):
        out.append((FABRIC_DEGRADED, (), float(degraded == DEGRADED_BW_TRUE)))
    return out


@dataclass
class _Gpu:
    """What the collector remembers about one GPU between runs."""

    index: int
    uuid: str = ""
    info: tuple[str, ...] | None = None
    static: list[Sample] = field(default_factory=list)
    supported_reasons: int | None = None
    slow: list[Sample] | None = None
    up: bool = True
    absent: set[str] = field(default_factory=set)

    @property
    def labels(self) -> tuple[str, str]:
        return (str(self.index), self.uuid)


class _Reader:
    """NVML reads for one GPU in one run: unsupported -> None, lost -> raise, else counted."""

    def __init__(self, source: NvmlSource, gpu: _Gpu, ctx: Context) -> None:
        self.source = source
        self.gpu = gpu
        self.ctx = ctx

    def _failed(self, name: str, exc: NvmlError) -> None:
        if exc.lost:
            raise exc
        if exc.absent:
            self.gpu.absent.add(name)
        else:
            self.ctx.error(f"gpu{self.gpu.index}/{name}", f"GPU {self.gpu.index} {name}: {exc}")

    def call(self, name: str, *args: str) -> Any:
        try:
            return self.source.call(self.gpu.index, name, *args)
        except NvmlError as exc:
            self._failed(name, exc)
            return None

    def _values(self, fields: dict[str, Field]) -> dict[str, float]:
        values = {}
        for name, result in fields.items():
            try:
                values[name] = float(result.get())
            except NvmlError as exc:
                self._failed(name, exc)
        return values

    def fields(self, names: list[str]) -> dict[str, float]:
        try:
            return self._values(self.source.field_values(self.gpu.index, names))
        except NvmlError as exc:
            self._failed("field_values", exc)
            return {}

    def gpm(self, names: list[str]) -> dict[str, float]:
        try:
            return self._values(self.source.gpm(self.gpu.index, names))
        except NvmlError as exc:
            self._failed("gpm", exc)
            return {}

    def table(self, calls: Iterable[Row], out: list[Sample]) -> None:
        for name, spec, extra, scale in calls:
            value = self.call(name)
            if value is not None:
                out.append((spec, extra, value * scale))

    def field_table(self, table: tuple[Row, ...], out: list[Sample]) -> None:
        values = self.fields([name for name, *_ in table])
        for name, spec, extra, scale in table:
            if name in values:
                out.append((spec, extra, values[name] * scale))


class GpuCollector(Collector):
    name = "gpu"
    description = ("NVIDIA GPUs over NVML: power with 20 Hz dip detection, throttling, memory, "
                   "errors, XIDs, tensor activity and per-process pod attribution.")
    specs = (INFO, UP, POWER, POWER_INSTANT, POWER_MIN, POWER_MIN_RATIO, POWER_MEAN, POWER_MAX,
             POWER_SAMPLES, POWER_DIPS, POWER_LOW, POWER_LIMIT, POWER_LIMIT_BOUND, ENERGY,
             TEMPERATURE, TEMPERATURE_THRESHOLD, CLOCK, CLOCK_MAX, CLOCK_EVENT, THROTTLE,
             UTILIZATION, MEMORY_CONTROLLER, SM_ACTIVE, SM_OCCUPANCY, TENSOR_ACTIVE, DRAM_ACTIVE,
             MEMORY, ECC, REMAPPED_ROWS, REMAP_PENDING, REMAP_FAILURE, PCIE_REPLAYS, PCIE_BYTES,
             PCIE_GENERATION, PCIE_MAX_GENERATION, PCIE_WIDTH, PCIE_MAX_WIDTH, NVLINK_BYTES,
             NVLINK_ERRORS, NVLINK_ACTIVE, RECOVERY_ACTION, FABRIC_STATE, FABRIC_STATUS,
             FABRIC_DEGRADED, PEAK_FLOPS, XID_ERRORS, XID_LAST,
             XID_WATCHED, XID_ACTION, XID_KERNEL_LOG, XID_UNATTRIBUTED, PROCESS_INFO,
             PROCESS_MEMORY)
    options = (
        Option("power_sample_rate", "float", 20.0,
               "Instant power reads per second of every GPU (one thread for all GPUs).",
               metavar="HZ", minimum=1.0, maximum=200.0),
        Option("power_busy_fraction", "float", 0.5,
               "Busy level for dip detection, as a fraction of the enforced power limit.",
               metavar="FRACTION", minimum=0.01, maximum=1.0),
        Option("power_low_fraction", "float", 0.3,
               "Low level: a dip is a fall below it after reaching the busy level; time "
               "below it is llmmon_gpu_power_low_seconds_total.", metavar="FRACTION",
               minimum=0.01, maximum=1.0),
        Option("slow_interval", "duration", "15s",
               "How often the calls that block for milliseconds run (energy, ECC, row "
               "remapping, PCIe and NVLink counters, throttle time).",
               minimum="1s", maximum="24h"),
        Option("processes", "bool", True,
               "Export compute processes with their pod UID and container ID."),
        Option("power_limit_bounds", "bool", False,
               "Also export llmmon_gpu_power_limit_bound_watts (the min, max and default "
               "power limit the driver allows: 3 static series per GPU that no shipped rule "
               "or dashboard reads; llmmon_gpu_power_limit_watts is always exported)."),
        Option("power_instant_latest", "bool", False,
               "Also export llmmon_gpu_power_instant_watts, the latest 20 Hz sample (one series "
               "per GPU that no shipped rule or dashboard reads: the window's min, mean and max "
               "are always exported)."),
        Option("sm_occupancy", "bool", False,
               "Also export llmmon_gpu_sm_occupancy_ratio (GPM, Hopper and newer: resident "
               "warps over the maximum; one series per GPU that no shipped rule or dashboard "
               "reads: llmmon_gpu_sm_active_ratio, what the MFU triage reads, is always "
               "exported)."),
        Option("peak_flops_dtypes", "list", "bf16",
               "Dtypes whose llmmon_gpu_peak_flops is exported (bf16, fp16, fp8, tf32; "
               "default bf16, the MFU denominator the shipped rules read: each other dtype is "
               "one more static series per GPU).", metavar="DTYPES",
               choices=("bf16", "fp16", "fp8", "tf32")),
        Option("kmsg_path", "str", "/dev/kmsg",
               "Kernel log read once at start for the XIDs logged before the daemon started "
               "(needs CAP_SYSLOG where dmesg_restrict is set); empty skips it.", metavar="PATH"),
    )
    interval = 5.0
    timeout = 4.0

    def __init__(self, env: Environment, config: dict[str, Any]) -> None:
        super().__init__(env, config)
        self.source = open_nvml(env.settings["nvml.replay"])
        self.power = PowerSampler(self.source, config["power_sample_rate"],
                                  config["power_busy_fraction"], config["power_low_fraction"])
        self.xid = XidWatcher(self.source)
        self._gpus: list[_Gpu] = []
        self._system: tuple[str, str] | None = None
        self._next_slow = 0.0
        self._history: XidHistory | None = None
        self._kmsg_read: float | None = None
        self._order = {spec: n for n, spec in enumerate(self.specs)}

    def start(self) -> None:
        self.power.start()
        self.xid.start()

    def close(self) -> None:
        self.power.close()
        self.xid.close()
        self.source.close()

    # a run ---------------------------------------------------------------------------
    def collect(self, ctx: Context) -> Iterable[Metric]:
        families = Families()
        try:
            count = self.source.device_count()
        except NvmlUnavailable as exc:
            ctx.watching(0, f"GPUs (no NVML: {exc})")
            return families
        if len(self._gpus) != count:
            self._gpus = [_Gpu(index) for index in range(count)]
        for key, message in self.source.problems().items():
            ctx.error(f"source:{key}", message)
        now = time.monotonic()
        slow_due = now >= self._next_slow
        if slow_due:
            self._next_slow = now + self.config["slow_interval"]
        samples: list[Sample] = []
        for gpu in self._gpus:
            samples += self._collect_gpu(gpu, ctx, slow_due)
        if self._history is None:  # before the event set exists: nothing counted twice
            self._read_history(ctx)
        self.xid.watch([gpu.index for gpu in self._gpus if gpu.info is not None])
        self._check_power_sampler(ctx)
        samples += self._xid_samples()
        samples.sort(key=lambda sample: self._order[sample[0]])
        for spec, labels, value in samples:
            families.add(spec, labels, value)
        ctx.watching(count, "GPUs")
        return families

    def _collect_gpu(self, gpu: _Gpu, ctx: Context, slow_due: bool) -> list[Sample]:
        """All samples of one GPU, labelled; only llmmon_gpu_up 0 (and its info) if lost."""
        reader = _Reader(self.source, gpu, ctx)
        own: list[Sample] = []
        try:
            if gpu.info is None:
                self._identify(reader)
            self._fast(reader, own)
            if slow_due or gpu.slow is None:
                gpu.slow = []
                self._slow(reader, gpu.slow)
        except NvmlError as exc:
            if gpu.up:
                ctx.error(f"gpu{gpu.index}", f"GPU {gpu.index} {gpu.uuid} is lost: {exc}")
            gpu.up, gpu.slow = False, None
            head = [(UP, gpu.labels, 0.0)]
            if gpu.info is not None:
                head.append((INFO, gpu.labels + gpu.info, 1.0))
            return head
        gpu.up = True
        assert gpu.info is not None
        labelled = [(INFO, gpu.labels + gpu.info, 1.0), (UP, gpu.labels, 1.0)]
        labelled += [(spec, gpu.labels + extra, value)
                     for spec, extra, value in gpu.static + own + gpu.slow]
        return labelled + self._from_threads(gpu)

    def _identify(self, reader: _Reader) -> None:
        """Identity and values that do not change while the driver is loaded."""
        gpu = reader.gpu
        gpu.uuid = self.source.call(gpu.index, "uuid")  # no UUID, no usable GPU: lost or not
        if self._system is None:
            self._system = self._read_system()
        model = reader.call("name") or ""
        pci = reader.call("pci") or {}
        capability = reader.call("cuda_cc")
        static: list[Sample] = []
        reader.table(STATIC_CALLS, static)
        bounds = reader.call("power_limit_constraints_mw")
        if bounds:
            static += [(POWER_LIMIT_BOUND, ("min",), bounds[0] / 1e3),
                       (POWER_LIMIT_BOUND, ("max",), bounds[1] / 1e3)]
        static += [(PEAK_FLOPS, (dtype,), flops) for dtype, flops in peak_flops(model).items()
                   if dtype in self.config["peak_flops_dtypes"]]
        gpu.supported_reasons = reader.call("supported_clocks_event_reasons")
        if not self.config["power_limit_bounds"]:
            static = [sample for sample in static if sample[0] is not POWER_LIMIT_BOUND]
        gpu.static = static
        gpu.info = (model, pci.get("busId", ""), self._system[0], self._system[1],
                    reader.call("vbios") or "", reader.call("serial") or "",
                    ".".join(map(str, capability)) if capability else "")

    def _read_system(self) -> tuple[str, str]:
        """Driver version and CUDA driver version ("13.0"), empty where unsupported."""
        values = []
        for name in ("driver", "cuda_driver"):
            try:
                values.append(self.source.system(name))
            except NvmlError:
                values.append(None)
        driver, cuda = values
        return (driver or "",
                f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else "")

    def _fast(self, reader: _Reader, out: list[Sample]) -> None:
        reader.table(FAST_CALLS, out)
        reader.field_table(FAST_FIELDS, out)
        limit = reader.call("power_limit_enforced_mw")
        if limit is not None:
            out.append((POWER_LIMIT, (), limit / 1e3))
        self.power.track(reader.gpu.index, limit / 1e3 if limit else None)
        reasons = reader.call("clocks_event_reasons")
        if reasons is not None:
            out += [(CLOCK_EVENT, (reason,), active)
                    for reason, active in decompose(reasons, reader.gpu.supported_reasons)]
        utilization = reader.call("utilization")
        if utilization is not None:
            out += [(UTILIZATION, (), utilization["gpu"] / 100),
                    (MEMORY_CONTROLLER, (), utilization["memory"] / 100)]
        wanted = [(name, spec) for name, spec in GPM_METRICS
                  if spec is not SM_OCCUPANCY or self.config["sm_occupancy"]]
        activity = reader.gpm([name for name, _ in wanted])
        out += [(spec, (), activity[name] / 100) for name, spec in wanted if name in activity]
        memory = reader.call("memory_info_v2") or reader.call("memory_info")
        if memory is not None:
            out += [(MEMORY, (state,), memory[state])
                    for state in ("total", "reserved", "used", "free") if state in memory]
        if self.config["processes"]:
            self._processes(reader, out)

    def _processes(self, reader: _Reader, out: list[Sample]) -> None:
        for process in reader.call("compute_procs") or ():
            pid = str(process["pid"])
            pod, slurm = owners_of(self.env.procfs, process["pid"])
            out.append((PROCESS_INFO, (pid, pod.pod_uid, pod.container_id, slurm.job_id,
                                       slurm.step), 1.0))
            if process.get("usedGpuMemory") is not None:
                out.append((PROCESS_MEMORY, (pid,), process["usedGpuMemory"]))

    def _slow(self, reader: _Reader, out: list[Sample]) -> None:
        reader.field_table(SLOW_FIELDS, out)
        reader.table(SLOW_CALLS, out)
        for policy in VIOLATION_POLICIES:
            violation = reader.call("violation_status", policy)
            if violation is not None:
                reason = policy.removeprefix("NVML_PERF_POLICY_").lower()
                out.append((THROTTLE, (reason,), violation["violationTime"] / 1e9))
        out += fabric(reader.call("fabric_info"))
        states = [reader.call("nvlink", str(link), "state") for link in range(NVLINK_MAX_LINKS)]
        if any(state is not None for state in states):
            out.append((NVLINK_ACTIVE, (), sum(state == NVLINK_ACTIVE_STATE for state in states)))

    def _from_threads(self, gpu: _Gpu) -> list[Sample]:
        """The power window the sampler thread gathered for `gpu`."""
        out: list[Sample] = []
        window = self.power.take(gpu.index)
        if window is not None:
            out.append((POWER_SAMPLES, gpu.labels, window.samples_total))
            if window.mean_watts is not None:
                if self.config["power_instant_latest"]:
                    out.append((POWER_INSTANT, gpu.labels, window.last_watts))
                out += [(POWER_MIN, gpu.labels, window.min_watts),
                        (POWER_MEAN, gpu.labels, window.mean_watts),
                        (POWER_MAX, gpu.labels, window.max_watts)]
            if window.min_ratio is not None:
                out.append((POWER_MIN_RATIO, gpu.labels, window.min_ratio))
            if window.dips_total is not None:
                out += [(POWER_DIPS, gpu.labels, window.dips_total),
                        (POWER_LOW, gpu.labels, window.low_seconds_total)]
        return out

    def _read_history(self, ctx: Context) -> None:
        """Seed the XID counts from the kernel log, once, on the GPUs' PCI addresses."""
        self._history = XidHistory(Counter(), {})
        path = self.config["kmsg_path"]
        if not path:
            return
        try:
            self._history = history(read_kmsg(path))
        except KmsgError as exc:
            self._kmsg_read = 0.0
            ctx.error("kmsg", f"XIDs from before the start are not counted: {exc}")
            return
        self._kmsg_read = 1.0
        by_pci = {pci_key(gpu.info[1]): gpu.index for gpu in self._gpus
                  if gpu.info is not None and gpu.info[1]}
        for (pci, xid), count in list(self._history.counts.items()):
            if pci in by_pci:
                self.xid.seed(by_pci[pci], xid, count, self._history.last[(pci, xid)])
                del self._history.counts[(pci, xid)]

    def _xid_samples(self) -> list[Sample]:
        """XID counts of the GPUs that answer; the kernel-log read, unattributed XIDs, and
        the action of each code seen."""
        out: list[Sample] = []
        counts = self.xid.counts()
        for gpu in (g for g in self._gpus if g.up and g.info is not None):
            out.append((XID_WATCHED, gpu.labels, 1.0 if gpu.index in self.xid.watched else 0.0))
            for (index, xid), (count, last) in sorted(counts.items()):
                if index == gpu.index:
                    out += [(XID_ERRORS, gpu.labels + (str(xid),), count),
                            (XID_LAST, gpu.labels + (str(xid),), last)]
        if self._kmsg_read is not None:
            out.append((XID_KERNEL_LOG, (), self._kmsg_read))
        assert self._history is not None
        for (pci, xid), count in sorted(self._history.counts.items()):
            out.append((XID_UNATTRIBUTED, (pci, str(xid)), count))
        codes = {xid for _, xid in counts} | {xid for _, xid in self._history.counts}
        out += [(XID_ACTION, (str(xid), action(xid)), 1.0) for xid in sorted(codes)]
        return out

    def _check_power_sampler(self, ctx: Context) -> None:
        if not self.power.running or self.power.last_tick is None:
            return
        age = time.monotonic() - self.power.last_tick
        if age > max(SAMPLER_STUCK_S, 3 * self.power.period):
            ctx.error("power_sampler", f"instant power sampler blocked for {age:.0f}s "
                                       "(an NVML call does not return)")

    def api(self) -> dict[str, Any]:
        return {"gpu": self._state}

    def _state(self) -> dict[str, Any]:
        return {"source": self.source.description,
                "xid_watched": list(self.xid.watched),
                "gpus": [{"index": g.index, "uuid": g.uuid, "up": g.up,
                          "unsupported": sorted(g.absent)} for g in self._gpus]}

