"""The fault benchmark's correctness subset: real torchrun/gloo jobs over two simulated nodes
(bench/faults/), the daemons at their defaults, real Prometheus and Alertmanager.

Nine classes run side by side: rank 3 (node-b) stuck in its data loader, every rank stuck in
its data loader (nobody waits inside a collective: paged by LLMTrainingHang, reason
no_rank_enqueues, through the real Prometheus and Alertmanager), rank 3 frozen by
SIGSTOP (its reporter too), rank 3 leaving with sys.exit(3), rank 3 killed by SIGKILL (torchrun
tears the rest of each of those two jobs down), the link between the nodes degraded (a lossy
tbf, or netem where the kernel has it), the link slowed without loss (a tbf with a deep queue),
every rank's input pipeline starved, and a healthy job. Each check is about *who* and
*what*: the right rank, the right kind of evidence, no rank wrongly blamed, no page for a
healthy job. How fast each source said so is the benchmark's business (docs/faults.md), never
asserted here; each class is watched until the API and `llmmon diagnose` have named it, or its
window (a deadline, generous for a loaded 2-core machine) runs out.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from bench.faults.classes import classes
from bench.faults.run import bench, names_where

WANTED = {"loader": 240.0, "loader-all": 300.0, "sigstop": 240.0, "exit": 240.0, "sigkill": 240.0,
          "network": 240.0, "network-delay": 240.0, "starved": 240.0,
          "healthy": 150.0}  # class -> window (s)
# Healthy seconds before the fault: enough to see each rank step; the slowdown classes compare
# the job with its own earlier pace, which needs 30 s of it (slowdown.WINDOW, half of it covered)
WARMUP = {"network": 40.0, "network-delay": 40.0, "starved": 40.0}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    assert os.geteuid() == 0, "the nodes' ranks run in network namespaces: run as root"
    chosen = [dataclasses.replace(c, window=WANTED[c.name], background=False,
                                  warmup=WARMUP.get(c.name, min(c.warmup, 15.0)))
              for c in classes(WANTED["healthy"]) if c.name in WANTED]
    work: Path = tmp_path_factory.mktemp("faults")
    done = bench(chosen, parallel=len(chosen), work=work, needed=("api", "diagnose"))
    return {r["class"]: r for r in done}


def test_a_rank_stuck_in_its_data_loader_is_the_rank_behind(results: dict) -> None:
    r = results["loader"]
    assert not r["error"], r
    api, diagnose = r["sources"]["api"], r["sources"]["diagnose"]
    assert api["named_at"] is not None, api
    assert "rank 3 never enqueued" in api["said"], api["said"]
    assert diagnose["named_at"] is not None and "rank 3" in diagnose["said"], diagnose
    assert r["blamed_wrong"] == [] and r["false_pages"] == 0, r
    # each node kept an incident of the hang: node-b names its rank 3 and has every local
    # rank's Flight Recorder dump; node-a's ranks wait for a rank it does not follow
    kept = r["incidents"]
    assert set(kept) == {"node-a", "node-b"} and r["incident_every_node_s"] is not None, kept
    assert (kept["node-b"]["trigger"], kept["node-b"]["culprit"], kept["node-b"]["cause"]) == \
        ("stalled", [3], "root"), kept
    assert kept["node-b"]["dumps"] == {"2": "collected", "3": "collected"}, kept
    assert (kept["node-a"]["trigger"], kept["node-a"]["culprit"], kept["node-a"]["cause"]) == \
        ("waiting", [], "remote"), kept


def test_every_rank_stuck_before_a_collective_is_a_quiet_hang_and_pages(results: dict) -> None:
    r = results["loader-all"]
    assert not r["error"], r
    api, diagnose, page = (r["sources"][k] for k in ("api", "diagnose", "page"))
    assert api["named_at"] is not None and api["cause_at"] is not None, api
    assert "every rank here is stuck before its next collective" in api["said"], api["said"]
    # the daemon of rank 3's node says where it is (a library call, then the job's frame)
    assert "rank 3 is in wait (threading) from load_next_batch (trainer.py:" in api["said"], \
        api["said"]
    assert diagnose["named_at"] is not None and "rank 3" in diagnose["said"], diagnose
    # the page: LLMTrainingHang{reason="no_rank_enqueues"} per rank, rank 3's with its pod and node
    assert page["named_at"] is not None and page["cause_at"] is not None, page
    assert "LLMTrainingHang no_rank_enqueues: Rank 3 of job" in page["said"], page["said"]
    assert f"(pod bench/{r['job_id']}-node-b) on node node-b" in page["said"], page["said"]
    assert r["blamed_wrong"] == [], r
    assert names_where(r) is True  # the table's "page names pod + node"


def test_a_frozen_rank_is_named_from_its_silence_while_its_peers_report(results: dict) -> None:
    r = results["sigstop"]
    assert not r["error"], r
    api, diagnose = r["sources"]["api"], r["sources"]["diagnose"]
    # Named from its silence (`rank 3 down`, after stale_after) or, sooner, from its process
    # state on node-b (`it is stopped (state T: SIGSTOP ...)`): either way the cause is said.
    assert api["named_at"] is not None and api["cause_at"] is not None, api
    assert "rank 3 down" in api["said"] or "SIGSTOP" in api["said"], api
    assert diagnose["named_at"] is not None and "rank 3" in diagnose["said"], diagnose
    assert r["blamed_wrong"] == [] and r["false_pages"] == 0, r


def test_a_rank_that_exits_or_is_killed_is_named_with_its_code_or_signal(results: dict) -> None:
    # node-b's daemon saw rank 3 go first (its exit record, or its pidfd with the SIGKILL
    # status); what node-a's daemon says of its own ranks (a lost peer) blames neither of them
    # (tests/slow/ranks/test_job_end.py shows it; here it may come after both sources named rank 3).
    for name, said in (("exit", "rank 3 exited first (code 3)"),
                       ("sigkill", "rank 3 exited first (killed by signal 9)")):
        r = results[name]
        assert not r["error"], r
        api, diagnose = r["sources"]["api"], r["sources"]["diagnose"]
        assert api["named_at"] is not None and api["cause_at"] is not None, api
        assert said in api["said"], api["said"]
        assert diagnose["named_at"] is not None and said in diagnose["said"], diagnose
        assert r["blamed_wrong"] == [] and r["false_pages"] == 0, r
        assert names_where(r) is None  # nobody is paged for a job's end: n/a, not a miss
        # the culprit's node kept the end as an incident, naming it
        end = r["incidents"].get("node-b")
        assert end and (end["trigger"], end["culprit"], end["cause"]) == ("ended", [3], "ended"), r


def test_a_degraded_link_between_the_nodes_is_the_network_not_a_rank(results: dict) -> None:
    # Every rank slows evenly, none is behind: the daemons judge the job by its own pace and
    # the TCP retransmissions in its pods' network namespaces (a healthy job, beside it, says
    # nothing: the last test)
    r = results["network"]
    assert not r["error"], r
    assert "(used: " in r["notes"], r["notes"]  # the link was degraded
    api, diagnose = r["sources"]["api"], r["sources"]["diagnose"]
    for source in (api, diagnose):
        assert source["cause_at"] is not None, source
        assert "slower than its own pace" in source["said"], source["said"]
        assert "TCP segments" in source["said"] and "suspect the network" in source["said"]
    assert "[WARN]" in diagnose["said"], diagnose["said"]
    assert r["blamed_wrong"] == [] and r["false_pages"] == 0, r


def test_a_slow_link_that_drops_nothing_is_the_network_by_where_the_ranks_wait(
        results: dict) -> None:
    # No TCP loss to go by: the ranks' status reports show them inside their collectives for
    # the time the job lost, which a starved input pipeline (the next test) does not
    r = results["network-delay"]
    assert not r["error"], r
    assert "(used: " in r["notes"], r["notes"]
    api, diagnose = r["sources"]["api"], r["sources"]["diagnose"]
    for source in (api, diagnose):
        assert source["cause_at"] is not None, source
        assert "of the added time is spent inside the collectives, waiting for data" in \
            source["said"] and "suspect the network between the nodes" in source["said"], source
    assert "[WARN]" in diagnose["said"], diagnose["said"]
    assert r["blamed_wrong"] == [] and r["false_pages"] == 0, r


def test_a_starved_input_pipeline_slows_the_job_evenly_and_is_not_the_network(
        results: dict) -> None:
    r = results["starved"]
    assert not r["error"], r
    api, diagnose = r["sources"]["api"], r["sources"]["diagnose"]
    for source in (api, diagnose):
        assert source["cause_at"] is not None, source
        assert "every rank late together" in source["said"], source["said"]
        assert "suspect the network" not in source["said"], source["said"]
    assert r["blamed_wrong"] == [] and r["false_pages"] == 0, r


def test_a_healthy_job_blames_nobody_and_pages_nobody(results: dict) -> None:
    r = results["healthy"]
    assert not r["error"], r
    assert r["blamed_wrong"] == [] and r["false_pages"] == 0, r
    assert all(not s["said"] for s in r["sources"].values()), r["sources"]
    assert r["incidents"] == {}, r["incidents"]  # nor keeps an incident of it
