"""A desync through real gloo ranks: at one sequence number of the default group rank 1
broadcasts where ranks 0 and 2 all-reduce, and the group hangs.  The daemon names rank 1 with
what each rank issued, and exports each rank's collective for the rules' cross-node vote.  A
desync by size does not hang gloo: it aborts the rank that receives the odd size and fails the
others in that collective, and the daemon names the culprit from what they failed in."""

from __future__ import annotations

from pathlib import Path

from llmmon.diagnose.branches import hang as hang_branch
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.window import LocalView, Window
from tests.helpers import wait_for
from tests.ranks.jobs import Job, base_env, group_doc, job_doc, scrape, series, watched_collector

LONG = ["--steps", "100000", "--compute", "0.01", "--hold", "300", "--timeout", "300"]


def test_the_rank_that_issued_another_collective_is_named_with_what_each_issued(
        tmp_path: Path) -> None:
    with watched_collector(tmp_path) as (spool, collector):
        env = base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB="desync")
        with Job(tmp_path, 3, [*LONG, "--culprit", "1", "--desync-at", "60"], env):
            def desynced() -> dict | None:
                group = group_doc(collector)
                return group if group and group["desync"] and group["issued"] else None
            group = wait_for(desynced, 240, "the desync", context=lambda: job_doc(collector))
            samples = scrape(collector)[0]
            # the odd rank waits in its broadcast like its peers in their all-reduce: it is
            # still the job's root, once the group is stalled
            verdict = wait_for(lambda: (v := job_doc(collector)["verdict"])["stalled"] and v,
                               240, "the job's verdict", context=lambda: job_doc(collector))
    found = group["desync"]
    assert found["odd"] == [1], group
    assert verdict["roots"] == [1], verdict
    assert found["issued"]["1"].startswith("broadcast 256 B"), found
    assert found["issued"]["0"] == found["issued"]["2"] and \
        found["issued"]["0"].startswith("all_reduce 256 B"), found
    assert f"a desync at #{found['seq']}: rank 1 issued broadcast 256 B" in group["summary"]
    assert "the rank behind is on another node" not in group["summary"]
    issued = series(samples, "llmmon_nccl_inflight_collective_info", job_id="desync", pg="0")
    assert {dict(k)["rank"]: (dict(k)["seq"], dict(k)["signature"]) for k in issued} == {
        rank: (str(found["seq"]), signature) for rank, signature in found["issued"].items()}


def test_two_ranks_that_disagree_are_told_apart_by_what_the_group_issued_before(
        tmp_path: Path) -> None:
    # No majority on a node with two ranks: the one that issued what the group never issued in
    # its last collectives (a broadcast in a job that only all-reduces) is the odd one
    with watched_collector(tmp_path) as (spool, collector):
        env = base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB="desync2")
        with Job(tmp_path, 2, [*LONG, "--culprit", "1", "--desync-at", "60"], env):
            def desynced() -> dict | None:
                group = group_doc(collector)
                return group if group and group["desync"] else None
            group = wait_for(desynced, 240, "the desync", context=lambda: job_doc(collector))

            def exported() -> tuple | None:  # the in-flight collectives: 5 s into the wait
                samples, _, text = scrape(collector)
                usual = series(samples, "llmmon_nccl_desync_usual_info", job_id="desync2")
                return (usual, text) if usual else None
            usual, text = wait_for(exported, 60, "the tie's usual signature exported")
    found = group["desync"]
    assert (found["odd"], found["basis"]) == ([1], "history"), group
    assert [dict(k)["signature"] for k in usual] == [found["majority"]]
    # the triage tree's desync check reads the same tie from the exposition
    window = Window(span=60)
    window.add(text)
    check = hang_branch.desync(LocalView(window.observations(), "daemon", "", Thresholds()),
                               Thresholds())
    assert check.verdict == "suspect", check
    assert [e.subject.get("rank") for e in check.evidence] == ["1"], check
    assert "(as the group did before): a desync" in check.evidence[0].text
    assert found["majority"].startswith("all_reduce 256 B"), found
    assert f"a desync at #{found['seq']}: rank 1 issued broadcast 256 B" in group["summary"]
    assert "as the group did before" in group["summary"], group["summary"]


