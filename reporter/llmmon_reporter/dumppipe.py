"""A Flight Recorder dump pipe for backends that have none (ProcessGroupNCCL brings its own).

The daemon asks for a dump the same way for every backend: it writes a byte into
`<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe`.  For gloo and other non-NCCL jobs the reporter
creates that FIFO, polls it without blocking and writes the dump next to where torch would.
"""

from __future__ import annotations

import os
import stat


class DumpPipe:
    def __init__(self, path: str) -> None:
        self.path = path
        try:
            if stat.S_ISFIFO(os.lstat(path).st_mode):
                os.unlink(path)  # left by an earlier process with this rank
        except FileNotFoundError:
            pass
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkfifo(path, 0o622)
        os.chmod(path, 0o622)  # the daemon may run as another user
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        if not stat.S_ISFIFO(os.fstat(self._fd).st_mode):  # swapped since mkfifo
            os.close(self._fd)
            raise OSError(f"{path} is not the FIFO just made")

    def requested(self) -> bool:
        """True once per write into the pipe (several bytes at once count as one request)."""
        try:
            return bool(os.read(self._fd, 4096))
        except BlockingIOError:
            return False

    def close(self) -> None:
        os.close(self._fd)
        try:
            os.unlink(self.path)
        except OSError:
            pass
