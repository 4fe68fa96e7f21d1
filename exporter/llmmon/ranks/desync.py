"""A desync: ranks of a group that issued different collectives at one sequence number.

Collectives are matched by sequence number, so every rank of a group must issue the same
operation, element type and size at each one (SPMD); a rank that issued another (a broadcast
where its peers all-reduce, a tensor of another size) hangs the group or crashes it.  All-to-all
and the `_v` collectives carry per-rank sizes: only their operation and type must agree.  With
a strict majority the minority is the odd one out.  Without one (two ranks on a node that
disagree) the group's own history breaks the tie: training repeats its collectives every step,
so when exactly one of the signatures is one the group issued in its last HISTORY collectives
(or, failing that, exactly one of their operations: a broadcast in a job that only all-reduces),
the ranks that issued anything else are the odd ones.  Otherwise this node cannot tell, and the
rules decide across nodes from every rank's `llmmon_nccl_inflight_collective_info`.

A desync by size does not hang gloo: the rank that receives the odd tensor aborts (SIGABRT, no
exit record) within milliseconds, usually before its reporter records the collective, and its
peers raise in it.  That abort is the job's first end, but not its cause: `behind_abort` finds
the collective the aborted rank never completed and what its peers issued there, so the job's
end names the rank whose code path differs.  When the odd rank is the aborted rank's only peer
on this node, there is nothing to vote with: a collective the group had not issued before (in
all the daemon indexed of it), enqueued at most ABORT_WITHIN seconds before the abort, is taken
as the odd one (a watchdog's abort comes minutes into a wait, and its rank recorded the
collective it waited in).
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import AbstractSet, Any, Callable, Iterable

from llmmon.ranks import collectives
from llmmon.ranks.ending import End
from llmmon.ranks.ledger import Enqueued, RankTrack
from llmmon.ranks.spans import spans_text


def compared(entry: Enqueued) -> str:
    """What must agree across the group's ranks."""
    if collectives.family(entry.coll) == "all_to_all" or entry.coll.endswith("_v"):
        return f"{entry.coll} {entry.dtype}".rstrip()
    return entry.signature


HISTORY = 64  # earlier sequence numbers of the group a tie is judged against
ABORTED = (-6, None)  # SIGABRT, or an end without a record or status (its signal missed)
ABORT_WITHIN = 10.0  # s from a peer's odd collective to the abort that answered it


def before(tracks: Iterable[RankTrack], pg: str, seq: int) -> set[str]:
    """What the group issued (`compared`) at its HISTORY sequence numbers before `seq`."""
    return {compared(entry) for track in tracks
            for entry in map(track.index.get(pg, {}).get, range(seq - HISTORY, seq))
            if entry is not None}


def find(seq: int, issued: dict[int, Enqueued], before: AbstractSet[str] = frozenset()
         ) -> dict[str, Any] | None:
    """The desync at `seq` among the ranks that issued it (rank -> its entry), or None;
    `before`: what the group issued before it (`before()`)."""
    seen = {rank: compared(entry) for rank, entry in issued.items()}
    counts = Counter(seen.values()).most_common()
    if len(counts) < 2:
        return None
    majority, basis = (counts[0][0], "majority") if counts[0][1] > counts[1][1] else (None, "")
    if majority is None:
        signatures = [signature for signature, _ in counts]
        majority = _usual(signatures, before) or _usual(signatures, before, _operation)
        basis = "history" if majority else ""
    odd = sorted(r for r, s in seen.items() if s != majority) if majority else []
    return {"seq": seq, "issued": {str(r): issued[r].signature for r in sorted(issued)},
            "odd": odd, "majority": majority, "basis": basis}


