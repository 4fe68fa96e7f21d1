"""The network checklist's NCCL checks over expositions as the daemon writes them (the real parser,
the real checks, the tree's runbook links): the ranks' chosen transport, and each job's NCCL
settings against its node (the nccl collector's three families, docs/network.md). Each check:
suspect, ok, unknown and a near miss."""

from __future__ import annotations

from llmmon.diagnose.branches import TREE
from llmmon.diagnose.branches import network
from llmmon.diagnose.model import Outcome
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.tree import NEEDS_RATES, evaluate
from llmmon.diagnose.window import LocalView, Window
from llmmon.network.nccl_checks import CHECKS

RUNBOOKS = Thresholds().runbook_base_url
# llama: two ranks here of a world of four (it spans nodes); solo: one rank of one
RANKS = """\
# TYPE llmmon_rank_info gauge
llmmon_rank_info{job_id="llama",local_rank="0",namespace="ml",pid="4101",pod="llama-0",rank="0",source="reporter",uuid="GPU-a0",world_size="4"} 1.0
llmmon_rank_info{job_id="llama",local_rank="1",namespace="ml",pid="4102",pod="llama-0",rank="1",source="reporter",uuid="GPU-a1",world_size="4"} 1.0
llmmon_rank_info{job_id="solo",local_rank="0",namespace="ml",pid="4201",pod="solo-0",rank="0",source="reporter",uuid="GPU-a2",world_size="1"} 1.0
"""
PORTS = """\
# TYPE llmmon_rdma_port_info gauge
llmmon_rdma_port_info{board_id="MT_0000000838",device="mlx5_0",firmware_version="28.39.1002",hca_type="MT4129",link_layer="Ethernet",netdev="ens1f0np0",numa_node="0",pci_bus_id="0000:17:00.0",port="1"} 1.0
llmmon_rdma_port_info{board_id="MT_0000000838",device="mlx5_1",firmware_version="28.39.1002",hca_type="MT4129",link_layer="Ethernet",netdev="ens1f1np1",numa_node="0",pci_bus_id="0000:17:00.1",port="1"} 1.0
"""
CHECKED = ("transport_socket,ib_disabled,ib_hca_unknown,ib_hca_missing_rail,gid_index_unset,"
           "gid_index_not_rocev2,socket_ifname_down,gdr_unavailable,gdr_level_blocks,"
           "p2p_disabled,shm_disabled,single_qp_multi_rail,gpu_nic_cross_socket")


def transport(job: str, ranks: str, net: str, gdr: str = "", version: str = "2.21.5") -> str:
    devices = "mlx5_0:1/RoCE,mlx5_1:1/RoCE" if net == "IB" else "ens2f0:10.0.0.1<0>"
    paths = "NET/IB/GDRDMA,P2P/IPC" if gdr == "1" else f"NET/{net},P2P/IPC"
    return (f'llmmon_job_nccl_transport_info{{devices="{devices}",gdr="{gdr}",job_id="{job}",'
            f'net="{net}",paths="{paths}",ranks="{ranks}",version="{version}"}} 1.0\n')


def settings(job: str, checked: str = CHECKED, **values: str) -> str:
    names = ("algo", "checked", "ib_disable", "ib_gid_index", "ib_hca", "ib_qps_per_connection",
             "net", "net_gdr_level", "p2p_disable", "proto", "shm_disable", "socket_ifname")
    labels = {name: "" for name in names} | {"checked": checked} | values
    text = ",".join(f'{name}="{labels[name]}"' for name in names)
    return f'llmmon_job_nccl_settings_info{{{text},job_id="{job}"}} 1.0\n'


def findings(job: str, *checks: str) -> str:
    return "".join(f'llmmon_job_nccl_misconfigured{{check="{check}",job_id="{job}"}} 1.0\n'
                   for check in checks)


def view(*texts: str) -> LocalView:
    """One observation per text, 10 s apart, as the daemon keeps them."""
    window = Window(span=60)
    for at, text in enumerate(texts):
        window.add(text, at=1000.0 + 10 * at)
    return LocalView(window.observations(), "daemon", "http://node-a:9435", Thresholds())


def texts(found: Outcome) -> list[str]:
    return [e.text for e in found.evidence]


def report_check(one: LocalView, check_id: str) -> dict:
    """The check as the report gives it: verdict, alerts and the runbook the tree links."""
    report = evaluate(one, Thresholds(), TREE).as_json()
    branch = next(b for b in report["branches"] if b["id"] == "network")
    return next(c for c in branch["checks"] if c["id"] == check_id)


