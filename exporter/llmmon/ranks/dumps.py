"""Flight Recorder dumps for post-mortems: request them through the dump pipe, keep a few.

`llmmon launch` points torch at `<pipe_dir>/<job>/rank_<r>.pipe` (TORCH_NCCL_DEBUG_INFO_PIPE_FILE)
and `<fr_dir>/<job>/rank_<r>` (the dump file prefix).  Writing a byte into the pipe makes
ProcessGroupNCCL's monitor thread (or, for other backends, the reporter) write a dump there,
even when the training thread is stuck.  Dumps that have stopped growing are moved into
`<fr_dir>/<job>/dump-<UTC time>/` and only the newest `keep` of those sets are kept, per job.

Other users can write into these directories, so only sets the daemon made count or are ever
deleted: a set is the daemon's when the directory and the `MARKER` file it wrote first in it
belong to the daemon's user.  A directory merely named like a set is left alone.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import time

from llmmon.sources.marked import made_by_us
from llmmon_reporter import layout

DUMP_FILE = re.compile(r"^rank_\d{1,7}(\.json)?$")
SET_PREFIX = "dump-"
MARKER = ".llmmon-dump-set"  # written by the daemon into each set it makes


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
        """Move settled dumps into per-job sets, prune each job to `keep` of its sets; return
        the sets kept on the node."""
        kept = 0
        for job in self._dirs(self.fr_dir):
            batch = [entry for entry in os.scandir(job.path)
                     if DUMP_FILE.match(entry.name) and entry.is_file(follow_symlinks=False)
                     and now - entry.stat(follow_symlinks=False).st_mtime >= self.settle]
            if batch:
                target = self._new_set(job.path, now)
                for entry in batch:
                    os.replace(entry.path, os.path.join(target, entry.name))
            sets = sorted((entry.name, entry.path) for entry in self._dirs(job.path)
                          if entry.name.startswith(SET_PREFIX) and made_by_us(entry.path, MARKER))
            for _, path in sets[:max(0, len(sets) - self.keep)]:
                shutil.rmtree(path, ignore_errors=True)
            kept += min(len(sets), self.keep)
        return kept

    @staticmethod
    def _new_set(job_dir: str, now: float) -> str:
        """dump-<UTC second> (one of ours from this second is reused), else with a suffix."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        n = 0
        while True:
            path = os.path.join(job_dir, f"{SET_PREFIX}{stamp}" + (f".{n}" if n else ""))
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                if made_by_us(path, MARKER):
                    return path
                n += 1
                continue
            fd = os.open(os.path.join(path, MARKER),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            os.close(fd)
            return path

    @staticmethod
    def _dirs(path: str) -> list[os.DirEntry[str]]:
        try:
            return [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return []
