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
"""

from __future__ import annotations

from collections import Counter
from typing import AbstractSet, Any, Callable, Iterable

from llmmon.ranks import collectives
from llmmon.ranks.ledger import Enqueued, RankTrack
from llmmon.ranks.spans import spans_text


def compared(entry: Enqueued) -> str:
    """What must agree across the group's ranks."""
    if collectives.family(entry.coll) == "all_to_all" or entry.coll.endswith("_v"):
        return f"{entry.coll} {entry.dtype}".rstrip()
    return entry.signature


HISTORY = 64  # earlier sequence numbers of the group a tie is judged against


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
