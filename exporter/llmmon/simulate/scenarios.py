"""The scenarios: each bends the healthy model of a node or its job while it is active.

A scenario is named in a spec, `NAME[@NODE][:key=value,...]` (`thermal@sim-01:gpu=3`), and
acts on the node it names (the first node without one) and on the job running there.  Its
clock starts when it becomes active and runs `--speed` times faster than the wall clock:
slow developments (fragmentation growing towards an OOM, the first NaN loss of an fp16 run,
the next link flap) arrive sooner, while rates stay per real second.  `alerts` lists what
the shipped rules should raise for it; the end-to-end tests hold them to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from llmmon.simulate.conditions import (
    HW_SLOWDOWN,
    HW_THERMAL,
    SW_THERMAL,
    DiskCondition,
    NodeCondition,
)
from llmmon.simulate.nccl_files import NcclCondition
from llmmon.simulate.job import GIB, INACTIVE_SPLIT, RESERVED, Job, JobEffects
from llmmon.simulate.hardware import NodeLayout


@dataclass(frozen=True)
class Tick:
    now: float  # wall clock, Unix seconds
    elapsed: float  # scenario seconds since the scenario became active (scaled by --speed)
    previous: float  # `elapsed` at the previous tick (-1 ns at the first)

    def crossed(self, start: float, every: float = math.inf) -> int:
        """How many of the instants start, start + every, ... fall in (previous, elapsed]."""
        def count(t: float) -> int:
            if t < start:
                return 0
            return 1 if math.isinf(every) else int((t - start) // every) + 1
        return count(self.elapsed) - count(self.previous)


class Scenario:
    name: ClassVar[str]
    help: ClassVar[str]
    alerts: ClassVar[tuple[str, ...]] = ()  # alertname/labels it should raise, for docs
    defaults: ClassVar[dict[str, float]] = {}
    optional: ClassVar[frozenset[str]] = frozenset()  # parameters without a default

    def __init__(self, node: int, params: dict[str, float]) -> None:
        unknown = set(params) - set(self.defaults) - self.optional
        if unknown:
            known = ", ".join(sorted(set(self.defaults) | self.optional)) or "none"
            raise ValueError(f"{self.name}: unknown parameter(s) {', '.join(sorted(unknown))}"
                             f" (known: {known})")
        self.node = node
        self.params = {**self.defaults, **params}

    def bind(self, job: Job, layout: NodeLayout) -> None:
        """Resolve and check targets (GPU, port, rank) against the node and its job."""
        if "gpu" in self.params:
            self.gpu = self._index("gpu", len(layout.gpus), "GPUs")
        if "port" in self.params:
            self.port = self._index("port", len(layout.nics), "RDMA ports")

    def job(self, effects: JobEffects, tick: Tick) -> None:
        """Change what the job on this node does this tick."""

    def condition(self, node: NodeCondition, tick: Tick) -> None:
        """Change the node's hardware this tick."""

    def _index(self, key: str, limit: int, what: str) -> int:
        value = int(self.params[key])
        if not 0 <= value < limit:
            raise ValueError(f"{self.name}: {key}={value}: the node has {limit} {what}")
        return value


class _RankScenario(Scenario):
    """Targets one rank: `rank=` (global), by default a fixed local rank on the node."""

    local_rank: ClassVar[int]
    optional = frozenset({"rank"})

    def bind(self, job: Job, layout: NodeLayout) -> None:
        if "rank" in self.params:
            self.rank = int(self.params["rank"])
            if not any(r.rank == self.rank and r.node == self.node for r in job.ranks):
                raise ValueError(f"{self.name}: rank {self.rank} of job {job.job_id} does not "
                                 "run on this node")
        else:
            self.rank = job.rank_on(self.node, self.local_rank).rank


class Healthy(Scenario):
    name = "healthy"
    help = "No fault: a bf16 FSDP job at ~42 % MFU, GPUs at their 700 W cap, quiet fabric."


