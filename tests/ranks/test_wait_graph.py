"""The wait-for graph: roots are the ranks the waits lead to that wait on nothing; ranks that
wait on each other with no root are a cycle; a wait on a rank of another node leads off it."""

from __future__ import annotations

from llmmon.ranks.validate import Group, PeerWait, Progress
from llmmon.ranks.waitfor import collective_waits, frame_waits, graph, members


def _p(enqueued: int, completed: int) -> Progress:
    return Progress(enqueued, -1, completed)


TP01 = Group("mesh_tp", 2, ((0, 1),))
DP13 = Group("mesh_dp", 2, ((1, 1), (3, 3)))
DP02 = Group("mesh_dp", 2, ((0, 0), (2, 2)))


def test_fsdp_tp_hang_has_one_root_and_the_victims_wait_on_it_or_on_each_other() -> None:
    """Rank 1 stuck before its tp all-reduce: 0 waits in tp, 3 in dp{1,3} for 1, 2 in
    dp{0,2} for 0 (who waits too)."""
    waits = (collective_waits("3", TP01, {0: _p(6, 5), 1: _p(5, 5)}, {0: "all_reduce"})
             + collective_waits("2", DP13, {1: _p(10, 10), 3: _p(12, 11)}, {3: "all_gather"})
             + collective_waits("1", DP02, {0: _p(10, 10), 2: _p(12, 11)}, {2: "all_gather"}))
    found = graph(waits, range(4))
    assert found.roots == (1,) and found.cycle == () and not found.remote
    assert {r: [w.on for w in ws] for r, ws in found.waits.items()} == \
        {0: [(1,)], 3: [(1,)], 2: [(0,)]}
    assert found.waits[0][0].where == "tp all_reduce #6 (group 3)"


def test_a_pipeline_stage_waits_on_its_peer_through_its_frames() -> None:
    """gloo records no send/recv: rank 0's frames say it waits in recv from rank 1."""
    waits = frame_waits(0, (PeerWait("recv", 1, "5"),), {"5": Group("mesh_pp", 2, ((0, 1),))},
                        ())
    found = graph(waits, [0, 1])
    assert found.roots == (1,) and found.waits[0][0].where == "pp recv (group 5)"


def test_a_collective_the_recorder_has_in_flight_is_not_counted_again_from_frames() -> None:
    assert frame_waits(0, (PeerWait("all_reduce", None, "3"),), {}, {"3"}) == []
    assert [w.on for w in frame_waits(0, (PeerWait("all_reduce", None, "3"),), {}, ())] == [()]


def test_ranks_waiting_on_each_other_in_different_groups_are_a_cycle() -> None:
    """0 waits in tp for 1, 1 waits in dp for 0: a deadlock of the program's order."""
    waits = (collective_waits("3", TP01, {0: _p(6, 5), 1: _p(5, 5)}, {})
             + collective_waits("7", Group("other", 2, ((0, 1),)),
                                {0: _p(9, 9), 1: _p(10, 9)}, {}))
    found = graph(waits, [0, 1])
    assert found.roots == () and found.cycle == (0, 1)


def test_every_local_member_inside_a_group_spanning_nodes_waits_off_the_node() -> None:
    group = Group("default_pg", 4, ((0, 3),))
    found = graph(collective_waits("0", group, {0: _p(9, 8), 1: _p(9, 8)}, {}), [0, 1])
    assert found.roots == () and found.remote and found.waits[0][0].remote


def test_a_group_with_cut_or_huge_spans_is_not_expanded() -> None:
    assert members(Group("x", 3, ((0, 2),), spans_cut=True), [5]) == (5,)
    assert members(Group("x", 1 << 20, ((0, (1 << 20) - 1),)), [1, 0]) == (0, 1)
    assert members(DP13, []) == (1, 3)