def behind_abort(tracks: list[RankTrack], end: End) -> dict[str, Any] | None:
    """The desync that aborted `end`'s rank, or None.  At each collective of its groups after
    the last it reported completed (its reporter may have written a step or two earlier): peers
    here that issued something else (`find`, the aborted rank not among the odd ones), or its
    only issuers here issued what the group had not before, at most ABORT_WITHIN s before the
    abort.  `pg` and `said` (the clause the job's end quotes) are added."""
    if end.how != "vanished" or end.code not in ABORTED:
        return None
    mine = next(t for t in tracks if t.state.identity.rank == end.rank)
    for pg, progress in sorted(mine.state.progress.items()):
        members = [t for t in tracks if pg in t.state.progress]
        last = max(t.state.progress[pg].enqueued for t in members)

        @functools.cache
        def known(members: list[RankTrack] = members, pg: str = pg,
                  done: int = progress.completed) -> frozenset[str]:
            """What the group issued before: all the daemon indexed of it (the ring comes every
            20 s: the last HISTORY sequence numbers may hold none).  Read once, if needed: a
            job torn down without exit statuses asks this of every rank at every run."""
            return frozenset(compared(entry) for t in members
                             for number, entry in t.index.get(pg, {}).items()
                             if number <= done)

        for seq in range(max(progress.completed + 1, last - HISTORY), last + 1):
            issued = {t.state.identity.rank: entry for t in members
                      if (entry := t.index.get(pg, {}).get(seq)) is not None}
            found = _at(seq, issued, before(members, pg, seq), known, end) if issued else None
            if found is not None:
                return _said({**found, "pg": pg})
    return None


def _at(seq: int, issued: dict[int, Enqueued], recent: AbstractSet[str],
        known: Callable[[], AbstractSet[str]], end: End) -> dict[str, Any] | None:
    """`find` with the group's recent history (or all it is `known` to have issued), or a lone
    issue of something it is not known to have issued."""
    lone = {compared(entry) for entry in issued.values()}
    if len(lone) > 1:
        found = find(seq, issued, recent or known())
        return found if found and found["odd"] and end.rank not in found["odd"] else None
    created = min(entry.created_ns for entry in issued.values()) / 1e9
    if end.rank in issued or not 0 <= end.latest - created <= ABORT_WITHIN \
            or not known() or lone & known():
        return None
    return {"seq": seq, "odd": sorted(issued), "majority": None, "basis": "new",
            "after_seconds": round(end.latest - created, 3),
            "issued": {str(r): issued[r].signature for r in sorted(issued)}}


def _said(found: dict[str, Any]) -> dict[str, Any]:
    """`found` with `said`: what the odd ranks issued, against what (the job's end quotes it)."""
    odd = ", ".join(f"rank {r}" for r in found["odd"])
    against = ("which the group had not issued before"
               if found["basis"] == "new" else
               f"where the other ranks here issued {found['majority']}")
    return {**found, "said": f"{odd} issued {found['issued'][str(found['odd'][0])]} as "
                             f"collective #{found['seq']} of group {found['pg']}, {against}"}


def _operation(signature: str) -> str:
    return signature.split()[0]


def _usual(signatures: list[str], before: AbstractSet[str],
           key: Callable[[str], str] = str) -> str | None:
    """The one signature whose `key` is among those of `before`, if exactly one is."""
    known = {key(signature) for signature in before}
    usual = [signature for signature in signatures if key(signature) in known]
    return usual[0] if len(usual) == 1 else None


def text(found: dict[str, Any]) -> str:
    """The clause the group's summary gains."""
    issued = {int(r): s for r, s in found["issued"].items()}
    if found["odd"]:
        odd = found["odd"]
        theirs = "; ".join(f"rank {r} issued {issued[r]}" for r in odd)
        rest = sorted(set(issued) - set(odd))
        usual = ", as the group did before" if found.get("basis") == "history" else ""
        return (f"; a desync at #{found['seq']}: {theirs} where rank(s) {spans_text(rest)} "
                f"issued {found['majority']}{usual}")
    each = "; ".join(f"rank {r}: {s}" for r, s in sorted(issued.items()))
    return (f"; a desync at #{found['seq']}: the ranks here disagree ({each}) and none is the odd "
            f"one out on this node: the other nodes' ranks decide (LLMTrainingDesync)")