class Starvation(Scenario):
    name = "starvation"
    help = ("The input pipeline cannot keep up: the data array saturates (reads queue for "
            "`latency` s, IO pressure), GPUs alternate 0.4 s of compute with 0.6 s of waiting "
            "(the H200 trace's starved phase) and steps take 2.5 times longer.")
    alerts = ("GPUDataLoaderStarvation", "DiskReadSaturated", "LLMTrainingMFULow")
    defaults = {"latency": 0.09}

    def job(self, effects: JobEffects, tick: Tick) -> None:
        effects.slowdown, effects.starved = 2.5, True

    def condition(self, node: NodeCondition, tick: Tick) -> None:
        reads = 2400.0
        latency = self.params["latency"]
        node.disk = DiskCondition(reads=reads, read_bytes=reads * 256e3, read_latency=latency,
                                  busy=1.0, queue=reads * latency)
        node.io_pressure_some, node.io_pressure_full = 0.55, 0.30


class Hang(_RankScenario):
    name = "hang"
    help = ("One rank (`rank=`, default local rank 5) stops issuing collectives; its peers "
            "enqueue the next one and wait; the job's GPUs go cold and its traffic stops.")
    alerts = ("LLMTrainingHang",)
    local_rank = 5

    def job(self, effects: JobEffects, tick: Tick) -> None:
        effects.stopped_rank = self.rank


class Straggler(_RankScenario):
    name = "straggler"
    help = ("One rank (`rank=`, default local rank 3) enqueues every collective `lag` seconds "
            "after its peers: it waits least in collectives and the job slows down.")
    alerts = ("LLMTrainingStraggler",)
    defaults = {"lag": 0.05}
    local_rank = 3

    def job(self, effects: JobEffects, tick: Tick) -> None:
        effects.late[self.rank] = self.params["lag"]


class Thermal(Scenario):
    name = "thermal"
    help = ("One card (`gpu=`, default 6) runs past its slowdown temperature (~90 °C): "
            "software and hardware thermal slowdown cut its SM clock to ~1 GHz and it draws "
            "~60 % of its peers' power while still busy.")
    alerts = ("GPUThermalThrottle", "GPUPowerBelowPeers")
    defaults = {"gpu": 6}

    def condition(self, node: NodeCondition, tick: Tick) -> None:
        gpu = node.gpus[self.gpu]
        gpu.power_scale = 0.62
        gpu.clock_reasons |= SW_THERMAL | HW_SLOWDOWN | HW_THERMAL
        gpu.sm_clock_mhz = 1065
        gpu.temperature_offset = 28.0


class PfcStorm(Scenario):
    name = "pfc-storm"
    help = ("The host behind one NIC (`port=`, default 2) stops draining it: the NIC pauses "
            "its switch 93 % of the time, hits its pause-storm watermarks every `period` "
            "seconds, drops and retransmits, and its RDMA traffic collapses.")
    alerts = ("RDMAPFCStorm", "RDMAPacketLoss")
    defaults = {"port": 2, "period": 8.0}

    def condition(self, node: NodeCondition, tick: Tick) -> None:
        port = node.ports[self.port]
        port.tx_pause, port.pcie_stalled = 0.93, 0.85
        port.tx_bytes *= 0.05
        port.rx_bytes *= 0.05
        port.rates.update({"rx_discards_phy": 1800, "out_of_sequence": 20,
                           "packet_seq_err": 12, "local_ack_timeout_err": 0.5})
        storms = tick.crossed(self.params["period"], self.params["period"])
        port.events["tx_pause_storm_warning_events"] += storms
        port.events["tx_pause_storm_error_events"] += storms


class Oom(_RankScenario):
    name = "oom"
    help = ("One rank's (`rank=`, default local rank 1) allocator cache grows to 137 GiB "
            "over `ramp` s while its tensors do not (fragmentation), cudaMalloc retries start "
            "at `retry` s, every `retry_every` s, and an out-of-memory error hits at `oom` s.")
    alerts = ("GPUMemoryFragmentation", "GPUMemoryOOMRisk", "GPUMemoryOOM")
    defaults = {"ramp": 300.0, "retry": 600.0, "retry_every": 30.0, "oom": 900.0}
    local_rank = 1
    PEAK = 137 * GIB

    def job(self, effects: JobEffects, tick: Tick) -> None:
        grown = (self.PEAK - RESERVED) * min(1.0, tick.elapsed / self.params["ramp"])
        effects.memory[self.rank] = (RESERVED + grown, INACTIVE_SPLIT + 0.8 * grown)
        effects.retries[self.rank] += tick.crossed(self.params["retry"],
                                                   self.params["retry_every"])
        effects.ooms[self.rank] += tick.crossed(self.params["oom"])


