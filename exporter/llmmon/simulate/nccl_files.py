"""A simulated rank's NCCL side: its environment and the log NCCL_DEBUG=INFO writes.

The healthy job is tuned as the seed's checklist asks on a RoCE node: every rail in
NCCL_IB_HCA, the RoCE v2 GID index, the management interface for sockets, four QPs per
connection split across them; NCCL picks `NET/IB` with GPUDirect RDMA.  The log lines follow
NCCL 2.21's format (host:pid:tid [device] NCCL INFO ...), as the fixtures of real logs in
`tests/fixtures/nccl/logs/` show them, so the daemon's parser reads both alike.  The scenarios
bend this through `NcclCondition`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmmon.simulate.hardware import NodeLayout

VERSION = "2.21.5+cuda12.4"
DEBUG_FILE = "/tmp/nccl.%h.%p.log"
ROCE_V2_IPV4_GID = 3  # gids/3: the IPv4-mapped RoCE v2 entry (sysfs_files writes the table)


@dataclass
class NcclCondition:
    """What the job's NCCL looks like on this node this tick."""

    env: dict[str, str | None] = field(default_factory=dict)  # overrides; None unsets
    net: str = "IB"  # what NCCL chose: IB, or Socket when it fell back
    gdr: bool = True  # GPUDirect RDMA on the network channels
    version: str = VERSION


def environment(layout: NodeLayout, pod: str, cond: NcclCondition) -> dict[str, str]:
    """The rank's NCCL variables, tuned, with the scenario's overrides."""
    env: dict[str, str | None] = {
        "HOSTNAME": pod,
        "NCCL_IB_HCA": "=" + ",".join(f"{nic.device}:1" for nic in layout.nics),
        "NCCL_IB_GID_INDEX": str(ROCE_V2_IPV4_GID),
        "NCCL_SOCKET_IFNAME": layout.management_netdev,
        "NCCL_IB_QPS_PER_CONNECTION": "4",
        "NCCL_IB_SPLIT_DATA_ON_QPS": "1",
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,ENV",
        "NCCL_DEBUG_FILE": DEBUG_FILE,
        **cond.env}
    return {k: v for k, v in env.items() if v is not None}


def environ_bytes(env: dict[str, str]) -> bytes:
    """/proc/<pid>/environ's form: NUL-terminated NAME=value entries."""
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())


def log_path(pod: str, pid: int) -> str:
    """Where NCCL writes the rank's log: DEBUG_FILE with %h and %p expanded."""
    return DEBUG_FILE.replace("%h", pod).replace("%p", str(pid))


def log(layout: NodeLayout, pod: str, pid: int, local_rank: int, rank: int, world: int,
        nodes: int, cond: NcclCondition, unbound: frozenset[int] = frozenset()) -> str:
    """The rank's NCCL log after its communicator started: a ring through the node's GPUs
    over P2P, and, when the job spans nodes, one channel per GPU to the next node over the
    network (each GPU's own rail)."""
    head = f"{pod}:{pid}:{pid} [{local_rank}] NCCL INFO "
    init = f"{pod}:{pid}:{pid + 100} [{local_rank}] NCCL INFO "
    lines = [head + "Bootstrap : Using " + f"{layout.management_netdev}:10.0.{layout.index}.10<0>",
             f"NCCL version {cond.version}"]  # printed bare, as in the fixtures
    if cond.net == "IB":
        nics = [nic for nic in layout.nics if nic.index not in unbound]
        used = " ".join(f"[{i}]{nic.device}:1/RoCE" for i, nic in enumerate(nics))
        lines.append(init + f"NET/IB : Using {used} [RO]; OOB "
                     f"{layout.management_netdev}:10.0.{layout.index}.10<0>")
    else:
        lines.append(init + f"NET/Socket : Using [0]{layout.management_netdev}:"
                     f"10.0.{layout.index}.10<0>")
    lines.append(init + f"Using network {cond.net}")
    per_node = len(layout.gpus)
    nxt = (local_rank + 1) % per_node
    lines.append(init + f"Channel 00/0 : {rank}[{local_rank}] -> "
                 f"{rank - local_rank + nxt}[{nxt}] via P2P/IPC")
    if nodes > 1:  # channel c leaves the node at GPU c, on its own rail
        peer = (rank + per_node) % world
        suffix = "/GDRDMA" if cond.gdr and cond.net == "IB" else ""
        lines.append(init + f"Channel {local_rank:02d}/0 : {rank}[{local_rank}] -> "
                     f"{peer}[{local_rank}] [send] via NET/{cond.net}/{local_rank}{suffix}")
    lines.append(init + f"comm 0x55d0c0a0 rank {rank} nranks {world} cudaDev {local_rank} "
                 "busId 0 - Init COMPLETE")
    return "\n".join(lines) + "\n"
