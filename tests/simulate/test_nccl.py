"""The NCCL checklist on simulated nodes, read back through the real daemon: each
misconfiguration scenario trips its own check and no other, and the healthy job trips none."""

from __future__ import annotations

import json
import time
import shutil
from pathlib import Path

import pytest

from llmmon.cli import build_parser
from llmmon.collectors import discover
from llmmon.config import build_settings
from llmmon.network.nccl_checks import CHECKS
from llmmon.serve.assembly import build
from llmmon.simulate.node import NodeSim
from llmmon.simulate.scenarios import SCENARIOS
from tests.simulate.conftest import Exposition, expose
from tests.simulate.test_node import ticked

NCCL_SCENARIOS = {name: cls for name, cls in SCENARIOS.items() if name.startswith("nccl-")}
# The one scenario whose cause has a consequence the checklist also names: IB switched off
# makes NCCL choose sockets.
# makes NCCL choose sockets; NICs that lost their RDMA device are still in NCCL_IB_HCA.
ALSO = {"nccl-ib-disabled": {"transport_socket"},
        "nccl-gpu-nic-cross-socket": {"ib_hca_unknown"}}


# What the nccl collector reads beside its own trees: the ranks collector's verdicts and the
# topology collector's GPU-NIC paths; the other collectors only cost time here.
ONLY_NCCL = ("--no-collector.gpu", "--no-collector.disk", "--no-collector.nic",
             "--no-collector.netdev", "--no-collector.rdma", "--no-collector.incidents")


def judged(node: NodeSim) -> Exposition:
    """The node as the daemon shows it once the nccl collector has seen the job's ranks."""
    return expose(node, *ONLY_NCCL, rounds=2)


def findings(exposed: Exposition) -> set[str]:
    return {dict(labels)["check"] for (name, labels), value in exposed.samples.items()
            if name == "llmmon_job_nccl_misconfigured" and value == 1}


def series(exposed: Exposition, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels) in exposed.samples if n == name]


def test_a_tuned_job_over_two_nodes_passes_every_check_and_shows_its_transport(
        work: Path) -> None:
    exposed = judged(ticked(work, nodes=2).nodes[0])
    assert exposed.collectors["nccl"]["watched"] == 1
    assert exposed.collectors["nccl"]["errors_total"] == 0, exposed.collectors["nccl"]
    assert findings(exposed) == set()
    (settings,) = series(exposed, "llmmon_job_nccl_settings_info")
    assert settings["job_id"] == "pretrain-0"
    assert settings["ib_hca"] == "=" + ",".join(f"mlx5_{i}:1" for i in range(8))
    assert (settings["ib_gid_index"], settings["ib_qps_per_connection"]) == ("3", "4")
    checked = settings["checked"].split(",")
    assert {"transport_socket", "gid_index_not_rocev2", "ib_hca_missing_rail",
            "gpu_nic_cross_socket"} <= set(checked) <= set(CHECKS)
    (transport,) = series(exposed, "llmmon_job_nccl_transport_info")
    assert (transport["ranks"], transport["net"], transport["gdr"]) == ("0-7", "IB", "1")
    assert transport["version"].startswith("2.21.5")
    assert "mlx5_7:1/RoCE" in transport["devices"]
    assert set(transport["paths"].split(",")) >= {"P2P/IPC"}


@pytest.mark.parametrize("name", sorted(NCCL_SCENARIOS))
def test_each_misconfiguration_trips_its_own_check_and_no_other(work: Path, name: str) -> None:
    cls = NCCL_SCENARIOS[name]
    exposed = judged(ticked(work, name, nodes=2).nodes[0])
    assert findings(exposed) == {cls.check, *ALSO.get(name, ())}, name
    if cls.check in ("transport_socket", "ib_disabled"):
        (transport,) = series(exposed, "llmmon_job_nccl_transport_info")
        assert (transport["net"], transport["gdr"]) == ("Socket", "0")


def test_the_other_node_of_the_job_is_not_blamed(work: Path) -> None:
    cluster = ticked(work, "nccl-ib-hca-missing-rail@sim-00", nodes=2)
    assert findings(judged(cluster.nodes[1])) == set()