class Fp16(Scenario):
    name = "fp16"
    help = ("The job reduces its gradients in fp16 (Half) instead of bf16; after `nan_after` "
            "s its loss turns NaN every few steps.")
    alerts = ("LLMTrainingNotBF16", "LLMTrainingLossNonFinite")
    defaults = {"nan_after": 300.0}

    def job(self, effects: JobEffects, tick: Tick) -> None:
        effects.dtype = "Half"
        if tick.elapsed >= self.params["nan_after"]:
            effects.nonfinite_every = 5


class LinkFlap(Scenario):
    name = "link-flap"
    help = ("One RDMA link (`port=`, default 4) goes down for `down` wall seconds every "
            "`every` s: link_downed, carrier changes and link-down events count up, and the "
            "queue pairs crossing it retransmit.")
    alerts = ("RDMALinkFlapping",)
    defaults = {"port": 4, "every": 120.0, "down": 1.0}

    def __init__(self, node: int, params: dict[str, float]) -> None:
        super().__init__(node, params)
        self._down_until = 0.0

    def condition(self, node: NodeCondition, tick: Tick) -> None:
        port = node.ports[self.port]
        if tick.crossed(0.0, self.params["every"]):
            self._down_until = tick.now + self.params["down"]
            port.events.update({"link_downed": 1, "carrier_changes": 2,
                                "link_down_events_phy": 1, "local_ack_timeout_err": 4,
                                "packet_seq_err": 6})
        if tick.now < self._down_until:
            port.up, port.tx_bytes, port.rx_bytes = False, 0.0, 0.0


class GpuLost(Scenario):
    name = "gpu-lost"
    help = ("After `after` s, one GPU (`gpu=`, default 2) reports XID 79 and falls off the "
            "bus: NVML answers GpuIsLost, and torchrun tears the job down (its ranks stop "
            "reporting).")
    alerts = ("GPULost", "LLMMonReporterStale")
    defaults = {"gpu": 2, "after": 0.0}

    def job(self, effects: JobEffects, tick: Tick) -> None:
        effects.dead = effects.dead or tick.elapsed >= self.params["after"]

    def condition(self, node: NodeCondition, tick: Tick) -> None:
        gpu = node.gpus[self.gpu]
        if tick.crossed(self.params["after"]):
            gpu.xids.append(79)
        if tick.elapsed >= self.params["after"]:
            gpu.load = "lost"


class PcieDowntrain(Scenario):
    name = "pcie-downtrain"
    help = ("One busy GPU's (`gpu=`, default 1) PCIe link trains down to Gen`generation` "
            "x`width` (of Gen5 x16), as after a bad reseat or a failing riser.")
    alerts = ("PCIeLinkDowntrained",)
    defaults = {"gpu": 1, "generation": 4, "width": 8}

    def condition(self, node: NodeCondition, tick: Tick) -> None:
        node.gpus[self.gpu].pcie_link = (int(self.params["generation"]),
                                         int(self.params["width"]))


class RowRemap(Scenario):
    name = "row-remap"
    help = ("After `after` s one GPU (`gpu=`, default 4) hits an uncorrectable ECC error: XID "
            "48 and 63, the uncorrectable counts go to 1 and a row remap waits for the next "
            "GPU reset.")
    alerts = ("GPUEccUncorrectable", "GPUXidActionRequired", "GPUXidError")
    defaults = {"gpu": 4, "after": 0.0}

    def condition(self, node: NodeCondition, tick: Tick) -> None:
        gpu = node.gpus[self.gpu]
        if tick.crossed(self.params["after"]):
            gpu.xids += [48, 63]
        if tick.elapsed >= self.params["after"]:
            gpu.uncorrectable = 1