# -- transport ------------------------------------------------------------------------------------
def test_ranks_of_a_multi_node_job_on_sockets_beside_rdma_ports_are_suspect() -> None:
    found = network.rdma_in_use(view(RANKS + PORTS + transport("llama", "0-1", "Socket")),
                                Thresholds())
    assert found.verdict == "suspect" and found.alert == "NCCLNotUsingRDMA"
    assert texts(found) == ["job llama: ranks 0-1 use NET/Socket (NCCL 2.21.5): TCP although "
                            "the node has RDMA ports"]
    assert found.evidence[0].values == {"ranks": 2}
    assert found.summary.startswith("NCCL runs over TCP sockets on a multi-node job")


def test_ranks_on_ib_are_ok_from_one_observation() -> None:
    found = network.rdma_in_use(view(RANKS + PORTS + transport("llama", "0-1", "IB", "1")),
                                Thresholds())
    assert found.verdict == "ok", found
    assert texts(found) == [
        "job llama: ranks 0-1 use NET/IB (NCCL 2.21.5) on mlx5_0:1/RoCE,mlx5_1:1/RoCE, with "
        "GPUDirect RDMA", f"traffic not judged: {NEEDS_RATES}"]


def test_without_logs_or_rates_the_transport_is_unknown() -> None:
    found = network.rdma_in_use(view(RANKS + PORTS), Thresholds())
    assert found.verdict == "unknown" and found.summary == NEEDS_RATES


def test_sockets_of_a_single_node_job_or_on_a_node_without_rdma_ports_are_fine() -> None:
    solo = network.rdma_in_use(view(RANKS + PORTS + transport("solo", "0", "Socket")),
                               Thresholds())
    assert solo.verdict == "ok"
    assert texts(solo)[0] == ("job solo: rank 0 use NET/Socket (NCCL 2.21.5): a single-node "
                              "job, nothing crosses the fabric")
    bare = network.rdma_in_use(view(RANKS + transport("llama", "0", "Socket")), Thresholds())
    assert bare.verdict == "ok"
    assert texts(bare)[0].endswith("use NET/Socket (NCCL 2.21.5): the node has no RDMA port")


def _traffic(rdma: float, tcp: float) -> str:
    return (f"""# TYPE llmmon_rdma_transmit_bytes_total counter
llmmon_rdma_transmit_bytes_total{{device="mlx5_0",port="1"}} {rdma}
# TYPE llmmon_rdma_receive_bytes_total counter
llmmon_rdma_receive_bytes_total{{device="mlx5_0",port="1"}} {rdma}
# TYPE llmmon_netdev_transmit_bytes_total counter
llmmon_netdev_transmit_bytes_total{{netdev="ens2f0"}} {tcp}
# TYPE llmmon_netdev_receive_bytes_total counter
llmmon_netdev_receive_bytes_total{{netdev="ens2f0"}} {tcp}
""")


def test_the_traffic_ratio_judges_only_jobs_without_transport_evidence() -> None:
    """RDMA idle, 400 MB/s over TCP: llama without a log is suspect by the ratio; with its
    ranks' logs saying IB the ratio is not judged for it (the alert's `unless`)."""
    before, after = _traffic(0, 0), _traffic(0, 2e9)
    blind = network.rdma_in_use(view(RANKS + PORTS + before, RANKS + PORTS + after),
                                Thresholds())
    assert blind.verdict == "suspect" and blind.alert == "NCCLNotUsingRDMA"
    assert "multi-node job(s) llama" in texts(blind)[0]
    logged = RANKS + PORTS + transport("llama", "0", "IB", "1")
    seen = network.rdma_in_use(view(logged + before, logged + after), Thresholds())
    assert seen.verdict == "ok", seen
    assert texts(seen)[1] == ("this node: RDMA 0 B/s, TCP 400 MB/s; not judged: the NCCL logs "
                              "of llama say which network")


def test_ib_disabled_in_the_settings_is_suspect_without_a_log() -> None:
    found = network.rdma_in_use(view(RANKS + PORTS + settings("llama", ib_disable="1")
                                     + findings("llama", "ib_disabled")), Thresholds())
    assert found.verdict == "suspect" and found.alert == "NCCLMisconfigured"
    assert texts(found) == ['job llama (NCCL_NET="", NCCL_IB_DISABLE="1"): ib_disabled: '
                            'NCCL_IB_DISABLE=1 keeps NCCL off the RDMA ports (fix: remove '
                            'NCCL_IB_DISABLE)']


# -- affinity -------------------------------------------------------------------------------------
NEAREST = """\
# TYPE llmmon_gpu_nearest_nic_info gauge
llmmon_gpu_nearest_nic_info{device="mlx5_0",gpu="0",netdev="ens1f0np0",path="PIX",uuid="GPU-a0"} 1.0
llmmon_gpu_nearest_nic_info{device="mlx5_0",gpu="1",netdev="ens1f0np0",path="SYS",uuid="GPU-a1"} 1.0
"""


