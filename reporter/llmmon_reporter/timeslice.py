"""Keeps the reporter's own Python work in short stretches, so the training thread never waits.

A thread that holds the GIL keeps it until it blocks or until another thread has waited a whole
switch interval (5 ms by default) and asks for it.  A reporter tick that decodes and re-encodes
2,000 records (30 ms of Python) therefore costs the training thread up to 5 ms at a time, and a
single C call (`json.loads`, `pickle.loads` of the whole ring: 16-17 ms) costs it the whole call.
The reporter instead works in stretches of at most `BUDGET` and sleeps `PAUSE` between them,
which hands the GIL to a waiting thread at once; and it decodes a ring record by record
(`decode`) rather than in one call, keeping of each record only what the caller's `keep` makes
of it.  Holding the whole decoded ring (tens of thousands of lists and dicts) would also start
the collector: one full collection of a trainer's heap took 107 ms with the GIL held.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Iterable

BUDGET = 0.0005  # seconds of work between pauses
PAUSE = 0.0002  # long enough for a thread woken by the released GIL to take it

Keep = Callable[[Any], Any]  # an element -> what to keep of it, or None to drop it
# (the text, the position after the array's first element) -> where to go on decoding: a later
# element's start, which skips the elements between unread, or the position it was given
Seek = Callable[[str, int], int]
_decoder = json.JSONDecoder()
_WHITESPACE = json.decoder.WHITESPACE  # type: ignore[attr-defined]


class TimeSlice:
    """Call it between small pieces of work; it pauses once `budget` has passed since the last
    pause (or `start`)."""

    def __init__(self, budget: float = BUDGET, pause: float = PAUSE,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.budget, self.pause, self._clock = budget, pause, clock
        self._since = clock()
        self.pauses = 0

    def start(self) -> None:
        self._since = self._clock()

    def __call__(self) -> None:
        if self._clock() - self._since >= self.budget:
            time.sleep(self.pause)
            self.pauses += 1
            self._since = self._clock()


def sift(items: Iterable[Any], keep: Keep | None, pace: TimeSlice | None) -> list[Any]:
    """What `keep` makes of each item (None: dropped), with `pace` after each."""
    kept: list[Any] = []
    for item in items:
        _take(item, keep, kept, pace)
    return kept


def _take(item: Any, keep: Keep | None, kept: list[Any], pace: TimeSlice | None) -> None:
    mine = item if keep is None else keep(item)
    if mine is not None:
        kept.append(mine)
    if pace is not None:
        pace()


def decode(blob: bytes, pace: TimeSlice, array: str = "entries",
           keep: Keep | None = None, seek: Seek | None = None) -> dict[str, Any]:
    """A JSON object whose `array` member is decoded one element at a time, with `pace`
    between elements, and holds what `keep` makes of each (None: dropped; no `keep`: the
    element); each decoded element is freed before the next.  After the first element `seek`
    may skip elements unread (see `Seek`).  The other members are decoded whole (they are
    small).  Raises ValueError on anything that is not such an object."""
    text = blob.decode()
    doc: dict[str, Any] = {}
    pos = _skip(text, 0)
    pos = _expect(text, pos, "{")
    if text[pos:pos + 1] == "}":
        return doc
    while True:
        key, pos = _decoder.raw_decode(text, pos)
        if not isinstance(key, str):
            raise ValueError(f"object key expected at {pos}")
        pos = _expect(text, pos, ":")
        if key == array and text[pos:pos + 1] == "[":
            doc[key], pos = _array(text, pos, pace, keep, seek)
        else:
            doc[key], pos = _decoder.raw_decode(text, pos)
        pos = _skip(text, pos)
        if text[pos:pos + 1] == "}":
            return doc
        pos = _expect(text, pos, ",")


def _array(text: str, pos: int, pace: TimeSlice, keep: Keep | None,
           seek: Seek | None) -> tuple[list[Any], int]:
    kept: list[Any] = []
    pos = _expect(text, pos, "[")
    if text[pos:pos + 1] == "]":
        return kept, pos + 1
    while True:
        item, pos = _decoder.raw_decode(text, pos)
        _take(item, keep, kept, pace)
        pos = _skip(text, pos)
        if text[pos:pos + 1] == "]":
            return kept, pos + 1
        moved = seek(text, pos) if seek is not None else pos
        pos = moved if moved != pos else _expect(text, pos, ",")
        seek = None  # after the first element only


def element_at(text: str, start: int) -> Any:
    """The JSON value starting at `start` if `start` begins an element of an array (the last
    character before it, whitespace aside, is a comma), else None: a `Seek` checks its guess
    with it (a guess inside a string decodes to nothing or to the wrong value)."""
    before = start - 1
    while before >= 0 and text[before] in " \t\n\r":
        before -= 1
    if before < 0 or text[before] != ",":
        return None
    try:
        return _decoder.raw_decode(text, start)[0]
    except ValueError:
        return None


def _skip(text: str, pos: int) -> int:
    return _WHITESPACE.match(text, pos).end()


def _expect(text: str, pos: int, char: str) -> int:
    """Past `char` and the whitespace after it."""
    pos = _skip(text, pos)
    if text[pos:pos + 1] != char:
        raise ValueError(f"{char!r} expected at {pos}")
    return _skip(text, pos + 1)
