"""The NCCL checklist over sysfs trees of a RoCE node, an InfiniBand node and a node with a
port down (tests/fixtures/roce), read through the real readers, with a near miss per check."""

from __future__ import annotations

import dataclasses

import shutil
from pathlib import Path

import pytest

from llmmon.network import nccl_checks
from llmmon.network.nccl_checks import CHECKS, NodeFacts, check, read_node
from llmmon.network.nccl_log import NcclLog
from llmmon.network.nccl_settings import NcclSettings
from llmmon.sources import infiniband, netclass
from llmmon.sources.fs import RootedFS, SourceError
from tests.conftest import FIXTURES

TREES = FIXTURES / "roce"
GPUS = ("GPU-a", "GPU-b")
PLACED = {"GPU-a": "PIX", "GPU-b": "PIX"}
# A job configured as the checklist asks, on the RoCE node: no finding.
GOOD = {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_IB_GID_INDEX": "3",
        "NCCL_SOCKET_IFNAME": "=eno1", "NCCL_IB_QPS_PER_CONNECTION": "4",
        "NCCL_IB_SPLIT_DATA_ON_QPS": "1"}


def log(net: str = "IB", version: str = "2.21.5", gdr: bool | None = True) -> NcclLog:
    return NcclLog(version, net, ("mlx5_0:1/RoCE", "mlx5_1:1/RoCE") if net == "IB"
                   else ("eno1:10.1.0.5<0>",), gdr, frozenset({"NET/IB/GDRDMA"}), 40)


def node(tree: str | Path, placed: dict[str, str] | None = None, gpus: int = 8) -> NodeFacts:
    root = TREES / tree if isinstance(tree, str) else tree
    return read_node(RootedFS(str(root / "sys")), RootedFS(str(root / "proc")),
                     PLACED if placed is None else placed, gpus)


def run(env: dict[str, str], facts: NodeFacts | str = "roce", gpus=GPUS,
        nccl: NcclLog | None = None, multi_node: bool = True, **changes: str):
    facts = node(facts) if isinstance(facts, str) else facts
    settings = NcclSettings.from_env({**env, **changes})
    return check(settings, facts, gpus, log() if nccl is None else nccl, multi_node)


def found(env: dict[str, str], *args, **kwargs) -> dict[str, str]:
    """check -> evidence of each finding."""
    return {f.check: f.evidence for f in run(env, *args, **kwargs)[1]}


@pytest.fixture
def tree(tmp_path: Path):
    """A writable copy of one node's tree."""
    def copy(name: str) -> Path:
        shutil.copytree(TREES / name, tmp_path / name, symlinks=True)
        return tmp_path / name
    return copy


# -- the readers --

def test_gid_table_of_a_roce_port() -> None:
    sysfs = RootedFS(str(TREES / "roce" / "sys"))
    table = infiniband.gids(sysfs, "mlx5_0", "1")
    assert [(g.index, g.type) for g in table] == [
        (0, "IB/RoCE v1"), (1, "RoCE v2"), (2, "IB/RoCE v1"), (3, "RoCE v2")]
    assert table[3].address == "0000:0000:0000:0000:0000:ffff:0a00:000b"
    assert table[3].ipv4_mapped and not table[3].link_local
    assert table[1].link_local and not table[1].ipv4_mapped
    assert infiniband.link_layer(sysfs, "mlx5_0", "1") == "Ethernet"
    assert infiniband.port_state(sysfs, "mlx5_0", "1") == infiniband.ACTIVE
    ib = RootedFS(str(TREES / "ib" / "sys"))
    assert infiniband.link_layer(ib, "mlx5_1", "1") == "InfiniBand"
    assert [g.type for g in infiniband.gids(ib, "mlx5_1", "1")] == ["IB/RoCE v1"]


