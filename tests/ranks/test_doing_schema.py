"""The reporter's activity, stack and exit blocks through the real parser: typed, or refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmmon.ranks.culprit import where
from llmmon.ranks.schema import Notes, SchemaError, parse_state
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
