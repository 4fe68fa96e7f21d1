"""Flight Recorder dumps of every rank read together: real gloo dumps, NCCL-shaped entries from
the H200 capture, and hostile dumps."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from llmmon.incidents import frtrace
from tests.incidents.nodes import FIXTURES, MESH

H200 = Path(__file__).parents[1] / "fixtures" / "nccl" / "h200_flight_recorder.json"


MESH_LINES = [
    "rank 2 never entered all_gather #11 of group mesh_dp (ranks 0,2); rank 0 waits in it",
    "rank 3 never entered all_gather #11 of group mesh_dp (ranks 1,3); rank 1 waits in it",
    "rank 3 never entered all_reduce #6 of group mesh_tp (ranks 2-3); rank 2 waits in it"]


def mesh_dumps(ranks: range = range(4)) -> list[frtrace.Dump]:
    return [frtrace.parse(r, frtrace.load((MESH / f"rank_{r}.json").read_bytes()))
            for r in ranks]


def test_the_real_mesh_dumps_name_rank_3_and_every_wait_on_it() -> None:
    dumps = mesh_dumps()
    # the fixture is only worth something where pg ids differ from names and between groups
    by_id = {(d.rank, r.pg_id): r.group for d in dumps for r in _raw(d.rank)}
    assert by_id[(0, 1)] != by_id[(1, 1)] and by_id[(0, 1)] == "1"
    analysis = frtrace.analyse(dumps)
    assert analysis.lines() == MESH_LINES
    assert analysis.culprits == (3,)
    assert [(g.name, g.desc, g.members) for g in analysis.groups] == [
        ("1", "mesh_dp", (0, 2)), ("2", "mesh_dp", (1, 3)), ("3", "mesh_tp", (0, 1)),
        ("4", "mesh_tp", (2, 3))]
    assert json.loads(json.dumps(analysis.json()))["culprits"] == [3]


def _raw(rank: int) -> list[Any]:
    """pg_id of every entry of a fixture dump, as records with the fields the test reads."""
    doc = json.loads((MESH / f"rank_{rank}.json").read_text())

    class Raw:
        def __init__(self, entry: dict[str, Any]) -> None:
            self.pg_id, self.group = entry["pg_id"], entry["process_group"][0]
    return [Raw(e) for e in doc["entries"]]


def test_a_rank_whose_dump_is_absent_is_never_blamed() -> None:
    """Without rank 3's dump nobody knows where it is: what rank 2 waits for is said, and rank
    2 missing from dp is no culprit, since it waits in tp itself (the members of tp {2,3}
    come from ranks.json: no dump read names rank 3 in it)."""
    analysis = frtrace.analyse(mesh_dumps(range(3)), {"4": [2, 3]})
    assert [(f.kind, f.ranks) for f in analysis.findings] == [("missing", (2,)), ("unread", (3,))]
    assert analysis.findings[1].text == ("rank 2 waits in all_reduce #6 of group mesh_tp "
                                         "(ranks 2-3); no dump of rank 3 was read")
    assert analysis.culprits == ()


def test_hints_give_a_group_the_members_no_dump_names() -> None:
    """gloo leaves pg_config empty: a member with no record of the group is still missing."""
    dumps = mesh_dumps()
    dumps[3].records = [r for r in dumps[3].records if r.group != "4"]
    without = frtrace.analyse(dumps)
    assert not any(f.group == "4" for f in without.findings)  # rank 3 not known as a member
    with_hints = frtrace.analyse(dumps, {"4": [2, 3]})
    tp = [f for f in with_hints.findings if f.group == "4"]
    assert [(f.seq, f.ranks, f.waiting) for f in tp] == [(6, (3,), (2,))]


def test_the_real_pickled_dumps_load_through_the_restricted_unpickler() -> None:
    docs = [frtrace.load((FIXTURES / "fr" / "pickled" / f"rank_{r}").read_bytes())
            for r in (0, 1)]
    assert (FIXTURES / "fr" / "pickled" / "rank_0").read_bytes()[:1] == b"\x80"
    analysis = frtrace.analyse(frtrace.parse(r, d) for r, d in enumerate(docs))
    assert [(g.desc, g.members, g.last) for g in analysis.groups] == [
        ("default_pg", (0, 1), {0: 3, 1: 3})]
    assert analysis.findings == () and analysis.errors == ()


class Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path("/tmp/llmmon-frtrace-pwned"),))


def test_a_pickle_with_a_global_is_refused_and_runs_nothing() -> None:
    target = Path("/tmp/llmmon-frtrace-pwned")
    target.unlink(missing_ok=True)
    data = pickle.dumps({"version": "2.10", "entries": [Boom()]}, protocol=2)
    with pytest.raises(frtrace.DumpError, match="global .* refused"):
        frtrace.load(data)
    assert not target.exists()


@pytest.mark.parametrize("data,why", [
    (b"x" * (frtrace.MAX_BYTES + 1), "over the 64 MiB cap"),
    (b"[1, 2]", "a list, not a dict"),
    (b"\x80\x02}q\x00(", "not a Flight Recorder dump"),  # a pickle cut short
    (b"{not json", "not a Flight Recorder dump"),
    (b"[" * 100_000 + b"]" * 100_000, "not a Flight Recorder dump"),
], ids=["huge", "a-list", "a-cut-pickle", "not-json", "too-deep"])
def test_a_dump_that_is_not_one_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(frtrace.DumpError, match=why):
        frtrace.load(data)


def test_entries_of_the_wrong_types_are_skipped_and_counted() -> None:
    doc = json.loads((MESH / "rank_2.json").read_text())
    good = len(doc["entries"])
    doc["entries"] += [None, 7, {"process_group": "4"}, {**doc["entries"][0], "collective_seq_id":
                       "6"}, {**doc["entries"][0], "input_sizes": "big"},
                       {**doc["entries"][0], "process_group": [1, 2]}]
    doc["pg_config"] = {"x": {"name": "4", "ranks": "[2, oops]"}, "y": [], "z": {"ranks": 3}}
    dump = frtrace.parse(2, doc)
    assert (len(dump.records), dump.skipped, dump.members) == (good, 6, {})
    analysis = frtrace.analyse([dump])
    assert analysis.errors == ("rank 2: 6 entries not understood",)
    assert frtrace.parse(0, {"entries": "nope", "pg_config": 3}).records == []


# NCCL: the shapes of the H200 capture -------------------------------------------------------

def nccl_dumps(world: int = 3) -> dict[int, dict[str, Any]]:
    """`world` ranks of one NCCL group whose records are the capture's own (nccl:all_reduce)."""
    capture = json.loads(H200.read_text())["trace"]
    docs = {}
    for rank in range(world):
        doc = {"version": capture["version"], "pg_status": capture["pg_status"],
               "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                   "ranks": json.dumps(list(range(world)))}},
               "entries": copy.deepcopy(capture["entries_head"])}
        docs[rank] = doc
    return docs


