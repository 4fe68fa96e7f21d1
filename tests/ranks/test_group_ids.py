"""The daemon keys every group by its name: pg_status and `settled` come keyed by each
process's own group ids (llmmon_reporter.groupids), translated through the reporter's map."""

from __future__ import annotations

import json

import pytest

from llmmon.ranks.validate import Notes, SchemaError, parse_segment, parse_state
from llmmon_reporter.groupids import GroupIds, pair


def _state(**fields: object) -> bytes:
    status = {"pg_status": {
        "1": {"last_enqueued_collective": "12", "last_completed_collective": "12"},
        "2": {"last_enqueued_collective": "7", "last_completed_collective": "6"},
        "5": {"last_enqueued_collective": "3", "last_completed_collective": "3"}}}
    doc = {"schema": 1, "kind": "state", "written_ns": 1,
           "identity": {"job_id": "j", "rank": 1, "local_rank": 1, "world_size": 4, "pid": 10},
           "status": status, **fields}
    return json.dumps(doc).encode()


def test_progress_and_settled_are_keyed_by_group_name_and_unpaired_ids_are_left_out() -> None:
    notes = Notes()
    state = parse_state(_state(pg_ids={"1": "2", "2": "3"}, settled={"2": 7}), notes)
    assert {pg: (p.enqueued, p.completed) for pg, p in state.progress.items()} == \
        {"2": (12, 12), "3": (7, 7)}
    assert notes.cut["unnamed_group"] == 1  # id 5: no record of it was ever paired


def test_a_reporter_without_the_map_keeps_the_keys_torch_wrote() -> None:
    state = parse_state(_state(), Notes())
    assert sorted(state.progress) == ["1", "2", "5"]


@pytest.mark.parametrize("bad", [{"x": "1"}, {"-1": "1"}, ["1"], {"1": 7}])
def test_a_malformed_map_refuses_the_document(bad: object) -> None:
    with pytest.raises(SchemaError):
        parse_state(_state(pg_ids=bad), Notes())


def test_a_huge_map_is_cut_and_names_are_sanitised() -> None:
    notes = Notes()
    names = {str(i): f"g{i}" for i in range(10_000)} | {"1": "evil\"}\n{name"}
    state = parse_state(_state(pg_ids=names), notes)
    assert notes.cut["groups"] == 10_000 - 64
    assert "evil____name" in state.progress and notes.sanitised["pg"] == 1


def test_an_entries_segment_pairs_ids_and_names_from_its_own_records() -> None:
    segment = {"written_ns": 5, "first_record": 0, "last_record": 0,
               "pg_status": {"2": {"last_enqueued_collective": 3,
                                   "last_completed_collective": 3}},
               "entries": [{"record_id": 0, "pg_id": 2, "process_group": ["3", "mesh_tp"],
                            "collective_seq_id": 3, "profiling_name": "gloo:all_reduce",
                            "time_created_ns": 1, "state": "scheduled"}]}
    _, dump = parse_segment(json.dumps(segment).encode(), Notes())
    assert list(dump.progress) == ["3"] and dump.entries[0].pg == "3"


def test_the_reporter_learns_pairs_and_spends_one_ring_read_per_new_id() -> None:
    ids = GroupIds()
    assert ids.unknown({"1": (1, 1), "2": (1, 1)})
    ids.learn([{"pg_id": 1, "process_group": ["2", "mesh_dp"]}, {"pg_id": "x"}, None,
               ("2", "3")])
    assert ids.names == {"1": "2", "2": "3"}
    assert ids.unknown({"1": (1, 1), "2": (1, 1), "9": (1, 1)})
    assert not ids.unknown({"9": (2, 2)})  # no record of 9 was found: no read every tick
    assert pair({"pg_id": True, "process_group": ["1"]}) is None
