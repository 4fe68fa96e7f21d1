"""What a rank's exception says: a peer failed, and the collective it failed in.

gloo counts a collective that raised as completed (its Flight Recorder record retired, the
group's completed number past it), so a rank that died in one would read as having finished
it, and what it issued there would never be compared with its peers'.  That hides a desync by
size: gloo aborts the rank that receives the odd size at once, and every other rank raises in
that collective.  The reporter ships the newest record with an exception's exit record; when
the exception came from communication, that collective did not complete.
"""

from __future__ import annotations

import dataclasses
import re

from llmmon.ranks.validate import RankState

# A peer that died or left shows up in the survivors as one of these (gloo, NCCL, c10d).
PEER_FAILURE = re.compile(r"connection (closed|reset)|broken pipe|peer|DistBackendError|"
                          r"DistNetworkError|remote process|NCCL (error|communicator)|"
                          r"timed? ?out|abort", re.IGNORECASE)
# An exception that came out of a collective: a peer's failure, or the backend's own error.
COMMUNICATION = re.compile(rf"{PEER_FAILURE.pattern}|gloo|c10d|NCCL|collective", re.IGNORECASE)


def failed_in(state: RankState) -> RankState:
    """The state with the collective its communication error came from not completed."""
    end = state.exit
    if end is None or end.how != "exception" or end.collective is None \
            or not COMMUNICATION.search(end.error):
        return state
    inside = end.collective
    group = state.progress.get(inside.pg)
    if inside.is_p2p or group is None or group.completed < inside.seq:
        return state  # in flight already (NCCL), or not a group it reports
    return dataclasses.replace(state, progress={
        **state.progress, inside.pg: dataclasses.replace(group, completed=inside.seq - 1)})
