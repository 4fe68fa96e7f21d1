"""The reporter's activity, stack, blocked and exit blocks through the real parser: typed, or
refused (a bad `blocked` item dropped alone); and what the daemon makes of them (the collective
an exception came from)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmmon.ranks.culprit import where
from llmmon.ranks.failure import failed_in
from llmmon.ranks.validate import MAX_BLOCKED, Notes, PeerWait, SchemaError, parse_state
from tests.conftest import FIXTURES

STATE = json.loads((FIXTURES / "spool" / "bad" / "good" / "rank_0.1000.json").read_text())
SITE = "/usr/lib/python3/site-packages/torch/serialization.py"


def parsed(**blocks: Any):  # type: ignore[no-untyped-def]
    return parse_state(json.dumps({**STATE, **blocks}).encode(), Notes())


@pytest.mark.parametrize("block, value, message", [
    ("stack", "main", "stack: expected a list"),
    ("stack", [{"file": "a.py", "line": -1}], "line: expected an integer"),
    ("exit", {"ns": 1, "code": 300}, "exit.code: expected an integer in \\[-255, 255\\]"),
    ("activity", {"cpu_seconds": "x"}, "cpu_seconds: expected a finite number"),
])
def test_a_malformed_block_refuses_the_document_with_the_reason(block: str, value: Any,
                                                                message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        parsed(**{block: value})


def test_where_names_the_jobs_own_frame_and_the_library_call_it_is_in() -> None:
    state = parsed(stack=[
        {"file": SITE, "line": 900, "function": "_save", "module": "torch.serialization"},
        {"file": SITE, "line": 650, "function": "save", "module": "torch.serialization"},
        {"file": "/job/ckpt.py", "line": 12, "function": "save_checkpoint", "module": "ckpt"},
        {"file": "/job/train.py", "line": 80, "function": "main", "module": "__main__"}],
        exit={"ns": 2_000_000_000, "how": "exception", "code": 1, "error": "ValueError: x"})
    assert where(state.stack) == "save (torch.serialization) from save_checkpoint (ckpt.py:12)"
    assert (state.exit.at, state.exit.how, state.exit.code) == (2.0, "exception", 1)
    loader = parsed(stack=[{"file": "/job/data.py", "line": 41, "function": "load_next_batch",
                            "module": "data"}])
    assert where(loader.stack) == "load_next_batch (data.py:41)"
    assert parsed().stack is None and parsed().activity is None and parsed().exit is None


RECV = {"op": "recv", "peer": 2, "pg": "0"}


def test_blocked_ops_are_typed_and_absent_without_a_stack() -> None:
    state = parsed(blocked=[RECV, {"op": "all_reduce", "peer": None, "pg": "1"}])
    assert state.blocked == (PeerWait("recv", 2, "0"), PeerWait("all_reduce", None, "1"))
    assert parsed().blocked == () and parsed(blocked=None).blocked == ()


@pytest.mark.parametrize("item", [
    "recv", 7, None, [RECV],  # not an object
    {"peer": 1, "pg": "0"}, {**RECV, "op": 5}, {**RECV, "pg": ["0"]},  # op and pg: strings
    {**RECV, "peer": -1}, {**RECV, "peer": 1 << 40}, {**RECV, "peer": True},
    {**RECV, "peer": 1.5}, {**RECV, "peer": {}},  # peer: a rank or null
])
def test_a_malformed_blocked_item_is_dropped_alone(item: Any) -> None:
    notes = Notes()
    state = parse_state(json.dumps({**STATE, "blocked": [item, RECV]}).encode(), notes)
    assert state.blocked == (PeerWait("recv", 2, "0"),)
    assert notes.dropped == 1 and notes.first_drop.startswith("blocked: ")
    assert state.identity.rank == STATE["identity"]["rank"] and state.groups


@pytest.mark.parametrize("blocked", ["recv", {"op": "recv"}, 3, True])
def test_a_blocked_block_that_is_no_list_is_dropped_and_the_state_stands(blocked: Any) -> None:
    notes = Notes()
    state = parse_state(json.dumps({**STATE, "blocked": blocked}).encode(), notes)
    assert state.blocked == () and notes.dropped == 1 and state.groups


def test_blocked_is_bounded_in_items_and_in_each_strings_alphabet_and_length() -> None:
    notes = Notes()
    state = parse_state(json.dumps({**STATE, "blocked": [RECV] * 10_000 + [
        {"op": "x" * 100_000, "peer": 0, "pg": "p/g\n" * 50_000}]}).encode(), notes)
    assert state.blocked == (PeerWait("recv", 2, "0"),) * MAX_BLOCKED
    assert notes.cut["blocked"] == 10_001 - MAX_BLOCKED
    wild = parse_state(json.dumps({**STATE, "blocked": [
        {"op": "Recv " + "x" * 100_000, "peer": 0, "pg": "p/g\n" * 50_000}]}).encode(), notes)
    assert wild.blocked == (PeerWait("_ecv_" + "x" * 43, 0, ("p_g_" * 16)),)
    assert notes.sanitised["coll"] == notes.sanitised["pg"] == 1


def _lagging(settled: Any) -> Any:  # type: ignore[no-untyped-def]
    """Group 0 enqueued #5 and completed #3 by pg_status; the reporter settled `settled`."""
    status = {"pg_status": {"0": {"last_enqueued_collective": "5", "last_started_collective":
                                  "-1", "last_completed_collective": "3"}}}
    return parsed(status=status, settled=settled).progress["0"]