def test_a_gpu_of_a_multi_node_job_across_sockets_is_a_misconfiguration() -> None:
    found = report_check(view(RANKS + NEAREST + settings("llama")
                              + findings("llama", "gpu_nic_cross_socket")), "gpu_nic_affinity")
    assert found["verdict"] == "suspect"
    assert found["runbook"] == f"{RUNBOOKS}#ncclmisconfigured"
    assert found["evidence"][0]["text"] == (
        "job llama: gpu_nic_cross_socket: a GPU of the job reaches its nearest NIC across CPU "
        "sockets (SYS) (fix: place the job on GPUs with a NIC on their PCIe switch)")
    assert found["evidence"][1]["text"].startswith("GPU 1: nearest NIC mlx5_0")


def test_affinity_without_a_finding_keeps_its_doc_and_verdict() -> None:
    """The machine's SYS GPU that no job's finding names: suspect as before, linked to
    docs/diagnose.md; no topology and no finding: unknown."""
    found = report_check(view(RANKS + NEAREST + settings("llama")), "gpu_nic_affinity")
    assert found["verdict"] == "suspect" and found["runbook"].endswith(
        "/docs/diagnose.md#gpu-nic-affinity")
    assert found["alerts"] == ["NCCLMisconfigured"]
    assert report_check(view(RANKS), "gpu_nic_affinity")["verdict"] == "unknown"
    solo = network.gpu_nic_affinity(
        view(RANKS + settings("solo") + findings("solo", "gpu_nic_cross_socket")), Thresholds())
    assert solo.verdict == "unknown"  # a single-node job's finding: no topology, not judged


# -- QPs and rails, GID index, socket interface, P2P and SHM ---------------------------------------
def test_rails_suspect_ok_unknown_and_single_node() -> None:
    bad = network.nccl_rails(view(RANKS + PORTS + settings(
        "llama", ib_hca="=mlx5_0", ib_qps_per_connection="1")
        + findings("llama", "single_qp_multi_rail", "ib_hca_missing_rail")), Thresholds())
    assert bad.verdict == "suspect" and bad.alert == "NCCLMisconfigured"
    assert texts(bad) == [
        'job llama (NCCL_IB_HCA="=mlx5_0", NCCL_IB_QPS_PER_CONNECTION="1"): ib_hca_missing_rail: '
        "NCCL_IB_HCA leaves out an active rail (fix: list every rail, or leave NCCL_IB_HCA "
        "unset); single_qp_multi_rail: one queue pair per connection on a node with several "
        "rails (fix: NCCL_IB_QPS_PER_CONNECTION=4 with NCCL_IB_SPLIT_DATA_ON_QPS=1)"]
    assert bad.evidence[0].values == {"findings": 2}
    good = network.nccl_rails(view(RANKS + PORTS + settings(
        "llama", ib_hca="mlx5", ib_qps_per_connection="4")), Thresholds())
    assert good.verdict == "ok"
    assert texts(good) == ['job llama (NCCL_IB_HCA="mlx5", NCCL_IB_QPS_PER_CONNECTION="4"): '
                           "passes ib_hca_unknown, ib_hca_missing_rail, single_qp_multi_rail"]
    none = network.nccl_rails(view(RANKS + PORTS), Thresholds())
    assert none.verdict == "unknown" and none.summary == network.NO_SETTINGS
    solo = network.nccl_rails(view(RANKS + PORTS + settings("solo", ib_hca="=mlx5_9")
                                   + findings("solo", "ib_hca_unknown")), Thresholds())
    assert solo.verdict == "ok" and solo.summary.startswith("only single-node jobs fail")
    assert texts(solo)[0].endswith("(a single-node job: not judged)")


def test_gid_index_suspect_ok_not_applicable_and_a_finding_of_another_check() -> None:
    unset = network.nccl_gid_index(view(RANKS + PORTS + settings("llama")
                                        + findings("llama", "gid_index_unset")), Thresholds())
    assert unset.verdict == "suspect"
    assert texts(unset) == ['job llama (NCCL_IB_GID_INDEX=""): gid_index_unset: '
                            "NCCL_IB_GID_INDEX is unset on RoCE ports (fix: set it to the RoCE "
                            "v2 GID with the node's address (show_gids; usually 3))"]
    three = network.nccl_gid_index(view(RANKS + PORTS + settings("llama", ib_gid_index="3")),
                                   Thresholds())
    assert three.verdict == "ok" and texts(three) == [
        'job llama (NCCL_IB_GID_INDEX="3"): passes gid_index_unset, gid_index_not_rocev2']
    # InfiniBand ports: the collector applies no GID check
    infiniband = network.nccl_gid_index(
        view(RANKS + settings("llama", checked="ib_hca_unknown,ib_hca_missing_rail")),
        Thresholds())
    assert infiniband.verdict == "unknown"
    assert infiniband.summary.startswith("no GID check applied: the RDMA ports are not RoCE")
    # near miss: another check fails (socket interface), the GID check passes
    other = network.nccl_gid_index(view(RANKS + PORTS + settings("llama", ib_gid_index="3")
                                        + findings("llama", "socket_ifname_down")), Thresholds())
    assert other.verdict == "ok"


