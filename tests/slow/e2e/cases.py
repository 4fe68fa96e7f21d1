"""What each scenario must page and ticket, and with which labels and evidence.

One simulated node per scenario (`sim-NN`, running job `pretrain-N` alone), so every
notification is attributed to its scenario by its node or job label.  `pages` are the
critical alerts that must reach the pager receiver and the only ones allowed there for that
node or job; `tickets` are warnings that must reach the tickets receiver; `inhibited` are
alerts Prometheus fires that the shipped inhibit rules must keep from being sent.  Label
values may be callables of the node layout (UUIDs derive from the node name).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

from llmmon.simulate.hardware import NodeLayout

Value = Union[str, Callable[[NodeLayout], str]]


def uuid(gpu: int) -> Callable[[NodeLayout], str]:
    return lambda layout: layout.gpus[gpu].uuid


def netdev(nic: int) -> Callable[[NodeLayout], str]:
    return lambda layout: layout.nics[nic].netdev


@dataclass(frozen=True)
class Expect:
    alertname: str
    labels: dict[str, Value] = field(default_factory=dict)
    evidence: tuple[str, ...] = ()  # substrings of the description; {node} and {job} filled


@dataclass(frozen=True)
class Case:
    scenario: str  # NAME[:params] without the node
    pages: tuple[Expect, ...] = ()
    tickets: tuple[Expect, ...] = ()
    inhibited: tuple[Expect, ...] = ()

    @property
    def name(self) -> str:
        return self.scenario.split(":")[0]


CASES = (
    Case("starvation", tickets=(
        Expect("GPUDataLoaderStarvation", {}, ("GPUs of job {job} on node {node}",
                                               "slowest read latency 90ms")),
        Expect("DiskReadSaturated", {"device": "md0"}, ("Disk md0 on node {node}",)))),
    Case("straggler", tickets=(
        Expect("LLMTrainingStraggler", {"rank": "3", "reason": "enqueue_lag"},
               ("Rank 3 of job {job} (pod training/{job}-{node}) on node {node}",)),
        Expect("LLMTrainingStraggler", {"rank": "3", "reason": "collective_time"}))),
    Case("thermal", pages=(
        Expect("GPUThermalThrottle", {"gpu": "6", "uuid": uuid(6),
                                      "reason": "hw_thermal_slowdown"},
               ("GPU 6", "on node {node}", "jobs on it: {job}")),),
        tickets=(Expect("GPUPowerBelowPeers", {"gpu": "6", "uuid": uuid(6)},
                        ("GPU 6", "median GPU of job {job}")),),
        inhibited=(Expect("GPUThermalThrottle", {"reason": "sw_thermal_slowdown"}),)),
    Case("pfc-storm", pages=(
        Expect("RDMAPFCStorm", {"netdev": netdev(2), "reason": "storm_error_events"},
               ("on node {node}",)),
        Expect("RDMAPFCStorm", {"netdev": netdev(2), "reason": "paused_most_of_the_time"})),
        tickets=(Expect("RDMAPacketLoss", {"device": "mlx5_2", "port": "1"},
                        ("RDMA port mlx5_2/1 on node {node}",)),),
        inhibited=(Expect("RDMAPFCStorm", {"reason": "storm_warning_events"}),)),
    # The OOM (70 s of wall time in) comes well after the fragmentation and retry tickets (~30 s),
    # which it inhibits: a ticket not yet sent when the OOM fires is never sent.
    Case("oom:ramp=200,retry=300,retry_every=20,oom=1400", pages=(
        Expect("GPUMemoryOOM", {"rank": "1"},
               ("Rank 1 of job {job} (pod training/{job}-{node}) on node {node}",)),),
        tickets=(Expect("GPUMemoryFragmentation", {"rank": "1"}),
                 Expect("GPUMemoryOOMRisk", {"rank": "1", "reason": "alloc_retries"})),
        inhibited=(Expect("GPUMemoryFragmentation", {"rank": "1"}),
                   Expect("GPUMemoryOOMRisk", {"rank": "1"}))),
    Case("fp16:nan_after=200", pages=(
        Expect("LLMTrainingLossNonFinite", {}, ("Job {job} reported non-finite loss",)),),
        tickets=(Expect("LLMTrainingNotBF16", {}, ("reduction bytes of job {job}",)),)),
    # One flap per 15 s of wall time: one is a flap already (link_flap_downs), and a `for:` of
    # 15 s never spans two of them however late the rule evaluations run on a busy machine.
    Case("link-flap:every=300", tickets=(
        Expect("RDMALinkFlapping", {"device": "mlx5_4", "reason": "link_downed"},
               ("RDMA port mlx5_4/1 on node {node}",)),
        Expect("RDMALinkFlapping", {"netdev": netdev(4), "reason": "carrier_changes"}))),
    Case("gpu-lost:after=500", pages=(
        Expect("GPULost", {"gpu": "2", "uuid": uuid(2)}, ("GPU 2", "on node {node}")),)),
    Case("hang", pages=(
        Expect("LLMTrainingHang", {"rank": "5", "pg": "0", "reason": "rank_not_enqueued"},
               ("Rank 5 of job {job} (pod training/{job}-{node}) on node {node} is the rank "
                "behind",)),)),
    Case("pcie-downtrain", tickets=(
        Expect("PCIeLinkDowntrained", {"gpu": "1", "uuid": uuid(1), "reason": "gpu"},
               ("GPU 1", "on node {node}", "at Gen4 x8 (maximum Gen5 x16)")),)),
    Case("row-remap:after=200", pages=(
        Expect("GPUEccUncorrectable", {"gpu": "4", "uuid": uuid(4),
                                       "reason": "uncorrected_errors"},
               ("GPU 4", "on node {node}")),
        Expect("GPUXidActionRequired", {"gpu": "4", "xid": "48", "action": "reset_gpu"},
               ("reported XID 48", "reset the GPU"))),
        # GPUXidError's increase() misses a new series' first event, so only the XID's
        # timestamp (GPUXidActionRequired) pages here. XID 63 (the remap recorded) asks for
        # nothing in NVIDIA's catalogue: the pending remap is GPUEccUncorrectable's, inhibited
        # by the uncorrected errors it came from.
        inhibited=(Expect("GPUEccUncorrectable", {"reason": "row_remap_pending"}),)),
    Case("nvlink-degrading", tickets=(
        Expect("GPULinkErrorsAbovePeers", {"gpu": "3", "uuid": uuid(3), "reason": "nvlink"},
               ("GPU 3", "on node {node}", "NVLink CRC/replay/recovery errors")),)),
    Case("healthy"),
)
# rate(x[5m]) divides by the whole five minutes, so a job younger than that reads a low MFU:
# with every `for:` cut to seconds LLMTrainingMFULow tickets each new job (requests-sim.md).
WARMUP_TICKETS = frozenset({"LLMTrainingMFULow"})
