"""The reporter settles a gloo group only when two ring reads in a row show it done.

gloo sets last_enqueued_collective before it records the collective in the ring: a status read
in between, with the ring read after it, sees the newest collective neither in flight nor
recorded.  Settled on that one read, ranks that then wait in it for good read as done with it
(tests/slow/ranks/test_hang.py timed out that way in CI once).
"""

from __future__ import annotations

import json

from llmmon_reporter.settle import Settled


def ring(*seqs: int, pg: str = "0", name: str | None = None) -> bytes:
    """The reporter's `active` read: unfinished records of the group whose id in this process
    is `pg` (named `name`, by default the same), as the ring holds them."""
    return json.dumps({"entries": [
        {"pg_id": int(pg), "process_group": [name or pg, "default_pg"],
         "collective_seq_id": s, "is_p2p": False,
         "profiling_name": "gloo:all_reduce", "state": "scheduled"} for s in seqs]}).encode()


def test_a_collective_enqueued_but_not_yet_in_the_ring_is_not_settled_on_one_read() -> None:
    settled = Settled()
    settled.observe({"0": (21, 20)}, ring())  # status said #21; the ring has no record yet
    assert settled.apply({"0": (21, 20)}) == {"0": (21, 20)}
    settled.observe({"0": (21, 20)}, ring(21))  # now recorded, and in flight: a wait
    settled.observe({"0": (21, 20)}, ring(21))
    assert settled.apply({"0": (21, 20)}) == {"0": (21, 20)} and settled.seqs == {}


def test_two_reads_in_a_row_that_agree_settle_a_group_whose_works_finished_out_of_order(
        ) -> None:
    settled = Settled()
    for _ in range(2):
        settled.observe({"0": (41, 40), "1": (10, 10)}, ring(7, pg="1"))
    assert settled.apply({"0": (41, 40), "1": (10, 10)}) == {"0": (41, 41), "1": (10, 10)}
    assert settled.seqs == {"0": 41}


def test_reads_that_disagree_on_the_sequence_number_settle_nothing() -> None:
    settled = Settled()
    settled.observe({"0": (41, 40)}, ring())
    settled.observe({"0": (43, 42)}, ring())  # the group moved on between the reads
    assert settled.seqs == {}
    settled.observe({"0": (43, 42)}, ring())
    assert settled.seqs == {"0": 43}


def test_a_group_too_far_behind_or_recreated_below_what_was_settled_is_not_settled() -> None:
    settled = Settled()
    for _ in range(2):
        settled.observe({"0": (30, 20)}, ring())  # 10 behind: more than gloo runs at once
    assert settled.seqs == {}
    for _ in range(2):
        settled.observe({"0": (41, 40)}, ring())
    assert settled.apply({"0": (3, 2)}) == {"0": (3, 2)} and settled.seqs == {}


def test_a_group_stuck_in_its_next_collective_is_settled_up_to_the_one_before() -> None:
    # rank 0 of a desync at #121 (CI, once): #120 finished, but completed read 119 for good;
    # unsettled, the group looked stuck at #120, where every rank issued the same all_reduce
    settled = Settled()
    settled.observe({"0": (121, 119)}, ring(121))
    assert settled.apply({"0": (121, 119)}) == {"0": (121, 119)}  # one read is not proof
    settled.observe({"0": (121, 119)}, ring(121))
    assert settled.apply({"0": (121, 119)}) == {"0": (121, 120)}
    for _ in range(2):
        settled.observe({"0": (124, 119)}, ring(121, 123))
    assert settled.apply({"0": (124, 119)}) == {"0": (124, 120)}  # up to its oldest unfinished


def test_records_are_matched_to_pg_status_by_the_group_id_not_its_name() -> None:
    """On a mesh the tp group is id 2 in this process and named "3" job-wide; its record in
    flight must hold the group unsettled (looked up by name under the id, none was found and
    the wait was completed away)."""
    settled = Settled()
    for _ in range(3):
        settled.observe({"2": (1111, 1110), "3": (40, 40)}, ring(1111, pg="2", name="3"))
    assert settled.apply({"2": (1111, 1110)}) == {"2": (1111, 1110)} and settled.seqs == {}
