"""Writes one node's files the way the kernel and the reporter present them to a reader.

Every file is replaced atomically (the reporter's temp-file-and-rename writer), so the exporter
reads the old content or the new, never half of one, and a file is rewritten only when its
content changed: a node's 300 sysfs counters cost a write only when they move.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from llmmon_reporter.spoolfile import write_atomic


class Tree:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._written: dict[str, bytes] = {}

    def path(self, relative: str) -> Path:
        return self.root / relative

    def write(self, relative: str, content: str | bytes) -> None:
        data = content.encode() if isinstance(content, str) else content
        if self._written.get(relative) == data:
            return
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(str(path.parent), path.name, data)
        self._written[relative] = data

    def link(self, relative: str, target: str) -> None:
        """A relative symlink at `relative` to `target` (both relative to the root), as sysfs
        links are: the tree stays valid when copied or archived elsewhere."""
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        pointed = os.path.relpath(self.root / target, path.parent)
        if path.is_symlink() and os.readlink(path) == pointed:
            return
        if path.is_symlink():
            path.unlink()
        path.symlink_to(pointed)

    def remove(self, relative: str) -> None:
        self._written.pop(relative, None)
        try:
            (self.root / relative).unlink()
        except FileNotFoundError:
            pass

    def remove_dir(self, relative: str) -> None:
        prefix = relative.rstrip("/") + "/"
        for written in [w for w in self._written if w.startswith(prefix)]:
            del self._written[written]
        shutil.rmtree(self.root / relative, ignore_errors=True)