@pytest.mark.parametrize("settled, completed", [
    (None, 3), ({}, 3), ({"0": 5}, 5), ({"0": 4}, 4),
    ({"0": 2}, 3),  # behind what torch says: torch's number stands
    ({"0": 6}, 3),  # past what the group enqueued: settles nothing
    ({"7": 5}, 3),  # another group's
])
def test_the_reporters_settled_sequence_number_moves_completed_within_what_was_enqueued(
        settled: Any, completed: int) -> None:
    assert _lagging(settled).completed == completed


@pytest.mark.parametrize("settled, message", [
    ([5], "settled: expected an object"),
    ({"0": "five"}, "settled.0: expected an integer"),
    ({"0": 1 << 70}, "settled.0: expected an integer"),
])
def test_a_malformed_settled_block_refuses_the_document(settled: Any, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        _lagging(settled)


RECORD = {"record_id": 40, "pg_id": 0, "process_group": ["0", "default_pg"],
          "collective_seq_id": 5, "is_p2p": False, "profiling_name": "gloo:all_reduce",
          "input_sizes": [[72]], "input_dtypes": ["Float"], "output_sizes": [[72]],
          "output_dtypes": ["Float"], "time_created_ns": 1_000, "state": "scheduled",
          "retired": True}  # gloo's record of an all-reduce that raised: retired, "completed"
RESET = "RuntimeError: [../gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer"


def _died(error: str, record: Any = RECORD, how: str = "exception") -> Any:
    """A rank whose pg_status says #5 enqueued and completed, ended with `error` in `record`."""
    status = {"pg_status": {"0": {"last_enqueued_collective": "5", "last_started_collective":
                                  "-1", "last_completed_collective": "5"}}}
    notes = Notes()
    state = parse_state(json.dumps({**STATE, "status": status, "exit": {
        "ns": 1, "how": how, "code": 1, "error": error, "collective": record}}).encode(), notes)
    return failed_in(state), notes


@pytest.mark.parametrize("error, how, completed", [
    (RESET, "exception", 4),  # the collective it raised in did not complete
    ("DistBackendError: NCCL communicator was aborted", "exception", 4),
    ("ValueError: bad batch", "exception", 5),  # its own code raised after #5 completed
    ("", "exit", 5),  # sys.exit: no collective failed
])
def test_a_rank_that_died_of_a_communication_error_did_not_complete_its_newest_collective(
        error: str, how: str, completed: int) -> None:
    state, notes = _died(error, how=how)
    assert state.progress["0"].completed == completed
    assert state.exit.collective.seq == 5 and state.exit.collective.nbytes == 288
    assert not notes.dropped


def test_a_malformed_exit_collective_is_dropped_and_the_end_still_counts() -> None:
    state, notes = _died(RESET, record={**RECORD, "collective_seq_id": "five"})
    assert state.exit is not None and state.exit.collective is None
    assert state.progress["0"].completed == 5
    assert notes.dropped


def test_a_light_rank_is_not_said_idle_for_longer_than_since_it_last_enqueued() -> None:
    """Under 2 % of a core the reporter never marks the CPU active: the rank's own progress,
    noted by the daemon, says it ran."""
    from llmmon.ranks.culprit import doing
    from llmmon.ranks.ledger import RankTrack

    activity = {"cpu_seconds": 1.0, "read_bytes": 0, "written_bytes": 0,
                "voluntary_switches": 0, "involuntary_switches": 0,
                "cpu_active_ns": 1_000 * 10**9, "io_active_ns": 1_000 * 10**9}
    track = RankTrack(parsed(activity=activity), mtime=1_060.0)
    track.note_progress(1_000.0)
    track.state = parsed(activity=activity, status={"pg_status": {"0": {
        "last_enqueued_collective": 99, "last_completed_collective": 98}}})
    track.note_progress(1_033.0)  # it enqueued #99 at 1033 s, its CPU "last active" at 1000 s
    seen = doing(track, None, 1_060.0, 60.0, 30.0)
    assert seen.cpu_idle == 27.0, seen


def test_a_busy_rank_says_what_it_moved_even_when_neither_direction_passes_a_megabyte() -> None:
    from llmmon.ranks.culprit import Doing

    said = Doing("x", "sleeping", 5.0, 1.0, 4e5, 7e5, True, False).text(185, 0.1)
    assert "writing 700.0 kB in 185 s: busy" in said, said
