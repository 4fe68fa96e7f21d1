"""A job's wait-for graph across its process groups: who waits on whom, and who waits on nothing.

On a mesh every rank belongs to several groups (FSDP's dp, tensor parallel's tp, the pipeline's
stages, expert parallel's ep), and a rank that waits inside one group's operation looks, from
each of its other groups, like a rank that never arrived.  So blame is laid on the graph, not
on a group: each rank inside an operation (a collective in flight in the Flight Recorder, or,
where the recorder sees nothing, as for gloo's send and recv, the op its frames are blocked in)
waits on the members that have not entered it; the roots are the ranks those waits lead to that
wait on nothing themselves (stuck in Python, stopped, dead, busy).  Ranks waiting on each other
with no root is a deadlock of the program's order: a cycle, named as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from llmmon.ranks import dimension
from llmmon.ranks.validate import Group, PeerWait, Progress

MAX_EXPANDED = 4096  # members of a group listed from its spans; larger groups are not expanded


@dataclass(frozen=True)
class Wait:
    """One rank inside one operation, and whom it waits for."""

    rank: int
    pg: str
    desc: str  # the group's description as torch has it (mesh_tp, mesh_dp, ...)
    op: str  # all_reduce #812, recv
    on: tuple[int, ...]  # ranks followed here that have not entered it
    remote: bool  # it also waits for members on other nodes (not followed here)
    seen: str  # flight recorder, or frames

    @property
    def where(self) -> str:
        """`tp all_reduce #812 (group 3)`: the operation in the job's parallelism (a wait
        whose group is not known, as a stack read from outside shows: the operation alone)."""
        dim = dimension.of(self.desc)
        return (f"{dim} " if dim else "") + (f"{self.op} (group {self.pg})" if self.pg
                                              else self.op)

    def json(self) -> dict[str, object]:
        return {"rank": self.rank, "pg": self.pg, "pg_desc": self.desc, "op": self.op,
                "on": list(self.on), "remote": self.remote, "seen": self.seen}


@dataclass(frozen=True)
class Graph:
    """The waits of a job's ranks on this node, and what they lead to."""

    waits: Mapping[int, tuple[Wait, ...]]  # rank -> its waits (ranks that wait on nothing: none)
    roots: tuple[int, ...]  # ranks reached from a wait that wait on nothing themselves
    cycle: tuple[int, ...]  # ranks waiting on each other with no root among them
    remote: bool  # a wait leads off this node

    def waiting(self, rank: int) -> bool:
        return bool(self.waits.get(rank))


def members(group: Group | None, local: Iterable[int]) -> tuple[int, ...]:
    """A group's ranks from its spans (the reporters' list), else the ranks followed here."""
    if group is None or not group.ranks or group.size > MAX_EXPANDED or group.spans_cut:
        return tuple(sorted(local))
    return tuple(r for first, last in group.ranks for r in range(first, last + 1))


def collective_waits(pg: str, group: Group | None, progress: Mapping[int, Progress],
                     coll: Mapping[int, str]) -> list[Wait]:
    """Each member in flight in the group (`coll`: what it issued there, by rank) waits on the
    members that never entered its oldest uncompleted collective; where all that are followed
    here entered it, on the members of other nodes, if the group has any."""
    everyone = members(group, progress)
    elsewhere = any(r not in progress for r in everyone)
    desc = group.desc if group else ""
    waits = []
    for rank, mine in sorted(progress.items()):
        if mine.enqueued <= mine.completed:
            continue
        seq = mine.completed + 1
        behind = tuple(r for r, p in sorted(progress.items()) if r != rank and p.enqueued < seq)
        waits.append(Wait(rank, pg, desc, f"{coll.get(rank) or 'collective'} #{seq}", behind,
                          elsewhere and not behind, "flight recorder"))
    return waits


def frame_waits(rank: int, blocked: tuple[PeerWait, ...], groups: Mapping[str, Group],
                recorded: Iterable[str]) -> list[Wait]:
    """What the rank's frames show it blocked in, where the Flight Recorder shows nothing in
    flight: a send or receive waits on its peer; a collective (of a group not `recorded` in
    flight; a functional collective's wait names no group) on nobody known."""
    recorded = set(recorded)
    waits = []
    for item in blocked:
        group = groups.get(item.pg)
        if item.peer is None and (item.pg in recorded or not item.pg and recorded):
            continue  # the recorder's wait (on this group, or on one a wait names none of) says more
        on = () if item.peer is None or item.peer == rank else (item.peer,)
        waits.append(Wait(rank, item.pg, group.desc if group else "", item.op, on, False,
                          "frames"))
    return waits


def graph(waits: Iterable[Wait], local: Iterable[int]) -> Graph:
    """The roots and any cycle of `waits` among the ranks followed here (`local`); a wait on
    a rank not followed here leads off the node."""
    local = set(local)
    by_rank: dict[int, tuple[Wait, ...]] = {}
    for wait in waits:
        by_rank[wait.rank] = by_rank.get(wait.rank, ()) + (wait,)
    edges = {rank: {r for w in ws for r in w.on} for rank, ws in by_rank.items()}
    remote = any(w.remote or any(r not in local for r in w.on) for ws in by_rank.values()
                 for w in ws)
    reached: set[int] = set()
    todo = [r for targets in edges.values() for r in targets]
    while todo:
        rank = todo.pop()
        if rank in reached or rank not in local:
            continue
        reached.add(rank)
        todo.extend(edges.get(rank, ()))
    roots = tuple(sorted(r for r in reached if r not in by_rank))
    return Graph(by_rank, roots, () if roots else _cycle(edges), remote)


def _cycle(edges: Mapping[int, set[int]]) -> tuple[int, ...]:
    """Ranks on a cycle of waits (the smallest rank first), if there is one."""
    for start in sorted(edges):
        path, seen, rank = [start], {start}, start
        while True:
            nexts = sorted(r for r in edges.get(rank, ()) if r in edges)
            if not nexts:
                break
            rank = nexts[0]
            if rank in seen:
                loop = path[path.index(rank):]
                first = loop.index(min(loop))
                return tuple(loop[first:] + loop[:first])
            path.append(rank)
            seen.add(rank)
    return ()