class NvlinkDegrading(Scenario):
    name = "nvlink-degrading"
    help = ("One GPU's (`gpu=`, default 3) NVLinks count `rate` CRC errors a second (and a "
            "fifth as many replays) while its peers count none.")
    alerts = ("GPULinkErrorsAbovePeers",)
    defaults = {"gpu": 3, "rate": 5.0}

    def condition(self, node: NodeCondition, tick: Tick) -> None:
        node.gpus[self.gpu].nvlink_errors = self.params["rate"]


class _NcclScenario(Scenario):
    """One item of the NCCL checklist gone wrong on the node (the checks need a job that
    spans nodes for the network ones: `--nodes 2`)."""

    check: ClassVar[str]  # the llmmon_job_nccl_misconfigured check it trips
    alerts = ("NCCLMisconfigured",)

    def bind(self, job: Job, layout: NodeLayout) -> None:
        self.rails = [f"{nic.device}:1" for nic in layout.nics]  # every port, as NCCL_IB_HCA

    def condition(self, node: NodeCondition, tick: Tick) -> None:
        self.bend(node, node.nccl)

    def bend(self, node: NodeCondition, nccl: NcclCondition) -> None:
        raise NotImplementedError


class NcclTransportSocket(_NcclScenario):
    name, check = "nccl-transport-socket", "transport_socket"
    help = ("NCCL falls back to sockets (the RDMA devices are not in the pod): its log says "
            "NET/Socket, the RDMA ports carry nothing but the job's traffic crosses TCP.")
    alerts = ("NCCLNotUsingRDMA", "NCCLMisconfigured")

    def bend(self, node: NodeCondition, nccl: NcclCondition) -> None:
        nccl.net, nccl.gdr = "Socket", False


class NcclIbDisabled(_NcclScenario):
    name, check = "nccl-ib-disabled", "ib_disabled"
    help = "NCCL_IB_DISABLE=1 on a RoCE node: NCCL uses sockets."
    alerts = ("NCCLNotUsingRDMA", "NCCLMisconfigured")

    def bend(self, node: NodeCondition, nccl: NcclCondition) -> None:
        nccl.env["NCCL_IB_DISABLE"] = "1"
        nccl.net, nccl.gdr = "Socket", False


class NcclIbHcaUnknown(_NcclScenario):
    name, check = "nccl-ib-hca-unknown", "ib_hca_unknown"
    help = ("NCCL_IB_HCA lists every rail and a device the node does not have (mlx5_bond_0, "
            "left from another node type).")

    def bend(self, node: NodeCondition, nccl: NcclCondition) -> None:
        nccl.env["NCCL_IB_HCA"] = "=" + ",".join([*self.rails, "mlx5_bond_0:1"])


class NcclIbHcaMissingRail(_NcclScenario):
    name, check = "nccl-ib-hca-missing-rail", "ib_hca_missing_rail"
    help = "NCCL_IB_HCA lists all rails but the last: one NIC's bandwidth is never used."

    def bend(self, node: NodeCondition, nccl: NcclCondition) -> None:
        nccl.env["NCCL_IB_HCA"] = "=" + ",".join(self.rails[:-1])


class NcclGidIndexUnset(_NcclScenario):
    name, check = "nccl-gid-index-unset", "gid_index_unset"
    help = ("NCCL_IB_GID_INDEX unset on RoCE ports under NCCL 2.19: before 2.21 NCCL then "
            "takes GID 0, the link-local RoCE v1 entry (2.21 and later pick a RoCE v2 one).")

    def bend(self, node: NodeCondition, nccl: NcclCondition) -> None:
        nccl.env["NCCL_IB_GID_INDEX"] = None
        nccl.version = "2.19.3+cuda12.3"


class NcclGidIndexNotRocev2(_NcclScenario):
    name, check = "nccl-gid-index-not-rocev2", "gid_index_not_rocev2"
    help = "NCCL_IB_GID_INDEX=2: the IPv4 GID of RoCE v1, which routed fabrics drop."

    def bend(self, node: NodeCondition, nccl: NcclCondition) -> None:
        nccl.env["NCCL_IB_GID_INDEX"] = "2"