def test_nccl_records_are_named_without_their_backend_and_matched() -> None:
    docs = nccl_dumps()
    assert {e["profiling_name"] for e in docs[0]["entries"]} == {"nccl:all_reduce"}
    last = docs[0]["entries"][-1]
    for rank in (0, 1):
        docs[rank]["entries"][-1]["state"] = "started"  # ranks 0-1 inside the last one
        docs[rank]["entries"][-1]["retired"] = False
    del docs[2]["entries"][-1]  # rank 2 never entered it
    analysis = frtrace.analyse(frtrace.parse(r, d) for r, d in docs.items())
    seq = last["collective_seq_id"]
    assert analysis.lines() == [f"rank 2 never entered all_reduce #{seq} of group default_pg "
                                f"(ranks 0-2); ranks 0-1 wait in it"]
    assert analysis.culprits == (2,)


def test_a_rank_in_another_op_or_size_is_a_desync_and_the_minority_is_named() -> None:
    docs = nccl_dumps()
    docs[1]["entries"][2]["profiling_name"] = "nccl:all_gather"
    docs[2]["entries"][4]["input_sizes"] = [[2048]]
    docs[0]["entries"][3]["input_dtypes"] = ["BFloat16"]
    analysis = frtrace.analyse(frtrace.parse(r, d) for r, d in docs.items())
    seqs = [e["collective_seq_id"] for e in docs[0]["entries"]]
    assert [(f.kind, f.seq, f.ranks) for f in analysis.findings] == [
        ("desync", seqs[2], (1,)), ("desync", seqs[3], (0,)), ("desync", seqs[4], (2,))]
    assert analysis.findings[0].text == (
        f"desync in all_reduce #{seqs[2]} of group default_pg (ranks 0-2): ranks 0,2 "
        f"all_reduce [1024] Float; rank 1 all_gather [1024] Float")
    assert analysis.culprits == ()  # a desync blames, but nobody waits on it here


def test_uneven_all_to_all_inputs_are_no_desync() -> None:
    docs = nccl_dumps(2)
    for rank in (0, 1):
        docs[rank]["entries"][0]["profiling_name"] = "nccl:all_to_all"
    docs[1]["entries"][0]["input_sizes"] = [[512]]
    analysis = frtrace.analyse(frtrace.parse(r, d) for r, d in docs.items())
    assert analysis.findings == ()


def p2p(rank: int, op: str, meta: str, seq: int, done: bool) -> dict[str, Any]:
    entry = copy.deepcopy(json.loads(H200.read_text())["trace"]["entries_head"][0])
    entry.update({"profiling_name": f"nccl:{op} {meta}", "is_p2p": True, "p2p_seq_id": seq,
                  "collective_seq_id": 0, "state": "completed" if done else "started",
                  "retired": done, "process_group": ["5", "pipe"]})
    return entry


def p2p_dumps(entries: dict[int, list[dict[str, Any]]]) -> list[frtrace.Dump]:
    config = {"5": {"name": "5", "desc": "pipe", "ranks": "[4, 6]"}}
    return [frtrace.parse(r, {"pg_config": config, "entries": e}) for r, e in entries.items()]


def test_a_receive_whose_send_never_came_names_the_sender() -> None:
    # group-local ranks: 0 is global 4, 1 is global 6
    dumps = p2p_dumps({4: [p2p(4, "send", "0->1", 1, True)],
                       6: [p2p(6, "recv", "1<-0", 1, True), p2p(6, "recv", "1<-0", 2, False)]})
    analysis = frtrace.analyse(dumps)
    assert analysis.lines() == ["rank 6 waits in recv #2 from rank 4 of group pipe "
                                "(ranks 4,6); rank 4 never sent it"]
    assert analysis.culprits == (4,)


def test_a_pair_in_flight_together_is_matched() -> None:
    dumps = p2p_dumps({4: [p2p(4, "send", "0->1", 2, False)],
                       6: [p2p(6, "recv", "1<-0", 2, False)]})
    assert frtrace.analyse(dumps).findings == ()


def test_a_send_nobody_receives_names_the_receiver() -> None:
    dumps = p2p_dumps({4: [p2p(4, "send", "0->1", 3, False)],
                       6: [p2p(6, "recv", "1<-0", 2, True)]})
    assert frtrace.analyse(dumps).lines() == [
        "rank 4 waits in send #3 to rank 6 of group pipe (ranks 4,6); rank 6 never received it"]


def test_ranges_are_compact() -> None:
    assert frtrace.ranges([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"
    assert frtrace.ranges([]) == ""
