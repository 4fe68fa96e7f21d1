"""Groups of a DeviceMesh are each themselves, end to end.

torch keys pg_status by a group's id in each process (on a 2×2 mesh id 1 is every rank's dp
group, id 2 its tp group) while records name groups job-wide; joined by id, both dp groups'
progress landed in one "group 1" described by whichever group was named 1.  Here every group
must appear under its own name, with exactly its members and its own count, and a rank stuck
before a tp collective must stay waited for (the reporter's settling once completed the wait
it could not find under the id).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import wait_for
from llmmon.collectors.ranks import RanksCollector
from tests.ranks.jobs import Job, base_env, by_rank, job_doc, looks, make_collector, scrape

def _ticks(spool: Path, rank: int) -> int:
    """How many ticks rank `rank`'s reporter has written (its state file)."""
    state = next(spool.rglob(f"rank_{rank}.*[0-9].json"))
    return json.loads(state.read_bytes())["reporter"]["ticks"]


MESH_TRAINER = Path(__file__).parents[2] / "ranks" / "meshtrainer.py"
STEPS = 6


def _torch_groups(job: Job, world: int) -> dict[str, dict]:
    """name -> {desc, ranks} over every rank's view, as torch itself has them."""
    seen: dict[str, dict] = {}
    for rank in range(world):
        for name, group in job.result(rank, timeout=300)["groups"].items():
            seen[name] = group
    return seen


@pytest.mark.parametrize("world,dp", [(4, 2), (8, 2)])
def test_every_mesh_group_is_reported_under_its_own_name_with_its_members(
        tmp_path: Path, world: int, dp: int) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    collector = make_collector(spool, tmp_path)
    args = ["--dp", str(dp), "--steps", str(STEPS), "--hold", "600"]
    with Job(tmp_path, world, args, base_env(LLMMON_SPOOL=str(spool)),
             script=MESH_TRAINER) as job:
        torch_groups = _torch_groups(job, world)
        mesh = {name: g for name, g in torch_groups.items() if g["desc"] in ("mesh_dp", "mesh_tp")}
        assert len(mesh) == world // dp + dp, torch_groups
        # the test is only worth something where a group's name is not its id anywhere
        assert {name for name, g in mesh.items() if g["desc"] == "mesh_tp"} != {"2"}
        expected = {name: (g["desc"], g["ranks"], STEPS if g["desc"] == "mesh_tp" else 2 * STEPS)
                    for name, g in mesh.items()}
        seen: dict = {}

        def reported() -> bool:
            doc = job_doc(collector)
            seen["groups"] = {g["pg"]: (g["pg_desc"], g["local_ranks"],
                                        sorted(set(g["completed"].values())))
                              for g in doc["groups"]} if doc else {}
            return all(seen["groups"].get(name) == (desc, ranks, [count])
                       for name, (desc, ranks, count) in expected.items())

        try:
            wait_for(reported, 240, "every mesh group under its name, members and count")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nwanted {expected}\nseen {seen}\n"
                                 f"{looks(collector, job)}") from None
        assert set(seen["groups"]) <= set(torch_groups), seen


STUCK_AT = 5