def test_gid_reader_survives_einval_and_is_bounded(tree, monkeypatch) -> None:
    sysfs = RootedFS(str(tree("roce") / "sys"))
    real = RootedFS.read_value

    def einval(self, *parts: str) -> str:
        if parts[-2:] == ("types", "3"):
            raise SourceError("types/3: Invalid argument")
        return real(self, *parts)

    monkeypatch.setattr(RootedFS, "read_value", einval)
    assert infiniband.gids(sysfs, "mlx5_0", "1")[3].type == ""
    monkeypatch.setattr(infiniband, "MAX_GIDS", 2)
    assert [g.index for g in infiniband.gids(sysfs, "mlx5_0", "1")] == [0, 1]


def test_interfaces_up() -> None:
    sysfs = RootedFS(str(TREES / "roce" / "sys"))
    assert netclass.interfaces(sysfs) == ["docker0", "eno1", "ens1f0np0", "ens1f1np1", "lo"]
    assert netclass.is_up(sysfs, "lo")  # operstate unknown, IFF_UP set
    assert not netclass.is_up(sysfs, "docker0")
    assert not netclass.is_up(sysfs, "missing0")


def test_node_facts() -> None:
    roce, ib, down = node("roce"), node("ib"), node("portdown")
    assert [(p.name, p.active, p.link_layer, p.netdev) for p in roce.ports] == [
        ("mlx5_0:1", True, "Ethernet", "ens1f0np0"), ("mlx5_1:1", True, "Ethernet", "ens1f1np1")]
    assert roce.gpudirect and not ib.gpudirect
    assert roce.netdevs_up == {"eno1", "ens1f0np0", "ens1f1np1", "lo"}
    assert [p.gids for p in ib.ports] == [(), ()]  # GIDs matter on RoCE only
    assert [(p.name, p.active, p.gids) for p in down.ports][1] == ("mlx5_1:1", False, ())
    assert "ens1f1np1" in down.netdevs - down.netdevs_up