def test_a_job_on_one_node_is_not_judged_on_its_network(work: Path) -> None:
    """One node: NCCL never opens a network channel, so a socket fallback or a missing rail
    is no finding; P2P disabled still is."""
    exposed = judged(ticked(work, "nccl-transport-socket", "nccl-p2p-disabled").nodes[0])
    assert findings(exposed) == {"p2p_disabled"}


def test_without_the_ranks_environment_the_reporter_s_copy_is_judged(work: Path) -> None:
    """A daemon that may not read /proc/<pid>/environ (no CAP_SYS_PTRACE) judges the NCCL
    variables each rank's reporter sends."""
    node = ticked(work, "nccl-ib-hca-missing-rail", nodes=2).nodes[0]
    for environ in node.paths.procfs.glob("*/environ"):
        environ.unlink()
    exposed = judged(node)
    assert findings(exposed) == {"ib_hca_missing_rail"}
    (settings,) = series(exposed, "llmmon_job_nccl_settings_info")
    assert settings["ib_gid_index"] == "3"


def test_each_finding_s_evidence_and_fix_are_served(work: Path) -> None:
    """What a label cannot carry (the GID the index points at, its type) is at /api/v1/nccl."""
    node = ticked(work, "nccl-gid-index-not-rocev2", nodes=2).nodes[0]
    args = build_parser().parse_args(["serve", *node.paths.serve_args(), *ONLY_NCCL])
    daemon = build(build_settings(args, discover()))
    try:
        for _ in range(2):
            for collector in daemon.collectors:
                daemon.sampler.run_once(collector)
        served = daemon.routes().get["nccl"]()
    finally:
        for collector in daemon.collectors:
            collector.close()
    (job,) = served["jobs"]
    assert job["job_id"] == "pretrain-0" and job["multi_node"] is True
    (finding,) = job["findings"]
    assert finding["check"] == "gid_index_not_rocev2"
    assert "RoCE v1" in finding["evidence"] and "mlx5_0" in finding["evidence"], finding
    assert finding["fix"]
    assert job["transport"][0]["ranks"] == "0-7"


def test_a_log_in_the_shared_dump_directory_is_read_from_the_host(work: Path) -> None:
    """Where the rank's own root is out of reach (no CAP_SYS_PTRACE: no environ either), the
    NCCL_DEBUG_FILE its reporter names in the dump directory, which the node shares with its
    pods at the same path, is read from the host."""
    cluster = ticked(work, nodes=2)
    node = cluster.nodes[0]
    shared = node.paths.root / "fr" / "pretrain-0"
    shared.mkdir(parents=True)
    for state in node.paths.spool.glob("*/*.json"):
        doc = json.loads(state.read_text())
        if doc.get("kind") != "state":
            continue
        who = doc["identity"]
        who["nccl_env"]["NCCL_DEBUG_FILE"] = f"{shared}/nccl.%h.%p.log"
        state.write_text(json.dumps(doc))
        log = node.paths.procfs / str(who["pid"]) / "root" / "tmp" / \
            f"nccl.{who['pod']}.{who['pid']}.log"
        (shared / f"nccl.{who['pod']}.{who['pid']}.log").write_bytes(log.read_bytes())
    for proc in node.paths.procfs.glob("[0-9]*"):
        (proc / "environ").unlink()
        shutil.rmtree(proc / "root")
    exposed = judged(node)
    (transport,) = series(exposed, "llmmon_job_nccl_transport_info")
    assert (transport["ranks"], transport["net"], transport["gdr"]) == ("0-7", "IB", "1")
    assert findings(exposed) == set()


def test_nics_bound_again_end_the_cross_socket_finding(work: Path) -> None:
    cluster = ticked(work, "nccl-gpu-nic-cross-socket", nodes=2)
    assert "gpu_nic_cross_socket" in findings(judged(cluster.nodes[0]))
    later = time.time() + 10
    cluster.set_scenarios([], later)
    cluster.tick(later)
    assert findings(judged(cluster.nodes[0])) == set()
