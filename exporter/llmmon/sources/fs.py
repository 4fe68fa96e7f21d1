"""Bounded reads of sysfs and procfs under a configurable root (node_exporter's --path.*).

Every path is relative to the root, so the same collectors read /sys on a node, a fixture
tree in tests and a generated tree in the simulator.
"""

from __future__ import annotations

import os

MAX_BYTES = 1 << 20
# What every Linux sysfs and procfs holds (a trailing / marks a directory): a root without
# them is a wrong --path.* (a typo, an unmounted volume), not a node with nothing to watch.
SKELETONS = {"sysfs": ("class/", "devices/"), "procfs": ("diskstats", "self/")}


class SourceError(Exception):
    """A file that is missing, unreadable, too large or malformed, with its path."""


class RootedFS:
    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *(p.lstrip("/") for p in parts))

    def exists(self, *parts: str) -> bool:
        return os.path.exists(self.path(*parts))

    def not_a_root(self, kind: str) -> str:
        """Why this is not a `kind` (sysfs, procfs) root, or '' when it looks like one."""
        if not os.path.isdir(self.root):
            return "does not exist" if not os.path.exists(self.root) else "is not a directory"
        missing = [entry for entry in SKELETONS[kind]
                   if not (os.path.isdir(self.path(entry)) if entry.endswith("/")
                           else os.path.exists(self.path(entry)))]
        return f"has no {', '.join(missing)}" if missing else ""

    def listdir(self, *parts: str) -> list[str]:
        """Sorted entries of a directory; a missing directory is empty."""
        try:
            return sorted(os.listdir(self.path(*parts)))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise SourceError(f"{self.path(*parts)}: {exc.strerror or exc}") from None

    def read_text(self, *parts: str, max_bytes: int = MAX_BYTES) -> str:
        path = self.path(*parts)
        try:
            with open(path, "rb") as handle:
                data = handle.read(max_bytes + 1)
        except OSError as exc:
            raise SourceError(f"{path}: {exc.strerror or exc}") from None
        if len(data) > max_bytes:
            raise SourceError(f"{path}: larger than {max_bytes} bytes")
        return data.decode("utf-8", errors="replace")

    def read_value(self, *parts: str) -> str:
        """A one-value sysfs attribute, stripped."""
        return self.read_text(*parts, max_bytes=4096).strip()

    def read_int(self, *parts: str) -> int:
        text = self.read_value(*parts)
        try:
            return int(text, 0)
        except ValueError:
            raise SourceError(f"{self.path(*parts)}: not an integer: {text[:40]!r}") from None

    def readlink(self, *parts: str) -> str:
        try:
            return os.readlink(self.path(*parts))
        except OSError as exc:
            raise SourceError(f"{self.path(*parts)}: {exc.strerror or exc}") from None
