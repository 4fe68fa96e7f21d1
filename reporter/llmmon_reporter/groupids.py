"""Which process group each Flight Recorder group id stands for.

torch keys `pg_status` by a group's id in this process: each backend numbers the groups the
process constructs (0 the default group, then those it is a member of, in creation order), so
on a 2×2 mesh id 1 is the rank's dp group and id 2 its tp group on every rank, while the dp
groups are two different groups.  Records carry that id (`pg_id`) and the group's job-wide
name (`process_group[0]`, the same on every member); nothing else holds both, and torch's
Python objects expose no id.  The reporter learns the pairs from the records and ships the map,
so the daemon keys every group by its name.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

MAX_IDS = 256  # a process belongs to a few dozen groups; a bound whatever the ring holds


def pair(entry: Any) -> tuple[str, str] | None:
    """(pg_id, name) of a record (a ring read's `keep`), None when it has no usable pair."""
    if not isinstance(entry, dict):
        return None
    pg_id, group = entry.get("pg_id"), entry.get("process_group")
    if type(pg_id) is int and isinstance(group, list) and group and isinstance(group[0], str):
        return str(pg_id), group[0]
    return None


class GroupIds:
    """The id -> name pairs seen so far, and which ids a ring read was already spent on."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self._sought: set[str] = set()

    def learn(self, entries: Iterable[Any]) -> None:
        """Pairs from records, raw or already `pair`ed; a later pair for an id replaces the
        earlier one (a group destroyed and another constructed)."""
        for item in entries:
            found = item if isinstance(item, tuple) else pair(item)
            if found is not None and (found[0] in self.names or len(self.names) < MAX_IDS):
                self.names[found[0]] = found[1]

    def unknown(self, progress: Mapping[str, Any]) -> bool:
        """Ids in `progress` with no name that no ring read was spent on yet (then marked):
        a group whose records all left the ring before the reporter started stays unnamed
        rather than costing a ring read every tick."""
        new = {pg for pg in progress if pg not in self.names} - self._sought
        self._sought |= new
        return bool(new)
