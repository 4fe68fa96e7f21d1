"""Builds spool documents and writes them atomically (temp file, then rename).

Flight Recorder dumps are spliced into the document as the bytes torch returned: the trainer
never parses a dump.  A blob that does not look like a JSON object is replaced by null, so one
odd dump cannot make the whole file unreadable.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping


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
    temp = os.path.join(directory, f".{name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        try:
            os.fchmod(fd, 0o644)  # readable by the daemon whatever the trainer's umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(temp, os.path.join(directory, name))
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def remove(directory: str, name: str) -> None:
    try:
        os.unlink(os.path.join(directory, name))
    except OSError:
        pass