def test_a_desync_by_size_is_named_from_the_collective_the_ranks_failed_in(
        tmp_path: Path) -> None:
    # gloo aborts the rank that receives rank 3's 72 floats (SIGABRT, no exit record; rank 2,
    # its ring neighbour, in every run seen) within milliseconds; the others raise in that
    # all-reduce, which gloo counts as completed
    with watched_collector(tmp_path) as (spool, collector):
        env = base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB="desync-size")
        args = [*LONG, "--culprit", "3", "--desync-at", "30", "--desync-by", "size"]
        with Job(tmp_path, 4, args, env) as job:
            def desynced() -> dict | None:
                doc = job_doc(collector)
                group = group_doc(collector)
                ended = doc is not None and doc["end"] is not None and doc["end"]["ended"]
                return group if ended and group and group["desync"] else None
            group = wait_for(desynced, 240, "the desync, once the job ended",
                             context=lambda: (job_doc(collector), job.logs()))
            samples = scrape(collector)[0]
            end = job_doc(collector)["end"]
            codes = [proc.wait(timeout=60) for proc in job.procs]
    found = group["desync"]
    aborted = [rank for rank, code in enumerate(codes) if code == -6]
    assert len(aborted) == 1 and aborted != [3] and codes[3] == 1, codes
    assert (found["odd"], found["basis"]) == ([3], "majority"), group
    assert found["issued"]["3"] == "all_reduce 288 B Float", found
    survivors = sorted({0, 1, 2} - set(aborted))
    assert {found["issued"][str(r)] for r in survivors} == {"all_reduce 256 B Float"}, found
    assert str(aborted[0]) not in found["issued"], found
    assert group["summary"].startswith("job desync-size, group 0 (default_pg): not a hang: "), \
        group["summary"]
    assert f"a desync at #{found['seq']}: rank 3 issued all_reduce 288 B Float" \
        in group["summary"], group["summary"]
    issued = series(samples, "llmmon_nccl_inflight_collective_info", job_id="desync-size",
                    pg="0")
    assert {dict(k)["rank"]: (dict(k)["seq"], dict(k)["signature"]) for k in issued} == {
        rank: (str(found["seq"]), signature) for rank, signature in found["issued"].items()}
    # the rank that aborted went first, but the job's end blames the one it answered
    assert end["first"] == [3] and end["desync"]["basis"] == "majority", end
    assert end["summary"].startswith(
        f"job desync-size: rank 3 issued all_reduce 288 B Float as collective #{found['seq']} "
        f"of group 0, where the other ranks here issued all_reduce 256 B Float (a desync); the "
        f"rank that was to receive it ended first (killed by signal 6)"), end["summary"]


def test_a_desync_by_size_seen_from_the_odd_ranks_node_blames_it_not_its_aborted_peer(
        tmp_path: Path) -> None:
    # Two nodes' spools: ranks 0-1 report to node-a's daemon, ranks 2-3 to node-b's.  Rank 2
    # aborts before recording the collective, so node-b holds rank 3's odd all-reduce alone,
    # with nothing to vote with but the group's history; node-a's ranks only lost a peer.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with watched_collector(tmp_path / "a") as (spool_a, node_a), \
            watched_collector(tmp_path / "b") as (spool_b, node_b):
        args = [*LONG, "--culprit", "3", "--desync-at", "30", "--desync-by", "size"]
        spools = {rank: {"LLMMON_SPOOL": str(spool_a if rank < 2 else spool_b)}
                  for rank in range(4)}
        with Job(tmp_path, 4, args, base_env(LLMMON_JOB="desync-nodes"), spools) as job:
            def ended(collector: object) -> dict | None:
                doc = job_doc(collector)
                return doc["end"] if doc and doc["end"] and doc["end"]["ended"] else None
            end_b = wait_for(lambda: ended(node_b), 240, "node-b's ranks ended",
                             context=lambda: (job_doc(node_b), job.logs()))
            end_a = wait_for(lambda: ended(node_a), 60, "node-a's ranks ended",
                             context=lambda: (job_doc(node_a), job.logs()))
            codes = [proc.wait(timeout=60) for proc in job.procs]
    assert codes[2] == -6 and codes[3] == 1, f"gloo aborted another rank than 2: {codes}"
    assert end_b["first"] == [3], end_b
    found = end_b["desync"]
    assert (found["basis"], found["odd"], found["issued"]) == (
        "new", [3], {"3": "all_reduce 288 B Float"}), found
    assert 0 <= found["after_seconds"] <= 10, found
    assert end_b["summary"].startswith(
        f"job desync-nodes: rank 3 issued all_reduce 288 B Float as collective #{found['seq']} "
        "of group 0, which the group had not issued before (a desync); the "
        "rank that was to receive it ended first (killed by signal 6)"), end_b["summary"]
    assert "rank 2" not in end_b["summary"], end_b["summary"]
    assert end_a["first"] == [] and "lost a peer" in end_a["summary"], end_a
