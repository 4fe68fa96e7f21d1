"""Directories the daemon made, told apart from look-alikes in directories others can write.

The incidents directory and the dump directory are shared with other users' processes; a
directory counts as the daemon's only when it and its marker file (a regular file, never a
link) belong to the daemon's own user, so a planted look-alike is never read as ours nor
deleted as ours.
"""

from __future__ import annotations

import os
import stat


def made_by_us(directory: str | int, marker: str) -> bool:
    """`directory` (a path, not followed if a link, or an open descriptor) and the `marker`
    in it belong to this process' effective user."""
    try:
        if isinstance(directory, int):
            info = os.fstat(directory)
            mark = os.stat(marker, dir_fd=directory, follow_symlinks=False)
        else:
            info = os.lstat(directory)
            mark = os.lstat(os.path.join(directory, marker))
    except OSError:
        return False
    uid = os.geteuid()
    return stat.S_ISDIR(info.st_mode) and stat.S_ISREG(mark.st_mode) \
        and mark.st_uid == info.st_uid == uid
