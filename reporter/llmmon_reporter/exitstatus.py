"""How this process ends, for the exit record the reporter writes at interpreter exit.

atexit is told neither the status a `sys.exit(N)` asked for nor (for SystemExit) anything at
all, and a rank that leaves with `sys.exit(3)` while its peers still train is the rank that
took the job down: its "3" is the cause the daemon has to say.  So `watch()` wraps
`sys.exit` to remember the status the main thread asked for (a `raise SystemExit(N)` or the
`exit()` builtin are not seen and read as a normal exit); an unhandled exception is
`sys.last_value`, which the interpreter sets before atexit runs.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, NoReturn

MAX_ERROR = 400
_asked: list[object] = []  # the status of the main thread's last sys.exit call


def watch() -> None:
    """Wrap sys.exit once per process (the wrapper calls the original, changing nothing)."""
    original = sys.exit
    if getattr(original, "__llmmon_exit__", False):
        return

    def exit(status: object = None) -> NoReturn:  # noqa: A001 (it is sys.exit)
        if threading.current_thread() is threading.main_thread():  # elsewhere: ends a thread
            _asked[:] = [status]
        original(status)
        raise AssertionError("sys.exit returned")  # unreachable: the original raises

    exit.__doc__ = original.__doc__
    exit.__llmmon_exit__ = True  # type: ignore[attr-defined]
    sys.exit = exit


def record() -> dict[str, Any]:
    """The exit record: an unhandled exception (status 1 and its text), a `sys.exit(N)` (its
    status: None is 0, an integer itself, anything else 1 with its text), else 0."""
    now = time.time_ns()
    error = getattr(sys, "last_value", None)
    if error is not None and not isinstance(error, SystemExit):
        return {"ns": now, "how": "exception", "code": 1,
                "error": f"{type(error).__name__}: {error}"[:MAX_ERROR]}
    status = _asked[0] if _asked else None
    if status is None or isinstance(status, int):
        return {"ns": now, "how": "exit", "code": int(status or 0), "error": ""}
    return {"ns": now, "how": "exit", "code": 1, "error": str(status)[:MAX_ERROR]}
