"""Interface traffic, errors and drops (rtnetlink IFLA_STATS64) with link state, speed, MTU and
carrier changes from /sys/class/net.

Carrier changes are the cheapest link-flap signal.  On mlx5 the netdev counters cover the
kernel's own traffic only: RDMA bypasses them, so RDMA volume is in llmmon_rdma_*_bytes_total.
Container plumbing (veth, CNI bridges, tunnels) is excluded by default to keep cardinality low.
"""

from __future__ import annotations

from typing import Any, Iterable

from prometheus_client.core import Metric

from llmmon.collector import Collector, Context, Environment
from llmmon.network.device_filter import DeviceFilter, filter_options
from llmmon.metrics import Families, MetricSpec
from llmmon.options import Option
from llmmon.sources.fs import SourceError
from llmmon.sources.netlink import IpJsonDump, LinkSource, Rtnetlink

DEFAULT_EXCLUDE = (r"^(lo|veth.*|cali.*|cilium.*|lxc.*|flannel.*|cni.*|docker.*|br-.*|"
                   r"virbr.*|vxlan.*|genev_sys_.*|tunl.*|kube-ipvs.*|nodelocaldns)$")
MBIT = 125_000  # bytes per second in a megabit per second


def _spec(name: str, kind: str, help_text: str) -> MetricSpec:
    return MetricSpec(name, kind, help_text, ("netdev",))


STATS: tuple[tuple[str, MetricSpec], ...] = (
    ("rx_bytes", _spec("llmmon_netdev_receive_bytes_total", "counter", "Bytes received.")),
    ("tx_bytes", _spec("llmmon_netdev_transmit_bytes_total", "counter", "Bytes sent.")),
    ("rx_packets", _spec("llmmon_netdev_receive_packets_total", "counter",
                         "Packets received.")),
    ("tx_packets", _spec("llmmon_netdev_transmit_packets_total", "counter", "Packets sent.")),
    ("rx_errors", _spec("llmmon_netdev_receive_errors_total", "counter",
                        "Bad packets received.")),
    ("tx_errors", _spec("llmmon_netdev_transmit_errors_total", "counter",
                        "Packets that failed to send.")),
    ("rx_dropped", _spec("llmmon_netdev_receive_drops_total", "counter",
                         "Received packets dropped by the kernel or driver.")),
    ("tx_dropped", _spec("llmmon_netdev_transmit_drops_total", "counter",
                         "Outbound packets dropped.")),
    ("rx_missed_errors", _spec("llmmon_netdev_receive_missed_total", "counter",
                               "Packets the NIC dropped for lack of receive buffers.")),
)
UP = _spec("llmmon_netdev_up", "gauge", "1 if the interface's operstate is up.")
CARRIER_CHANGES = _spec(
    "llmmon_netdev_carrier_changes_total", "counter",
    "Carrier up and down transitions (link flaps).")
SPEED = _spec(
    "llmmon_netdev_speed_bytes_per_second", "gauge",
    "Link speed (sysfs Mb/s x 125000); absent while the link is down or the speed unknown.")
MTU = _spec("llmmon_netdev_mtu_bytes", "gauge", "Interface MTU.")


class NetdevCollector(Collector):
    name = "netdev"
    description = ("Network interface traffic, errors and drops (rtnetlink) and link state, "
                   "speed and carrier changes (/sys/class/net).")
    specs = tuple(spec for _, spec in STATS) + (UP, CARRIER_CHANGES, SPEED, MTU)
    options = (
        Option("dump", "str", "",
               "Read link statistics from this `ip -s -s -j link show` capture instead of "
               "rtnetlink.", flag="--netlink.dump", metavar="FILE"),
    ) + filter_options("interfaces", DEFAULT_EXCLUDE,
                       "Interfaces to skip: loopback and container networking by default.")
    interval = 5.0
    timeout = 3.0

    def __init__(self, env: Environment, config: dict[str, Any]) -> None:
        super().__init__(env, config)
        self.wanted = DeviceFilter(config["device_include"], config["device_exclude"])
        self.source: LinkSource = IpJsonDump(config["dump"]) if config["dump"] else Rtnetlink()

    def collect(self, ctx: Context) -> Iterable[Metric]:
        families = Families()
        try:
            links = [link for link in self.source.links() if self.wanted(link.name)]
        except SourceError as exc:
            ctx.error("links", str(exc))
            links = []
        for link in links:
            if link.stats is None:
                ctx.error(link.name, f"{link.name}: no IFLA_STATS64 in the link message")
            else:
                for key, spec in STATS:
                    if key in link.stats:
                        families.add(spec, (link.name,), link.stats[key])
            self._sysfs(ctx, families, link.name)
        ctx.watching(len(links), "network interfaces")
        return families

    def _sysfs(self, ctx: Context, families: Families, netdev: str) -> None:
        sysfs = self.env.sysfs
        if not sysfs.exists("class/net", netdev):
            ctx.error(netdev, f"{netdev}: not in {sysfs.path('class/net')} (is --path.sysfs "
                      "from another network namespace?)")
            return
        labels = (netdev,)
        for spec, file in ((UP, "operstate"), (CARRIER_CHANGES, "carrier_changes"),
                           (MTU, "mtu")):
            try:
                text = sysfs.read_value("class/net", netdev, file)
                families.add(spec, labels, int(text == "up") if spec is UP else int(text))
            except SourceError as exc:
                ctx.error(f"{netdev}/{file}", str(exc))
            except ValueError:
                ctx.error(f"{netdev}/{file}", f"{netdev}/{file}: not a number: {text[:40]!r}")
        try:  # EINVAL while down, -1 when unknown: absent, not an error
            speed = sysfs.read_int("class/net", netdev, "speed")
        except SourceError:
            return
        if speed > 0:
            families.add(SPEED, labels, speed * MBIT)