def test_a_rank_stuck_before_its_tp_collective_stays_waited_for_in_its_tp_group(
        tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    collector = make_collector(spool, tmp_path, stall_after="1s")
    args = ["--steps", "40", "--compute", "0.02", "--culprit", "1", "--stuck-at", str(STUCK_AT)]
    with Job(tmp_path, 4, args, base_env(LLMMON_SPOOL=str(spool)), script=MESH_TRAINER) as job:
        seen: dict = {}

        def tp_group_waits() -> dict | None:
            doc = job_doc(collector)
            tp = [g for g in doc["groups"] if g["pg_desc"] == "mesh_tp"
                  and g["local_ranks"] == [0, 1]] if doc else []
            seen["tp"] = tp
            seen["ticks"] = {r["rank"]: r["reporter"] for r in doc["ranks"]} if doc else {}
            # at the stuck step's all-reduce (one a step: #6 after steps 0-4), not an earlier
            # one a loaded machine left rank 1 late to for a moment
            return tp[0] if tp and tp[0]["waiting"] == [0] and tp[0]["behind"] == [1] and (
                tp[0]["op"] or {}).get("seq") == STUCK_AT + 1 else None

        try:
            wait_for(tp_group_waits, 240, "rank 0 waiting for rank 1 in tp {0,1}")
            # settling needs two ring reads that agree: many reads later the wait still stands
            start = _ticks(spool, 0)

            def many_reads_later() -> bool:
                assert tp_group_waits() is not None, "the wait vanished"
                return _ticks(spool, 0) >= start + 30  # 3 s of ticks: ~10 ring reads
            wait_for(many_reads_later, 240, "30 more reporter ticks of rank 0")
            wait_for(lambda: (tp_group_waits() or {}).get("op", {}).get("coll") == "all_reduce",
                     60, "the tp all-reduce named as what rank 0 waits in")
            verdict = wait_for(lambda: _one_root(collector, seen), 120,
                               "one verdict naming rank 1 as the root")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nseen {seen}\n{looks(collector, job)}") from None
        assert verdict["summary"].startswith("job "), verdict
        assert "stuck_forever" in verdict["summary"], verdict
        assert "rank 1 (dp group 2 {1,3}, tp group 3 {0-1}) is in stuck_forever" \
            in verdict["summary"], verdict
        assert "rank 0 waits in tp all_reduce #6 (group 3) for rank 1" in verdict["summary"]
        waits = {w["rank"]: (w["pg_desc"], w["on"]) for w in verdict["waits"]}
        assert waits == {0: ("mesh_tp", [1]), 2: ("mesh_dp", [0]), 3: ("mesh_dp", [1])}, waits
        samples = scrape(collector)[0]
        assert by_rank(samples, "llmmon_rank_waiting") == {0: 1, 2: 1, 3: 1}


def _one_root(collector: RanksCollector, seen: dict) -> dict | None:
    """The job's verdict once it is stalled with rank 1 alone as its root, and no group blames
    another rank (rank 0 is behind in its dp group only because it waits in tp)."""
    doc = job_doc(collector)
    verdict = doc["verdict"] if doc else {}
    seen["verdict"] = verdict
    blamed = {r for g in (doc or {}).get("groups", []) if g["stalled"]
              for r in g["behind"] + g["stopped"] + g["quiet_ranks"]}
    seen["blamed"] = blamed
    ok = verdict.get("stalled") and verdict["roots"] == [1] and blamed <= {1} \
        and len(verdict["waits"]) == 3
    return verdict if ok else None


OPS_TRAINER = Path(__file__).parents[2] / "ranks" / "opstrainer.py"
# (coll, dtype) -> bytes the group moved, by nccl-tests' rules: inputs of reductions and
# all-to-all, outputs of gathers; gloo (torch 2.13) records a reduce-scatter as an all-reduce
# and the functional all-gather's output with its input's shape
OPS_BYTES = {("all_reduce", "Float"): (12 + 8 + 5 + 4 + 4) * 4,
             ("all_gather", "Float"): (2 + 8) * 4, ("all_to_all", "Float"): (4 + 4) * 4}


def test_coalesced_functional_and_fsdp_collectives_are_each_counted_in_their_group(
        tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    collector = make_collector(spool, tmp_path)
    with Job(tmp_path, 2, [], base_env(LLMMON_SPOOL=str(spool)), script=OPS_TRAINER) as job:
        for rank in range(2):
            job.result(rank)
        seen: dict = {}

        def counted() -> bool:
            samples = scrape(collector)[0]
            seen["completed"] = by_rank(samples, "llmmon_nccl_last_completed_seq", pg="1")
            seen["bytes"] = {(dict(k)["coll"], dict(k)["dtype"]): v for (name, k), v
                             in samples.items() if name == "llmmon_nccl_collective_bytes_total"
                             and dict(k)["rank"] == "0" and dict(k)["pg"] == "1"}
            return seen["completed"] == {0: 9, 1: 9} and seen["bytes"] == OPS_BYTES

        try:
            wait_for(counted, 120, "nine collectives of group 1 counted with their bytes")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nseen {seen}\n{looks(collector, job)}") from None
