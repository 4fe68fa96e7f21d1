"""PFC and pause, drop, buffer, PCIe-stall and link-error counters from NIC driver statistics
(`ethtool -S`), mapped per driver by the regex tables in `llmmon.network.nic_mappings`.

This is the lossless-fabric branch of the triage tree: a NIC sending pause frames for long
(`direction="tx"`) is the congested one; pause-storm events mean the NIC gave up pausing and
drops are likely.  A missing priority on mlx5 means PFC is off for it, not zero pauses.  An
mlx5 netdev has ~700 statistics; only mapped ones are exported unless allow-listed.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from prometheus_client.core import Metric

from llmmon.network import nic_mappings as m
from llmmon.collector import Collector, Context, Environment
from llmmon.network.device_filter import DeviceFilter, filter_options
from llmmon.metrics import Families, MetricSpec
from llmmon.options import Option
from llmmon.sources import pci
from llmmon.sources.ethtool import DumpDirectory, Ioctl, NoStatistics, StatisticsSource
from llmmon.sources.fs import SourceError

MAX_CACHED_NAMES = 1 << 16


def _spec(name: str, help_text: str, *labels: str, kind: str = "counter") -> MetricSpec:
    return MetricSpec(name, kind, help_text, ("netdev",) + labels)


INFO = MetricSpec(
    "llmmon_nic_info", "info",
    "NIC whose driver statistics are read: its driver and the mapping table applied.",
    ("netdev", "driver", "mapping"))
EXTRA = _spec(
    "llmmon_nic_driver_stat",
    "Raw value of an allow-listed driver statistic without a dedicated metric (extra_stats); "
    "most are counters.", "stat", kind="gauge")
MAPPED = (
    _spec(m.PFC_FRAMES,
          "PFC pause frames per priority; direction=rx: the peer paused us, tx: we paused the "
          "peer (we could not absorb traffic).", "priority", "direction"),
    _spec(m.PFC_SECONDS,
          "Time paused by PFC per priority (driver microseconds / 1e6); its rate is the "
          "fraction of time paused.", "priority", "direction"),
    _spec(m.PFC_TRANSITIONS, "PFC XOFF/XON transitions per priority.", "priority",
          "direction"),
    _spec(m.GLOBAL_FRAMES, "802.3x global pause frames (when global pause is on).",
          "direction"),
    _spec(m.GLOBAL_SECONDS, "Time paused by 802.3x global pause.", "direction"),
    _spec(m.CONTROL_FRAMES, "Link-layer pause control frames at the physical port.",
          "direction"),
    _spec(m.STORMS,
          "Pause storms: warning = the NIC sent pause for long; error = it hit the stall "
          "timeout and stopped sending pause, so drops may have occurred.", "severity"),
    _spec(m.PRIO_BYTES, "Bytes per priority at the physical port (is RoCE on the lossless "
          "priority?).", "priority", "direction"),
    _spec(m.PRIO_PACKETS, "Packets per priority at the physical port.", "priority",
          "direction"),
    _spec(m.PRIO_DISCARDS,
          "Received packets dropped per priority: no_buffer (device receive buffers), "
          "host_buffer (per-host buffers), host_congestion.", "priority", "reason"),
    _spec(m.PRIO_ECN, "Received packets ECN-marked by the device for host congestion.",
          "priority"),
    _spec(m.RX_DISCARDS, "Received packets dropped for lack of port buffers: the adapter is "
          "congested."),
    _spec(m.TX_DISCARDS, "Packets discarded on transmit (link down, head-of-line drop, pause "
          "from the network)."),
    _spec(m.OUT_OF_BUFFER, "Times a receive queue had no software buffer (Ethernet path; not "
          "RDMA)."),
    _spec(m.BUFFER_THRESHOLD, "Times the port receive buffer passed 85 % full."),
    _spec(m.PCIE_STALLED, "Fraction of the last second outbound PCIe requests stalled for "
          "lack of credits (host back-pressure).", "op", kind="gauge"),
    _spec(m.PCIE_STALLED_SECONDS, "Seconds in which outbound PCIe requests were stalled "
          "more than 30 % of the time.", "op"),
    _spec(m.PCIE_OVERFLOW, "Packets dropped because the PCIe buffer overflowed (receive "
          "rate above what the host bus takes)."),
    _spec(m.LINK_DOWN, "Times the physical link went down (port flapping)."),
    _spec(m.CRC_ERRORS, "Received frames dropped for a bad FCS."),
    _spec(m.SYMBOL_ERRORS, "Received packets dropped for physical coding (symbol) errors."),
    _spec(m.CORRECTED_BIT_ERRORS, "Bit errors corrected by FEC; over 8 x received bytes it is the "
          "corrected bit error rate."),
    _spec(m.RECEIVED_BYTES, "Traffic the PHY could have received (its bit count / 8), the "
          "denominator of bit error rates."),
    _spec(m.UNCORRECTED_SYMBOLS, "Symbol errors FEC did not correct: traffic was lost."),
)
SPECS_BY_NAME = {spec.name: spec for spec in MAPPED}
PER_PRIORITY = {SPECS_BY_NAME[name] for name in (m.PRIO_BYTES, m.PRIO_PACKETS, m.PRIO_DISCARDS,
                                                 m.PRIO_ECN)}


class Mapping:
    """One driver's rules, compiled, with a cache per stat name (names are stable)."""

    def __init__(self, driver: str, rules: tuple[m.Rule, ...]) -> None:
        self._rules = []
        for rule in rules:
            regex, spec = re.compile(rule.pattern), SPECS_BY_NAME[rule.metric]
            given = set(regex.groupindex) | {key for key, _ in rule.labels}
            if given != set(spec.labels[1:]):
                raise ValueError(f"{driver} rule {rule.pattern!r}: labels {sorted(given)} "
                                 f"do not match {spec.name}{spec.labels[1:]}")
            self._rules.append((regex, spec, rule))
        self._cache: dict[str, tuple[MetricSpec, tuple[str, ...], float] | None] = {}

    def resolve(self, stat: str) -> tuple[MetricSpec, tuple[str, ...], float] | None:
        if stat in self._cache:
            return self._cache[stat]
        found = None
        for regex, spec, rule in self._rules:
            match = regex.fullmatch(stat)
            if match:
                labels = {**match.groupdict(), **dict(rule.labels)}
                found = (spec, tuple(labels[name] for name in spec.labels[1:]), rule.divisor)
                break
        if len(self._cache) < MAX_CACHED_NAMES:
            self._cache[stat] = found
        return found