class NcclSocketIfnameDown(_NcclScenario):
    name, check = "nccl-socket-ifname-down", "socket_ifname_down"
    help = "NCCL_SOCKET_IFNAME=eth0 on a node whose interfaces are eno1 and the RoCE ports."

    def bend(self, node: NodeCondition, nccl: NcclCondition) -> None:
        nccl.env["NCCL_SOCKET_IFNAME"] = "eth0"


class NcclGdrUnavailable(_NcclScenario):
    name, check = "nccl-gdr-unavailable", "gdr_unavailable"
    help = ("nvidia_peermem is not loaded (and no DMA-BUF): network channels go through "
            "host memory.")
    alerts = ("GPUDirectRDMADisabled", "NCCLMisconfigured")

    def bend(self, node: NodeCondition, nccl: NcclCondition) -> None:
        node.gpudirect, nccl.gdr = False, False


class NcclGdrLevelBlocks(_NcclScenario):
    name, check = "nccl-gdr-level-blocks", "gdr_level_blocks"
    help = "NCCL_NET_GDR_LEVEL=LOC: GPUDirect RDMA off although every GPU has a NIC on its switch."

    def bend(self, node: NodeCondition, nccl: NcclCondition) -> None:
        nccl.env["NCCL_NET_GDR_LEVEL"] = "LOC"
        nccl.gdr = False


class NcclP2pDisabled(_NcclScenario):
    name, check = "nccl-p2p-disabled", "p2p_disabled"
    help = "NCCL_P2P_DISABLE=1: GPUs of the node talk through host memory, not NVLink."

    def bend(self, node: NodeCondition, nccl: NcclCondition) -> None:
        nccl.env["NCCL_P2P_DISABLE"] = "1"


class NcclShmDisabled(_NcclScenario):
    name, check = "nccl-shm-disabled", "shm_disabled"
    help = "NCCL_SHM_DISABLE=1."

    def bend(self, node: NodeCondition, nccl: NcclCondition) -> None:
        nccl.env["NCCL_SHM_DISABLE"] = "1"


class NcclSingleQp(_NcclScenario):
    name, check = "nccl-single-qp-multi-rail", "single_qp_multi_rail"
    help = "NCCL_IB_QPS_PER_CONNECTION unset (one QP per connection) on an 8-rail node."

    def bend(self, node: NodeCondition, nccl: NcclCondition) -> None:
        nccl.env["NCCL_IB_QPS_PER_CONNECTION"] = None
        nccl.env["NCCL_IB_SPLIT_DATA_ON_QPS"] = None


class NcclGpuNicCrossSocket(_NcclScenario):
    name, check = "nccl-gpu-nic-cross-socket", "gpu_nic_cross_socket"
    help = ("The NICs of the second socket lost their RDMA devices (the driver did not bind "
            "after a firmware update): that socket's GPUs reach a NIC only across the sockets "
            "(SYS), and NCCL_IB_HCA still names the missing devices.")

    def bind(self, job: Job, layout: NodeLayout) -> None:
        super().bind(job, layout)
        sockets = {nic.switch.numa for nic in layout.nics}
        self.gone = frozenset(nic.index for nic in layout.nics if nic.switch.numa == max(sockets))
        if len(sockets) < 2:
            raise ValueError(f"{self.name}: the node's NICs sit on one socket")

    def bend(self, node: NodeCondition, nccl: NcclCondition) -> None:
        node.unbound_nics = self.gone


SCENARIOS: dict[str, type[Scenario]] = {
    cls.name: cls for cls in (Healthy, Starvation, Hang, Straggler, Thermal, PfcStorm, Oom,
                              Fp16, LinkFlap, GpuLost, PcieDowntrain, RowRemap,
                              NvlinkDegrading, NcclTransportSocket, NcclIbDisabled,
                              NcclIbHcaUnknown, NcclIbHcaMissingRail, NcclGidIndexUnset,
                              NcclGidIndexNotRocev2, NcclSocketIfnameDown, NcclGdrUnavailable,
                              NcclGdrLevelBlocks, NcclP2pDisabled, NcclShmDisabled,
                              NcclSingleQp, NcclGpuNicCrossSocket)}
