"""The reading side of the incident directory, for the server process.

Other users may write under the same root, so only directories that are the daemon's own are
listed (the MARKER and the directory belong to its user, as `llmmon.ranks.dumps` keeps its dump
sets), ids and file names are checked against `layout`, every open refuses a symbolic link at
each step (O_NOFOLLOW, relative to the directory already opened), and every read is capped.
Each failure is an `IncidentError` carrying its HTTP status: a page or an API answer says what
is wrong with one incident and never fails for the others.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass
from typing import IO, Any, Iterator

from llmmon.incidents import layout
from llmmon.sources.marked import made_by_us

SUMMARY_LIMIT = 1 << 20  # bytes of summary.json read; the daemon writes a few KiB
FILE_LIMIT = 64 << 20  # the most an incident holds, so the most one file served may hold
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO
_OPEN_DIR = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_DIRECTORY


class IncidentError(Exception):
    """Why an incident or one of its files cannot be served, with the HTTP status to say it."""

    status = 422


class UnknownIncident(IncidentError, LookupError):
    status = 404


class MissingFile(IncidentError, LookupError):
    status = 404


class BadName(IncidentError, ValueError):
    status = 400


class Unreadable(IncidentError):
    """The incident or file is there but not as the format says: garbage, too large, not a
    regular file, not the daemon's."""


class TooLarge(Unreadable):
    status = 413


@dataclass(frozen=True)
class Listing:
    """The readable incidents, newest first, and one line for each that could not be read."""

    incidents: list[dict[str, Any]]
    unreadable: list[str]


class Store:
    def __init__(self, root: str) -> None:
        self.root = root

    def listing(self, job_id: str | None = None) -> Listing:
        """Every complete incident of ours (of `job_id` when given), newest first."""
        found, unreadable = [], []
        for incident_id in self._ids():
            try:
                summary = self.summary(incident_id)
            except IncidentError as exc:
                # Not ours, or being removed (no summary.json): not ours to mention.
                if not isinstance(exc, LookupError):
                    unreadable.append(f"{incident_id}: {exc}")
                continue
            if job_id is None or summary.get("job_id") == job_id:
                found.append(summary)
        found.sort(key=_when, reverse=True)
        return Listing(found, unreadable)

    def list(self, job_id: str | None = None) -> list[dict[str, Any]]:
        """The summaries of `listing`."""
        return self.listing(job_id).incidents

    def summary(self, incident_id: str) -> dict[str, Any]:
        """The incident's summary.json as a JSON object."""
        document = self.read_json(incident_id, layout.SUMMARY, SUMMARY_LIMIT)
        if not isinstance(document, dict):
            raise Unreadable(f"{layout.SUMMARY} is not a JSON object")
        if document.get("id") != incident_id:
            raise Unreadable(f"{layout.SUMMARY} names another incident")
        return document

    def read_json(self, incident_id: str, name: str, limit: int) -> Any:
        """One of the incident's JSON files, parsed."""
        raw = self.read(incident_id, name, limit)
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
            raise Unreadable(f"{name} is not JSON: {exc}") from None
        except RecursionError:
            raise Unreadable(f"{name} nests too deep") from None

    def read(self, incident_id: str, name: str, limit: int) -> bytes:
        """The file's bytes; TooLarge past `limit`."""
        with self.open(incident_id, name, limit) as file:
            return file.read(limit)

    def tail(self, incident_id: str, name: str, limit: int) -> bytes:
        """The file's last `limit` bytes at most, from the start of a line when cut."""
        with self.open(incident_id, name) as file:
            size = os.fstat(file.fileno()).st_size
            if size <= limit:
                return file.read(limit)
            file.seek(size - limit)
            return file.read(limit).partition(b"\n")[2]

    def open(self, incident_id: str, name: str, limit: int = FILE_LIMIT) -> IO[bytes]:
        """The file opened for reading (the caller closes it), a regular file of ours no larger
        than `limit`."""
        if not layout.allowed(name):
            raise BadName(f"{name!r} is not a file an incident holds")
        with self._directory(incident_id) as directory:
            *parents, base = name.split("/")
            fd = os.dup(directory)
            try:
                for parent in parents:
                    fd = _swap(fd, _open_at(parent, fd, _OPEN_DIR, name))
                fd = _swap(fd, _open_at(base, fd, _OPEN, name))
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                    raise Unreadable(f"{name} is not a regular file of the daemon's")
                if info.st_size > limit:
                    raise TooLarge(f"{name} has {info.st_size} bytes, over {limit}")
                os.set_blocking(fd, True)
                return os.fdopen(fd, "rb")
            except BaseException:
                os.close(fd)
                raise

    @contextlib.contextmanager
    def _directory(self, incident_id: str) -> Iterator[int]:
        """The incident's directory, opened, when it is a complete one of ours."""
        if not layout.ID.match(incident_id):
            raise UnknownIncident(f"{incident_id!r} is not an incident id")
        try:
            fd = os.open(os.path.join(self.root, incident_id), _OPEN_DIR)
        except OSError:
            raise UnknownIncident(f"no incident {incident_id} here") from None
        try:
            if not made_by_us(fd, layout.MARKER):
                raise UnknownIncident(f"no incident {incident_id} here")
            yield fd
        finally:
            os.close(fd)

    def _ids(self) -> list[str]:
        try:
            entries = list(os.scandir(self.root))
        except OSError:  # not created yet: no incident so far
            return []
        return [e.name for e in entries if layout.ID.match(e.name)
                and e.is_dir(follow_symlinks=False)]


def _open_at(name: str, directory: int, flags: int, path: str) -> int:
    try:
        return os.open(name, flags, dir_fd=directory)
    except FileNotFoundError:
        raise MissingFile(f"{path} is not in this incident") from None
    except OSError as exc:  # ELOOP: a symbolic link; ENOTDIR, EACCES ...
        raise Unreadable(f"{path}: {os.strerror(exc.errno or 0)}") from None


def _swap(old: int, new: int) -> int:
    os.close(old)
    return new


def _when(summary: dict[str, Any]) -> tuple[str, float]:
    """The id's UTC second, then the completion time within it."""
    completed = summary.get("completed")
    return str(summary["id"])[:16], completed if isinstance(completed, (int, float)) else 0.0
