"""gloo groups whose collectives are done though pg_status says they are not.

gloo sets last_completed_collective as each work finishes: two collectives in flight finishing
out of order leave it one behind for good (DDP's overlapped buckets, any `async_op=True` pair,
even back-to-back blocking calls), so an idle group would read as stuck in a collective that is
done, and a group stuck in its next one as stuck in the one before (a desync at #121 read as
all ranks agreeing on #120).  The ring says otherwise: a group is done up to just before its
oldest unfinished record after `completed`, or up to `enqueued` when it has none.

One read is not proof.  gloo sets last_enqueued_collective before it records the collective in
the ring (ProcessGroupGloo::enqueue), so a status read between the two, with the ring read
after it, shows a collective neither in flight nor recorded: settled on that, a rank that then
waits in it for good reads as done with it, and a real hang goes unseen.  A group is settled
when two ring reads in a row, each after its own status read, agree.
"""

from __future__ import annotations

import json
from typing import Mapping

Progress = Mapping[str, tuple[int, int]]  # pg -> (last enqueued, last completed)

# gloo's completed sequence number lags by fewer than the works it runs at once (2 threads by
# default); a group further behind is settled only by its own completions.
MAX_SETTLED = 8


def final(progress: Progress, active: bytes) -> dict[str, int]:
    """pg -> the sequence number it is done up to, where that is past what `progress` says it
    completed: just before its oldest record in `active` (the ring's unfinished records, read
    after the status) after `completed`, else its last enqueued."""
    unfinished: dict[str, list[int]] = {}
    for entry in json.loads(active).get("entries") or ():
        # pg_status is keyed by the group's id in this process, as each record's pg_id is (its
        # process_group names the group job-wide: llmmon_reporter.groupids)
        if not entry.get("is_p2p") and type(entry.get("pg_id")) is int:
            unfinished.setdefault(str(entry["pg_id"]), []).append(
                entry.get("collective_seq_id", -1))
    done: dict[str, int] = {}
    for pg, (enqueued, completed) in progress.items():
        if 0 < enqueued - completed <= MAX_SETTLED:
            upto = min((seq - 1 for seq in unfinished.get(pg, ()) if completed < seq <= enqueued),
                       default=enqueued)
            if upto > completed:
                done[pg] = upto
    return done


class Settled:
    """What the ring showed final, twice in a row, per group (`seqs`: pg -> sequence number)."""

    def __init__(self) -> None:
        self.seqs: dict[str, int] = {}
        self._once: dict[str, int] = {}

    def observe(self, progress: Progress, active: bytes) -> None:
        """One ring read (`active`) after the status read that gave `progress`."""
        seen = final(progress, active)
        self.seqs.update({pg: seq for pg, seq in seen.items() if self._once.get(pg) == seq})
        self._once = seen

    def apply(self, progress: Progress) -> dict[str, tuple[int, int]]:
        """`progress` with what was settled; a group whose sequence numbers went back below
        what was settled (destroyed and created again under its name) forgets it."""
        for pg in [pg for pg, seq in self.seqs.items()
                   if pg not in progress or progress[pg][0] < seq]:
            del self.seqs[pg]
        return {pg: (enqueued, max(completed, self.seqs.get(pg, -1)))
                for pg, (enqueued, completed) in progress.items()}