MAPPINGS = {driver: Mapping(driver, rules) for driver, rules in m.TABLES.items()}


class NicCollector(Collector):
    name = "nic"
    description = ("PFC/pause, drop, buffer and PCIe-stall counters from NIC driver statistics "
                   "(ethtool -S), live or from dumps.")
    specs = (INFO,) + MAPPED + (EXTRA,)
    options = (
        Option("dumps", "str", "",
               "Read `ethtool -S` text dumps from this directory (one file per interface, "
               "named after it) instead of the live ioctl.", flag="--ethtool.dumps", metavar="DIR"),
    ) + filter_options("interfaces") + (
        Option("all_interfaces", "bool", False,
               "Also read virtual interfaces (without a device behind /sys/class/net/IF)."),
        Option("priorities", "list", "3",
               "Priorities whose per-priority traffic, discard and ECN counters are exported "
               "(default 3, the lossless RoCE class; 0,1,2,3,4,5,6,7 for all eight: 40 more "
               "series per mlx5 port, which no shipped rule or dashboard reads). PFC pause "
               "counters are always exported.", metavar="PRIORITIES"),
        Option("extra_stats", "regex", "",
               "Driver statistics without a dedicated metric to export as "
               "llmmon_nic_driver_stat{stat} (empty: none). mlx5 has ~700 per interface."),
    )
    roots = ("sysfs",)
    interval = 5.0
    timeout = 3.0

    def __init__(self, env: Environment, config: dict[str, Any]) -> None:
        super().__init__(env, config)
        self.wanted = DeviceFilter(config["device_include"], config["device_exclude"])
        self._extra = re.compile(config["extra_stats"]) if config["extra_stats"] else None
        self._priorities = set(config["priorities"])
        self.source: StatisticsSource = (DumpDirectory(config["dumps"]) if config["dumps"]
                                         else Ioctl(env.sysfs, config["all_interfaces"]))

    def collect(self, ctx: Context) -> Iterable[Metric]:
        families = Families()
        try:
            netdevs = [n for n in self.source.interfaces() if self.wanted(n)]
        except SourceError as exc:
            ctx.error("interfaces", str(exc))
            netdevs = []
        watched = 0
        for netdev in netdevs:
            try:
                stats = self.source.read(netdev)
            except NoStatistics:
                continue
            except SourceError as exc:
                ctx.error(netdev, str(exc))
                continue
            watched += 1
            for problem in stats.problems:
                ctx.error(f"{netdev}:dump", problem)
            driver = pci.driver(self.env.sysfs, "class/net", netdev, "device")
            table = driver if driver in MAPPINGS else m.DEFAULT_DRIVER
            families.add(INFO, (netdev, driver, table), 1)
            self._export(ctx, families, netdev, stats.values, MAPPINGS[table])
        ctx.watching(watched, "network interfaces with driver statistics")
        return families

    def _export(self, ctx: Context, families: Families, netdev: str,
                values: list[tuple[str, int]], mapping: Mapping) -> None:
        seen: set[tuple[str, tuple[str, ...]]] = set()
        for stat, value in values:
            found = mapping.resolve(stat)
            if found is not None:
                spec, labels, divisor = found
            elif self._extra and self._extra.search(stat):
                spec, labels, divisor = EXTRA, (stat,), 1
            else:
                continue
            if spec in PER_PRIORITY and labels[spec.labels.index("priority") - 1] \
                    not in self._priorities:
                continue
            if (spec.name, labels) in seen:
                ctx.error(f"{netdev}:{stat}", f"{netdev}: statistic {stat!r} listed twice; "
                          "kept the first")
                continue
            seen.add((spec.name, labels))
            families.add(spec, (netdev,) + labels, value / divisor)
