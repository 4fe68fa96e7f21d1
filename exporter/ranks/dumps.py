"""Flight Recorder dumps for post-mortems: request them through the dump pipe, keep a few.

`llmmon launch` points torch at `<pipe_dir>/<job>/rank_<r>.pipe` (TORCH_NCCL_DEBUG_INFO_PIPE_FILE)
and `<fr_dir>/<job>/rank_<r>` (the dump file prefix).  Writing a byte into the pipe makes
ProcessGroupNCCL's monitor thread (or, for other backends, the reporter) write a dump there,
even when the training thread is stuck.  Dumps that have stopped growing are moved into
`<fr_dir>/<job>/dump-<UTC time>/` and only the newest `keep` of those sets are kept.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import time

from llmmon_reporter import layout

DUMP_FILE = re.compile(r"^rank_\d{1,7}(\.json)?$")
SET_PREFIX = "dump-"


def request(pipe_dir: str, job_id: str, ranks: list[int]) -> dict[int, str]:
    """Ask each rank for a dump; rank -> 'requested' or why not."""
    results = {}
    for rank in ranks:
        path = layout.pipe_path(pipe_dir, job_id, rank)
        try:
            if not stat.S_ISFIFO(os.lstat(path).st_mode):
                results[rank] = "not a pipe"
                continue
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            try:
                os.write(fd, b"1")
            finally:
                os.close(fd)
            results[rank] = "requested"
        except FileNotFoundError:
            results[rank] = "no pipe"
        except OSError as exc:
            results[rank] = "nobody listening" if exc.errno == errno.ENXIO else str(exc.strerror)
    return results


class DumpKeeper:
    def __init__(self, fr_dir: str, keep: int, settle: float = 2.0) -> None:
        self.fr_dir = fr_dir
        self.keep = keep
        self.settle = settle

    def harvest(self, now: float) -> int:
        """Move settled dumps into per-job sets, prune to `keep` sets; return the sets kept."""
        for job in self._dirs(self.fr_dir):
            batch = [entry for entry in os.scandir(job.path)
                     if DUMP_FILE.match(entry.name) and entry.is_file(follow_symlinks=False)
                     and now - entry.stat(follow_symlinks=False).st_mtime >= self.settle]
            if not batch:
                continue
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
            target = os.path.join(job.path, f"{SET_PREFIX}{stamp}")
            os.makedirs(target, exist_ok=True)
            for entry in batch:
                os.replace(entry.path, os.path.join(target, entry.name))
        sets = sorted(((entry.name, entry.path) for job in self._dirs(self.fr_dir)
                       for entry in self._dirs(job.path)
                       if entry.name.startswith(SET_PREFIX)), reverse=True)
        for _, path in sets[self.keep:]:
            shutil.rmtree(path, ignore_errors=True)
        return min(len(sets), self.keep)

    @staticmethod
    def _dirs(path: str) -> list[os.DirEntry[str]]:
        try:
            return [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return []
