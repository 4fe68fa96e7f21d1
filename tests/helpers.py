"""Helpers every tier shares: a free port, waiting for a condition, stopping a process."""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from typing import Callable, TypeVar

from llmmon.simulate.exporters import stop_process  # noqa: F401 (the one way tests stop one)

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition: Callable[[], T | None], timeout: float, what: str = "a condition",
             interval: float = 0.1, context: Callable[[], object] | None = None) -> T:
    """Poll `condition` until it returns something truthy, and return that: tests wait for
    what they need, never a fixed time. Fail with `what` after `timeout` s, and with what
    `context` returns then (how things last looked, so that a rare timeout can be read)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            seen = f"; last seen: {context()}" if context is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{seen}")
        time.sleep(interval)


def descendants(pid: int) -> list[tuple[int, str]]:
    """Live (not zombie) descendant processes of `pid`: (pid, command line)."""
    found: list[tuple[int, str]] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError):
                for child in map(int, (task / "children").read_text().split()):
                    todo.append(child)
                    with contextlib.suppress(OSError):
                        stat = Path(f"/proc/{child}/stat").read_text()
                        if stat.rsplit(")", 1)[1].split()[0] != "Z":
                            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
                            found.append((child, cmdline.replace(b"\0", b" ").decode(
                                errors="replace")[:200]))
    return found