def test_dmabuf_counts_as_gpudirect(tree) -> None:
    root = tree("ib")
    (root / "proc/sys/kernel/osrelease").write_text("6.8.0-45-generic\n")
    (root / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.90.07\n")
    assert node(root).gpudirect


# -- which checks apply --

def test_a_well_configured_job_passes_every_check() -> None:
    applied, findings = run(GOOD)
    assert applied == CHECKS
    assert findings == []


def test_single_node_jobs_get_only_the_local_checks() -> None:
    applied, findings = run(GOOD, multi_node=False, NCCL_SOCKET_IFNAME="eth9")
    assert applied == ("p2p_disabled", "shm_disabled") and findings == []
    assert run(GOOD, multi_node=False, gpus=("GPU-a",))[0] == ()
    assert run(GOOD, multi_node=False, gpus=("GPU-a", "GPU-a"))[0] == ()  # one GPU twice


def test_a_node_without_rdma_gets_no_rdma_checks(tmp_path: Path) -> None:
    (tmp_path / "sys/class").mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    facts = node(tmp_path)
    assert run({}, facts)[0] == ("socket_ifname_down", "p2p_disabled", "shm_disabled")
    assert run({}, facts, NCCL_IB_DISABLE="1", NCCL_IB_GID_INDEX="2")[1] == []


def test_infiniband_gets_no_gid_checks() -> None:
    applied, _ = run(GOOD, "ib", NCCL_IB_GID_INDEX="")
    assert "gid_index_unset" not in applied and "gid_index_not_rocev2" not in applied
    assert "single_qp_multi_rail" in applied


def test_without_a_log_the_transport_is_not_judged() -> None:
    facts = node("roce")
    applied, _ = check(NcclSettings.from_env(GOOD), facts, GPUS, None, True)
    assert "transport_socket" not in applied and "ib_disabled" in applied
    applied, _ = check(NcclSettings.from_env(GOOD), facts, GPUS, log(net=""), True)
    assert "transport_socket" not in applied


# -- each check and its near miss --

def test_transport_socket() -> None:
    evidence = found(GOOD, nccl=log(net="Socket"))["transport_socket"]
    assert "NET/Socket (eno1:10.1.0.5<0>)" in evidence and "mlx5_0:1, mlx5_1:1" in evidence
    assert "2.21.5" in evidence
    assert "transport_socket" not in found(GOOD, nccl=log(net="IB"))
    assert "transport_socket" not in found(GOOD, nccl=log(net="AWS Libfabric"))


def test_ib_disabled() -> None:
    assert "NCCL_IB_DISABLE=1" in found(GOOD, NCCL_IB_DISABLE="1")["ib_disabled"]
    assert "NCCL_NET=Socket" in found(GOOD, NCCL_NET="Socket")["ib_disabled"]
    for near in ("0", "", "abc", "0x0"):
        assert "ib_disabled" not in found(GOOD, NCCL_IB_DISABLE=near)
    assert "ib_disabled" not in found(GOOD, NCCL_NET="IB")
    # With IB off, how NCCL would use the ports is moot: one finding, not five.
    applied, findings = run({}, NCCL_IB_DISABLE="1")
    assert "gid_index_unset" not in applied and "ib_hca_unknown" not in applied
    assert "ib_disabled" in {f.check for f in findings}


def test_ib_hca_unknown() -> None:
    assert "mlx5_9 does not exist" in found(GOOD, NCCL_IB_HCA="mlx5_0:1,mlx5_1:1,mlx5_9")[
        "ib_hca_unknown"]
    assert "mlx5_0:2 does not exist" in found(GOOD, NCCL_IB_HCA="mlx5_0:2,mlx5_1:1")[
        "ib_hca_unknown"]
    down = found(GOOD, "portdown", NCCL_IB_HCA="=mlx5_0:1,mlx5_1:1")["ib_hca_unknown"]
    assert "mlx5_1:1 is not ACTIVE" in down and "mlx5_0" not in down.split(":", 1)[1][6:]
    assert "no ACTIVE port" in found(GOOD, NCCL_IB_HCA="^mlx5")["ib_hca_unknown"]
    # '=' applies to the whole list: a second one is part of the name.
    assert "=mlx5_1 does not exist" in found(GOOD, NCCL_IB_HCA="=mlx5_0,=mlx5_1")[
        "ib_hca_unknown"]
    for near in ("mlx5", "=mlx5_0,mlx5_1", "^mlx5_3", "^=mlx5_9", "mlx5_0:1,mlx5_1:1", ""):
        assert "ib_hca_unknown" not in found(GOOD, NCCL_IB_HCA=near), near


def test_ib_hca_missing_rail() -> None:
    evidence = found(GOOD, NCCL_IB_HCA="=mlx5_0")["ib_hca_missing_rail"]
    assert evidence.endswith("leaves ACTIVE rails out: mlx5_1:1")
    fix = {f.check: f.fix for f in run(GOOD, NCCL_IB_HCA="=mlx5_0")[1]}
    assert fix["ib_hca_missing_rail"] == "list every rail: NCCL_IB_HCA==mlx5_0:1,mlx5_1:1"
    assert "ib_hca_missing_rail" in found(GOOD, NCCL_IB_HCA="mlx5_0:1")
    # Deliberate exclusions, a rail that is down, and every rail listed are not findings.
    assert "ib_hca_missing_rail" not in found(GOOD, NCCL_IB_HCA="^mlx5_1")
    assert "ib_hca_missing_rail" not in found(GOOD, "portdown", NCCL_IB_HCA="=mlx5_0")
    assert "ib_hca_missing_rail" not in found(GOOD, NCCL_IB_HCA="mlx5_0:1,mlx5_1")
    assert "ib_hca_missing_rail" not in found(GOOD, NCCL_IB_HCA="")


def test_gid_index_pointing_at_the_wrong_entry() -> None:
    assert "gid_index_not_rocev2" not in found(GOOD, NCCL_IB_GID_INDEX="3")
    v1 = found(GOOD, NCCL_IB_GID_INDEX="2")["gid_index_not_rocev2"]
    assert "mlx5_0:1 GID 2 is IB/RoCE v1" in v1 and "mlx5_1:1 GID 2 is IB/RoCE v1" in v1
    assert "link-local" in found(GOOD, NCCL_IB_GID_INDEX="1")["gid_index_not_rocev2"]
    assert "unused (no address)" in found(GOOD, NCCL_IB_GID_INDEX="7")["gid_index_not_rocev2"]
    assert "GID 0 is IB/RoCE v1" in found(GOOD, NCCL_IB_GID_INDEX="abc")[
        "gid_index_not_rocev2"]  # strtoll: 0
    fix = {f.check: f.fix for f in run(GOOD, NCCL_IB_GID_INDEX="2")[1]}
    assert fix["gid_index_not_rocev2"].startswith("set NCCL_IB_GID_INDEX=3,")
    # Only the ports NCCL uses are judged.
    assert "gid_index_not_rocev2" not in found(GOOD, "portdown", NCCL_IB_HCA="=mlx5_0")


def test_gid_index_on_a_port_without_an_address(tree) -> None:
    root = tree("roce")
    gids = root / "sys/class/infiniband/mlx5_1/ports/1"
    (gids / "gids/3").write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
    (gids / "gid_attrs/types/3").write_text("")
    findings = run(GOOD, node(root))[1]
    assert [(f.check, f.evidence) for f in findings] == [
        ("gid_index_not_rocev2", "NCCL_IB_GID_INDEX=3: mlx5_1:1 GID 3 is unused (no address)")]
    assert "mlx5_0:1 3, mlx5_1:1 none" in findings[0].fix


def test_gid_index_unset_depends_on_the_nccl_version(tree) -> None:
    unset = {**GOOD, "NCCL_IB_GID_INDEX": ""}
    old = found(unset, nccl=log(version="2.18.3"))["gid_index_unset"]
    assert "NCCL 2.18.3 uses GID 0" in old and "GID 0 is IB/RoCE v1" in old
    # 2.21 and later choose the RoCE v2 IPv4 entry themselves (3 here): nothing to fix.
    assert "gid_index_unset" not in found(unset, nccl=log(version="2.21.5"))
    assert "gid_index_unset" not in found(unset, nccl=log(version="2.27.3"))
    # The version unknown: 2.21 and later would choose well, so no finding on a healthy port
    assert "gid_index_unset" not in found(unset, nccl=log(version=""))
    assert "gid_index_unset" not in found(GOOD, nccl=log(version="2.18.3"))
    assert "gid_index_unset" in found({**GOOD, "NCCL_IB_GID_INDEX": "-1"},
                                      nccl=log(version="2.18.3"))
    # Without an IPv4 address the newer choice lands on a RoCE v1 entry.
    root = tree("roce")
    port = root / "sys/class/infiniband/mlx5_1/ports/1"
    for slot in ("2", "3"):
        (port / "gids" / slot).write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
        (port / "gid_attrs/types" / slot).write_text("")
    new = found(unset, node(root), nccl=log(version="2.21.5"))["gid_index_unset"]
    assert "picks the GID itself and lands on mlx5_1:1 GID 0 is IB/RoCE v1" in new
    # ...and GID 0 is wrong too: wrong whichever NCCL runs, a finding without the version
    unknown = found(unset, node(root), nccl=log(version=""))["gid_index_unset"]
    assert "version is unknown, and both would be wrong" in unknown


def test_gid_auto_selection_follows_family_and_version() -> None:
    facts = node("roce")
    job = nccl_checks._Job(NcclSettings(), facts, GPUS, None, True)
    assert [job._auto_gid(p) for p in facts.ports] == [3, 3]
    v1 = nccl_checks._Job(NcclSettings(ib_roce_version_num="1"), facts, GPUS, None, True)
    assert v1._auto_gid(facts.ports[0]) == 2
    ranged = nccl_checks._Job(NcclSettings(ib_addr_range="10.0.1.0/24"), facts, GPUS, None,
                              True)
    assert [ranged._auto_gid(p) for p in facts.ports] == [0, 3]
    six = nccl_checks._Job(NcclSettings(ib_addr_family="AF_INET6"), facts, GPUS, None, True)
    assert six._auto_gid(facts.ports[0]) == 0  # no routable IPv6 entry: GID 0 stays


def test_socket_ifname_down() -> None:
    evidence = found(GOOD, NCCL_SOCKET_IFNAME="docker")["socket_ifname_down"]
    assert evidence == "NCCL_SOCKET_IFNAME=docker matches no interface that is up (down: docker0)"
    assert "socket_ifname_down" in found(GOOD, NCCL_SOCKET_IFNAME="eth0")
    assert "socket_ifname_down" in found(GOOD, NCCL_SOCKET_IFNAME="=eno")  # exact
    assert "ens1f1np1" in found(GOOD, "portdown", NCCL_SOCKET_IFNAME="=ens1f1np1")[
        "socket_ifname_down"]
    for near in ("eno", "^docker,lo", "=eno1", "e", "", "=ens1f1np1,eno1"):
        assert "socket_ifname_down" not in found(GOOD, NCCL_SOCKET_IFNAME=near), near


def test_gdr_unavailable() -> None:
    assert "no nvidia_peermem" in found(GOOD, "ib", nccl=log(gdr=None))["gdr_unavailable"]
    assert "gdr_unavailable" in found(GOOD, "ib", nccl=log(gdr=False))
    assert "gdr_unavailable" not in found(GOOD, "ib", nccl=log(gdr=True))  # NCCL says it is on
    assert "gdr_unavailable" not in found(GOOD, "roce", nccl=log(gdr=None))
    assert "gdr_unavailable" not in run(GOOD, node("ib", gpus=0))[0]


@pytest.mark.parametrize("level, path, blocked", [
    ("PIX", "PXB", True), ("1", "PXB", True), ("LOC", "PIX", True), ("PXB", "NODE", True),
    ("PXB", "PXB", False), ("2", "PXB", False), ("PHB", "NODE", False), ("SYS", "SYS", False),
    ("NODE", "SYS", False),  # NCCL ignores a name it does not know
    ("", "SYS", False),
])
def test_gdr_level_blocks(level: str, path: str, blocked: bool) -> None:
    facts = node("roce", {"GPU-a": path, "GPU-b": "PIX", "GPU-z": "SYS"})
    evidence = found(GOOD, facts, NCCL_NET_GDR_LEVEL=level).get("gdr_level_blocks", "")
    assert bool(evidence) == blocked
    if blocked:
        assert f"GPU-a ({path})" in evidence and "GPU-z" not in evidence


def test_p2p_and_shm_disabled() -> None:
    assert "NCCL_P2P_DISABLE=1 with 2" in found(GOOD, NCCL_P2P_DISABLE="1")["p2p_disabled"]
    assert "p2p_disabled" in found(GOOD, NCCL_P2P_DISABLE="0x1")
    assert "NCCL_P2P_LEVEL=LOC" in found(GOOD, NCCL_P2P_LEVEL="LOC")["p2p_disabled"]
    assert "p2p_disabled" not in found(GOOD, NCCL_P2P_DISABLE="0")
    assert "p2p_disabled" not in found(GOOD, NCCL_P2P_LEVEL="NVL")
    assert "p2p_disabled" not in run(GOOD, gpus=("GPU-a",), NCCL_P2P_DISABLE="1")[0]
    assert "shm_disabled" in found(GOOD, NCCL_SHM_DISABLE="1")
    assert "shm_disabled" not in found(GOOD, NCCL_SHM_DISABLE="2")  # NCCL tests == 1
    assert "shm_disabled" in found(GOOD, multi_node=False, NCCL_SHM_DISABLE="1")


def test_a_port_that_is_no_gpu_s_nearest_nic_is_no_missing_rail() -> None:
    """A front-end or storage NIC of the training NICs' link layer, left out of NCCL_IB_HCA on
    purpose: where the topology names the GPUs' nearest NICs, only those are rails."""
    facts = node("roce")
    assert "ib_hca_missing_rail" in found(GOOD, facts, NCCL_IB_HCA="=mlx5_1:1")
    known = dataclasses.replace(facts, rail_devices=frozenset({"mlx5_1"}))
    assert "ib_hca_missing_rail" not in found(GOOD, known, NCCL_IB_HCA="=mlx5_1:1")
    both = dataclasses.replace(facts, rail_devices=frozenset({"mlx5_0", "mlx5_1"}))
    assert "ib_hca_missing_rail" in found(GOOD, both, NCCL_IB_HCA="=mlx5_1:1")


def test_single_qp_multi_rail() -> None:
    unset = found({**GOOD, "NCCL_IB_QPS_PER_CONNECTION": ""})["single_qp_multi_rail"]
    assert unset.startswith("NCCL_IB_QPS_PER_CONNECTION unset (NCCL's default 1) with 2 ACTIVE "
                            "RoCE")
    assert "single_qp_multi_rail" in found(GOOD, NCCL_IB_QPS_PER_CONNECTION="1")
    # InfiniBand spreads flows itself (adaptive routing): one QP is NCCL's default there
    assert "single_qp_multi_rail" not in found(GOOD, "ib", NCCL_IB_HCA="",
                                               NCCL_IB_QPS_PER_CONNECTION="0")
    # a net plugin (EFA's, an IBext) has its own queue pairs
    assert "single_qp_multi_rail" not in found(GOOD, NCCL_IB_QPS_PER_CONNECTION="1",
                                               nccl=log(net="AWS Libfabric"))
    assert "single_qp_multi_rail" not in found(GOOD, NCCL_IB_QPS_PER_CONNECTION="2")
    assert "single_qp_multi_rail" not in found(GOOD, NCCL_IB_HCA="=mlx5_0",
                                               NCCL_IB_QPS_PER_CONNECTION="1")
    assert "single_qp_multi_rail" not in found(GOOD, "portdown", NCCL_IB_HCA="",
                                               NCCL_IB_QPS_PER_CONNECTION="")


def test_gpu_nic_cross_socket() -> None:
    facts = node("roce", {"GPU-a": "SYS", "GPU-b": "NODE", "GPU-other": "SYS"})
    evidence = found(GOOD, facts)["gpu_nic_cross_socket"]
    assert evidence.endswith("(SYS): GPU-a")  # not the other job's GPU, not NODE
    assert "gpu_nic_cross_socket" not in found(GOOD, facts, gpus=("GPU-b",))
    assert "gpu_nic_cross_socket" not in run(GOOD, facts, gpus=("GPU-unplaced",))[0]


def test_hostile_environment_never_crashes() -> None:
    env = {name: value for name, value in (
        ("NCCL_IB_HCA", "^=" + ",".join(["\x1b[31m:99"] * 500)),
        ("NCCL_IB_GID_INDEX", "9" * 5000), ("NCCL_SOCKET_IFNAME", "\n" * 3000),
        ("NCCL_NET_GDR_LEVEL", "\x00"), ("NCCL_IB_QPS_PER_CONNECTION", "-" * 40),
        ("NCCL_P2P_LEVEL", "٣"), ("NCCL_IB_ADDR_RANGE", "10.0.0.0/99"),
        ("NCCL_IB_ADDR_FAMILY", "AF_INET6\n"), ("NCCL_IB_ROCE_VERSION_NUM", "x"))}
    for tree in ("roce", "ib", "portdown"):
        applied, findings = run(env, tree, nccl=log(version="9" * 300, net="Socket"))
        for f in findings:
            assert f.check in applied
            assert "\n" not in f.evidence and len(f.evidence) <= nccl_checks.MAX_EVIDENCE
            assert "\x1b" not in f.evidence
