"""Builds spool documents and writes them atomically (temp file, then rename).

Flight Recorder dumps are spliced into the document as the bytes torch returned: the trainer
never parses a dump.  A blob that does not look like a JSON object is replaced by null, so one
odd dump cannot make the whole file unreadable.

Other users may write into the spool, so nothing here opens a path they could have prepared:
temporary files get a new random name and are created exclusively (O_EXCL, no link followed,
non-blocking), and a job directory is used only when it is a real directory of this user.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from typing import Any, Mapping

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _is_object(blob: bytes) -> bool:
    stripped = blob.strip()
    return stripped[:1] == b"{" and stripped[-1:] == b"}"


def compose(header: Mapping[str, Any], raw: Mapping[str, bytes | None]) -> bytes:
    """`header` serialised as JSON, plus each raw dump under its key."""
    text = json.dumps(header, separators=(",", ":"), allow_nan=False)
    parts = [text[:-1].encode()]
    for key, blob in raw.items():
        parts.append(b',"%s":' % key.encode())
        parts.append(blob if blob is not None and _is_object(blob) else b"null")
    parts.append(b"}")
    return b"".join(parts)


def write_atomic(directory: str, name: str, data: bytes) -> None:
    """Readers see the old file or the new one, never half of one; a failed write leaves none."""
    os.close(_replace(directory, name, data, 0))


def create_appendable(directory: str, name: str, data: bytes) -> int:
    """As write_atomic, but return the new file open for appending (the caller closes it)."""
    return _replace(directory, name, data, os.O_APPEND)


def append(fd: int, data: bytes) -> None:
    """All of `data` at the end of the file (a reader may see a partial last line)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _replace(directory: str, name: str, data: bytes, flags: int) -> int:
    temp = os.path.join(directory, f".{name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temp, _CREATE | flags, 0o644)
    try:
        os.fchmod(fd, 0o644)  # readable by the daemon whatever the trainer's umask
        append(fd, data)
        os.replace(temp, os.path.join(directory, name))
    except BaseException:
        os.close(fd)
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    return fd


def own_directory(path: str) -> None:
    """Create `path` (mode 0755), or check that it is a directory of this user, not writable by
    others; raise PermissionError saying why not (another user could plant files there)."""
    try:
        os.mkdir(path, 0o755)
        os.chmod(path, 0o755)  # readable by the daemon whatever the trainer's umask
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"job directory {path} is not a directory (a link or a file); "
                              "refusing to write there")
    if st.st_uid != os.geteuid():
        raise PermissionError(f"job directory {path} belongs to uid {st.st_uid}, not to this "
                              f"rank's uid {os.geteuid()}; refusing to write there")
    if st.st_mode & 0o022:
        os.chmod(path, 0o755)


def remove(directory: str, name: str) -> None:
    try:
        os.unlink(os.path.join(directory, name))
    except OSError:
        pass
