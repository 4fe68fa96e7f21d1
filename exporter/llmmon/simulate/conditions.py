"""What a node looks like during one tick, before it is written out.

A tick starts from the healthy baseline the training job implies (busy GPUs, RDMA and disk
traffic while ranks progress), then every active scenario bends it (a port goes down, a card
runs hot, the data disks saturate).  Rates are per wall-clock second, so Prometheus' `rate()`
shows H200 magnitudes whatever `--speed` is; one-off `events` are added once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Mapping

from llmmon.simulate.nccl_files import NcclCondition

# Clock-event reason bits (nvmlClocksEventReason*).
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40


@dataclass
class GpuCondition:
    load: str = "idle"  # busy | starved | idle (context held) | off (no process) | lost
    power_scale: float = 1.0
    clock_reasons: int = 0  # bits added to what the load implies
    sm_clock_mhz: int | None = None  # None: what the load implies
    temperature_offset: float = 0.0
    xids: list[int] = field(default_factory=list)
    pcie_link: tuple[int, int] | None = None  # (generation, width) when trained down
    nvlink_errors: float = 0.0  # NVLink CRC flit errors per second (replays a fifth of it)
    uncorrectable: int = 0  # uncorrectable ECC errors since the driver loaded, remap pending


@dataclass
class PortCondition:
    up: bool = True
    tx_bytes: float = 0.0  # RDMA bytes per second
    rx_bytes: float = 0.0
    rates: Counter[str] = field(default_factory=Counter)  # other counters, per second
    events: Counter[str] = field(default_factory=Counter)  # one-off increments this tick
    tx_pause: float = 0.0  # fraction of the time this NIC pauses its switch (PFC, priority 3)
    rx_pause: float = 0.0  # fraction of the time the switch pauses this NIC
    pcie_stalled: float = 0.0  # fraction of outbound PCIe reads stalled (host back-pressure)


@dataclass
class DiskCondition:
    """The data set's array; its members share the load."""

    reads: float = 0.0  # per second
    read_bytes: float = 0.0
    read_latency: float = 0.0003
    writes: float = 5.0
    write_bytes: float = 200e3
    write_latency: float = 0.00002
    busy: float = 0.0  # fraction of time with IO in flight
    queue: float = 0.0  # mean IOs in flight


@dataclass
class NodeCondition:
    gpus: list[GpuCondition]
    ports: list[PortCondition]
    disk: DiskCondition = field(default_factory=DiskCondition)
    io_pressure_some: float = 0.0  # fraction of time some task stalled on IO
    io_pressure_full: float = 0.0
    tcp_bytes: float = 2e6  # management netdev, per second each way
    gpudirect: bool = True
    unbound_nics: frozenset[int] = frozenset()  # NICs whose driver did not bind: no RDMA device
    nccl: NcclCondition = field(default_factory=NcclCondition)


class Counters:
    """Monotonic accumulators keyed by name: simulated counters never go backwards."""

    def __init__(self) -> None:
        self._values: defaultdict[str, float] = defaultdict(float)

    def advance(self, key: str, rate: float, seconds: float) -> None:
        if rate < 0:
            raise ValueError(f"{key}: negative rate {rate}")
        self._values[key] += rate * seconds

    def bump(self, key: str, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError(f"{key}: negative increment {amount}")
        self._values[key] += amount

    def advance_all(self, prefix: str, rates: Mapping[str, float], seconds: float) -> None:
        for name, rate in rates.items():
            self.advance(f"{prefix}{name}", rate, seconds)

    def __getitem__(self, key: str) -> int:
        return int(self._values[key])

    def exact(self, key: str) -> float:
        return self._values[key]
