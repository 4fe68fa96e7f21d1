"""Which torch.distributed operation the training thread is blocked in, read from its frames.

gloo's Flight Recorder records no point-to-point op and pg_status does not move for one, so a
pipeline stage waiting in `recv` for its neighbour looks idle, not waiting.  Its Python frames
still say it: `send`/`recv` in distributed_c10d hold the peer and group as locals, and the
pipelining schedules hold the `P2POp` list they wait on.  This reads those locals from the
reporter thread (no monkeypatching, no collective, no import of torch) and returns a short
JSON-able list: `{"op": "recv", "peer": 2, "pg": "0"}` for a p2p op (peer a global rank, None
for a receive from any source; pg the group's name, as the Flight Recorder writes it), and
`{"op": "all_reduce", "peer": None, "pg": "0"}` for a collective.
"""

from __future__ import annotations

from types import FrameType
from typing import Any, Iterable

MAX_OPS = 16
MAX_TEXT = 200
MAX_DEPTH = 24  # frames walked; a blocked call is innermost, its schedule a few frames out
MAX_SCAN = 64  # items of one local list looked at for P2POps

_C10D = "torch.distributed.distributed_c10d"
_FUNCTIONAL = "torch.distributed._functional_collectives"
# c10d function -> the op it is and its locals naming the peer (global, group-local)
_PEERS = {"send": ("send", "dst", "group_dst"), "isend": ("send", "dst", "group_dst"),
          "recv": ("recv", "src", "group_src"), "irecv": ("recv", "src", "group_src")}
_COLLECTIVES = frozenset((
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
    "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "broadcast", "reduce", "gather", "scatter", "barrier",
    "monitored_barrier"))
_TRANSPARENT = ("torch._ops",)  # the dispatcher's Python shim between wait_tensor and C++


def blocked(frame: FrameType | None, dist: Any) -> list[dict[str, Any]]:
    """What the thread whose innermost frame is `frame` waits in, innermost first; [] when it
    is not inside torch.distributed.  `dist` is the job's torch.distributed module.

    The walk covers the innermost run of torch.distributed frames and the one frame that
    called into it: a thread in the job's own code is not blocked in torch.distributed, even
    if an outer frame holds P2POps from before.
    """
    for _ in range(MAX_DEPTH):
        if frame is None:
            return []
        module = frame.f_globals.get("__name__")
        module = module if isinstance(module, str) else ""
        if not module.startswith(_TRANSPARENT):
            inside = module.startswith("torch.distributed")
            try:
                found = _read(frame, module, inside, dist)
            except Exception:  # locals may hold anything, half-built mid-call
                found = []
            if found or not inside:
                return found[:MAX_OPS]
        frame = frame.f_back
    return []


def _read(frame: FrameType, module: str, inside: bool, dist: Any) -> list[dict[str, Any]]:
    """The ops one frame shows: its own call (c10d), else the P2POps its locals hold (in the
    job's frame only with a Work still pending: the ops are then what it waits on)."""
    name, local = frame.f_code.co_name, frame.f_locals
    if module == _C10D and name in _PEERS:
        op, *keys = _PEERS[name]
        return [_op(op, _peer(local, keys, dist), local.get("group"), dist)]
    if module == _C10D and name in _COLLECTIVES:
        return [_op(name, None, local.get("group"), dist)]
    if module == _FUNCTIONAL and name == "wait_tensor":
        return [{"op": name, "peer": None, "pg": ""}]  # a functional collective names no group
    ops = list(_instances(local.values(), dist.P2POp))
    if not ops or not inside and all(w.is_completed() for w in _instances(local.values(),
                                                                           dist.Work)):
        return []
    return _unique(_op("send" if "send" in p.op.__name__ else "recv", _global(p, dist),
                       p.group, dist) for p in ops)


def _peer(local: dict[str, Any], keys: list[str], dist: Any) -> int | None:
    """The global rank of send's `dst`/`group_dst` (recv's `src`/`group_src`); None for a
    receive from any source."""
    peer, group_peer = (local.get(k) for k in keys)
    if _integer(peer):
        return peer
    if _integer(group_peer):
        return int(dist.get_global_rank(_group(local.get("group"), dist), group_peer))
    return None


def _global(op: Any, dist: Any) -> int | None:
    """A P2POp's peer as a global rank (torch 2.13 keeps `peer` global, `group_peer` local)."""
    if _integer(op.peer):
        return op.peer
    group_peer = getattr(op, "group_peer", None)
    return int(dist.get_global_rank(op.group, group_peer)) if _integer(group_peer) else None


def _op(name: str, peer: int | None, group: Any, dist: Any) -> dict[str, Any]:
    pg = dist.distributed_c10d._world.pg_names.get(_group(group, dist), "")
    return {"op": name[:MAX_TEXT], "peer": peer, "pg": str(pg)[:MAX_TEXT]}


def _group(group: Any, dist: Any) -> Any:
    """The group a call runs on: its `group` local, or the default group for None."""
    return dist.distributed_c10d._get_default_group() if group is None else group


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _instances(values: Iterable[Any], kind: type) -> Iterable[Any]:
    """Objects of `kind` among a frame's locals and inside its lists, tuples and dicts."""
    for value in values:
        if isinstance(value, kind):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value[:MAX_SCAN] if isinstance(v, kind))
        elif isinstance(value, dict):
            yield from (v for v in list(value.values())[:MAX_SCAN] if isinstance(v, kind))


def _unique(ops: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each (op, peer, pg) once, in order: a schedule's microbatches repeat the same peer."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for op in ops:
        seen.setdefault((op["op"], op["peer"], op["pg"]), op)
        if len(seen) >= MAX_OPS:
            break
    return list(seen.values())