def test_socket_interface() -> None:
    down = network.nccl_socket_ifname(view(RANKS + settings("llama", socket_ifname="=eth9")
                                           + findings("llama", "socket_ifname_down")),
                                      Thresholds())
    assert down.verdict == "suspect" and texts(down)[0].startswith(
        'job llama (NCCL_SOCKET_IFNAME="=eth9"): socket_ifname_down: NCCL_SOCKET_IFNAME matches '
        "no interface that is up")
    up = network.nccl_socket_ifname(view(RANKS + settings("llama", socket_ifname="ens")),
                                    Thresholds())
    assert up.verdict == "ok"
    unset = network.nccl_socket_ifname(view(RANKS + settings("llama", checked="gid_index_unset")),
                                       Thresholds())
    assert unset.verdict == "unknown" and "unset for every job" in unset.summary
    assert network.nccl_socket_ifname(view(RANKS), Thresholds()).verdict == "unknown"


def test_p2p_and_shm() -> None:
    off = network.nccl_p2p_shm(view(RANKS + settings("llama", p2p_disable="1")
                                    + findings("llama", "p2p_disabled")), Thresholds())
    assert off.verdict == "suspect" and texts(off)[0].startswith(
        'job llama (NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE=""): p2p_disabled:')
    on = network.nccl_p2p_shm(view(RANKS + settings("llama")), Thresholds())
    assert on.verdict == "ok" and on.summary == "P2P and SHM are enabled"
    assert network.nccl_p2p_shm(view(RANKS), Thresholds()).summary == network.NO_SETTINGS


# -- GPUDirect ------------------------------------------------------------------------------------
def _gpudirect(enabled: int) -> str:
    return f"""# TYPE llmmon_gpudirect_rdma_enabled gauge
llmmon_gpudirect_rdma_enabled {enabled}
"""


def test_gdr_level_blocking_gpudirect_on_a_node_that_has_it() -> None:
    found = report_check(view(RANKS + PORTS + _gpudirect(1) + settings(
        "llama", net_gdr_level="LOC") + findings("llama", "gdr_level_blocks")), "gpudirect")
    assert found["verdict"] == "suspect" and found["runbook"] == f"{RUNBOOKS}#ncclmisconfigured"
    assert found["evidence"][0]["text"].startswith(
        'job llama (NCCL_NET_GDR_LEVEL="LOC"): gdr_level_blocks: NCCL_NET_GDR_LEVEL is below')


def test_gpudirect_off_stays_the_nodes_alert_with_the_jobs_findings() -> None:
    found = report_check(view(RANKS + PORTS + _gpudirect(0) + settings("llama")
                              + findings("llama", "gdr_unavailable")), "gpudirect")
    assert found["verdict"] == "suspect"
    assert found["runbook"] == f"{RUNBOOKS}#gpudirectrdmadisabled"
    assert [e["text"].split(":")[0] for e in found["evidence"]] == [
        "this node", 'job llama (NCCL_NET_GDR_LEVEL="")']


def test_gpudirect_on_and_allowed_and_unknown() -> None:
    fine = network.gpudirect(view(RANKS + _gpudirect(1) + settings("llama")), Thresholds())
    assert fine.verdict == "ok" and texts(fine) == [
        'job llama (NCCL_NET_GDR_LEVEL=""): passes gdr_unavailable, gdr_level_blocks']
    blind = network.gpudirect(view(RANKS + _gpudirect(1)), Thresholds())
    assert blind.verdict == "ok" and blind.summary.endswith("no job's NCCL_NET_GDR_LEVEL was "
                                                            "checked")
    assert network.gpudirect(view(RANKS), Thresholds()).verdict == "unknown"


def test_the_branch_walks_the_checklist_in_the_seeds_order() -> None:
    branch = next(b for b in TREE if b.id == "network")
    assert [c.id for c in branch.checks][:8] == [
        "rdma_in_use", "gpu_nic_affinity", "nccl_rails", "nccl_gid_index", "nccl_socket_ifname",
        "gpudirect", "nccl_p2p_shm", "pfc_ecn"]
    assert tuple(network.NCCL_CHECKS) == CHECKS  # every check the collector exports, in order
