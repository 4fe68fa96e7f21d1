"""What the reporter costs the training thread: its own Python work comes in short stretches
(tests of `entrylog` and `pace` on rings; tests/slow/ranks/test_trainer_gil.py runs torch)."""

from __future__ import annotations

import json

import pytest

from llmmon_reporter import entrylog, timeslice
from tests.conftest import ROOT

H200_DUMP = ROOT / "tests" / "fixtures" / "nccl" / "h200_flight_recorder.json"

def _h200_dump() -> bytes:
    """The H200 capture's records (NCCL, with stack frames) in the dump's own layout."""
    capture = json.loads(H200_DUMP.read_text())["trace"]
    return json.dumps({"version": capture["version"], "pg_config": capture["pg_config"],
                       "pg_status": capture["pg_status"],
                       "entries": capture["entries_head"] + capture["entries_tail"]}).encode()


def test_decode_equals_json_loads_on_a_real_dump_and_pauses_between_records() -> None:
    blob = _h200_dump()
    clock = iter(range(10**6)).__next__  # every call a "second" later: pause after each record
    paced = timeslice.TimeSlice(budget=1, pause=0, clock=lambda: float(clock()))
    whole = json.loads(blob)
    assert timeslice.decode(blob, paced) == whole
    assert paced.pauses == len(whole["entries"]) > 1


def test_decode_keeps_only_what_keep_makes_of_each_record() -> None:
    blob = _h200_dump()
    whole = json.loads(blob)
    ids = timeslice.decode(blob, timeslice.TimeSlice(), keep=lambda e: e["record_id"] % 2 or None)
    assert ids["entries"] == [e["record_id"] % 2 for e in whole["entries"] if e["record_id"] % 2]
    assert ids["pg_status"] == whole["pg_status"]


def _ring(records: list[dict]) -> bytes:
    """A ring as torch's C++ dump writes it: compact, keys sorted (nlohmann::json)."""
    return json.dumps({"entries": records, "pg_status": {"0": {"last_enqueued_collective": 1}},
                       "version": "2.10"}, separators=(",", ":"), sort_keys=True).encode()


def _records(ids: list[int]) -> list[dict]:
    """The H200 capture's records, renumbered to `ids` (torch numbers records one by one)."""
    capture = json.loads(H200_DUMP.read_text())["trace"]
    records = capture["entries_head"] + capture["entries_tail"]
    return [{**records[i % len(records)], "record_id": record} for i, record in enumerate(ids)]


def _tick(blob: bytes, after: int) -> tuple[list, list, int]:
    """What a ring tick ships after `after` (records, [first, last, pending]) and how many
    records it decoded (a pause after each: the clock moves a second a call)."""
    clock = iter(range(10**6)).__next__
    counted = timeslice.TimeSlice(budget=1, pause=0, clock=lambda: float(clock()))
    selection = entrylog._Selection(after)
    kept = timeslice.decode(blob, counted, keep=selection, seek=selection.seek)["entries"]
    return kept, [selection.first, selection.last, selection.pending], counted.pauses


def _sifted(blob: bytes, after: int) -> tuple[list, list]:
    selection = entrylog._Selection(after)
    kept = timeslice.sift(json.loads(blob)["entries"], selection, None)
    return kept, [selection.first, selection.last, selection.pending]


def test_a_ring_tick_decodes_only_the_records_after_those_it_shipped() -> None:
    records = _records(list(range(500, 700)))
    records[195].update(state="started", retired=False, duration_ms=None)  # still in flight
    blob = _ring(records)
    kept, ids, decoded = _tick(blob, 689)
    assert (kept, ids) == _sifted(blob, 689)
    assert ids == [500, 699, [695]] and len(kept) == 10
    assert decoded == 12  # the first record, then 689-699; not the 188 between
    assert _tick(blob, 699) == ([], [500, 699, []], 2)  # nothing new: two records read
    assert _tick(blob, 400)[2] == 200  # everything is new: everything is read


def test_a_ring_that_turned_over_ships_its_newest_records_and_decodes_no_more() -> None:
    # 2,000 records newer than the last one shipped (a job issuing thousands of collectives a
    # second): the tick decodes the first record, then jumps to the 500 newest
    records = _records(list(range(10_000, 12_000)))
    blob = _ring(records)
    clock = iter(range(10**6)).__next__
    counted = timeslice.TimeSlice(budget=1, pause=0, clock=lambda: float(clock()))
    selection = entrylog._Selection(5_000)
    kept = timeslice.decode(blob, counted, keep=selection, seek=selection.seek)["entries"]
    assert counted.pauses == 502  # the first record, record 11,499 (dropped), 11,500-11,999
    assert (selection.first, selection.last, selection.cut) == (10_000, 11_999, 11_500)
    assert selection.drop_first and len(kept) == 501  # the first record, left out by write
    assert [json.loads(k)["record_id"] for k in kept[1:]] == list(range(11_500, 12_000))
    # the newest shipped (10,900) still in the ring: the first record was not kept, none drops
    selection = entrylog._Selection(10_900)
    kept = timeslice.decode(blob, timeslice.TimeSlice(), keep=selection,
                            seek=selection.seek)["entries"]
    assert not selection.drop_first and selection.cut == 11_500
    assert [json.loads(k)["record_id"] for k in kept] == list(range(11_500, 12_000))


@pytest.mark.parametrize("case", ["a brace in a string", "a gap in the ids", "spaced"])
def test_a_ring_tick_whose_guess_fails_reads_every_record_and_ships_the_same(case: str) -> None:
    ids = list(range(500, 700)) if case != "a gap in the ids" else \
        [*range(500, 689), *range(690, 701)]
    records = _records(ids)
    # a record's own string holding a brace (before its id: keys are sorted) misleads the
    # guess of where the record starts; so would a string that spells another record's key
    records[188]["profiling_name"] = 'x{"record_id":689,'
    records[189]["process_group"] = ["0", "desc,{ with braces }"]
    blob = _ring(records) if case != "spaced" else json.dumps(
        {"entries": records, "version": "2.10"}, indent=1).encode()
    kept, ids_seen, decoded = _tick(blob, 689)
    assert (kept, ids_seen) == _sifted(blob, 689)
    assert decoded == 200


@pytest.mark.parametrize("blob", [b'{ "entries" : [ {"a": 1} , {"b": [2]} ] , "v": "x" }',
                                  b'{"entries":[]}', b"{}", b'{"entries": 5}'])
def test_decode_takes_any_spacing_and_shape_json_does(blob: bytes) -> None:
    assert timeslice.decode(blob, timeslice.TimeSlice()) == json.loads(blob)


@pytest.mark.parametrize("blob", [b"", b"[]", b'{"entries":[1,]}', b'{"entries":[1}',
                                  b'{"a":1,}', b'{"a" 1}', b"\xff"])
def test_decode_refuses_what_is_not_a_json_object(blob: bytes) -> None:
    with pytest.raises(ValueError):
        timeslice.decode(blob, timeslice.TimeSlice())
