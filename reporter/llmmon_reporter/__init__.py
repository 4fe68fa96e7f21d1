"""The llmmon reporter, run inside training processes (standard library and torch only).

    import llmmon_reporter as reporter
    reporter.start()                      # or launch under `llmmon launch -- torchrun ...`
    ...
    reporter.step(tokens=n, loss=loss, model_flops=6 * params * n)   # optional, O(1)

Importing this package imports neither torch nor anything of the node daemon; the thread it
starts waits until the job itself has initialised torch.distributed.  No function here raises.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any

from llmmon_reporter import exitstatus
from llmmon_reporter.layout import DEFAULT_SPOOL
from llmmon_reporter.stepstats import StepStats
from llmmon_reporter.worker import Cadence, Reporter

__all__ = ["start", "stop", "step", "flush", "health", "autostart"]
__version__ = "0.1.0"  # the same as llmmon's (a test checks)

log = logging.getLogger("llmmon.reporter")
_OFF = ("0", "false", "no", "off")
_lock = threading.Lock()
_steps = StepStats()
_reporter: Reporter | None = None


def start(spool: str | None = None) -> bool:
    """Start the reporter thread once per process; True when it is running."""
    global _reporter
    try:
        with _lock:
            if _reporter is None:
                env = os.environ
                directory = spool or env.get("LLMMON_SPOOL") or DEFAULT_SPOOL
                _reporter = Reporter(directory, Cadence.from_env(env), _steps)
                # Children that inherit this environment (spawned data-loader or compile
                # workers) see another pid here and do not start a second reporter.
                env["LLMMON_REPORTER_PID"] = str(os.getpid())
                _reporter.start()
                exitstatus.watch()
                atexit.register(_reporter.close)
            return _reporter.health()["running"]
    except Exception:
        log.debug("llmmon reporter did not start", exc_info=True)
        return False


def autostart() -> bool:
    """Start from interpreter start-up (`llmmon launch`), in training ranks only."""
    env = os.environ
    if env.get("LLMMON_REPORTER", "1").strip().lower() in _OFF or "RANK" not in env:
        return False
    owner = env.get("LLMMON_REPORTER_PID")
    if owner and owner != str(os.getpid()):
        return False
    return start()


def step(tokens: float | None = None, loss: Any = None, model_flops: float | None = None) -> None:
    """Mark the end of a training step: step time, tokens, model FLOPs, non-finite loss.

    `loss` may be a number or a tensor; a CUDA tensor is checked without synchronising.
    """
    try:
        _steps.step(tokens, loss, model_flops)
    except Exception:
        pass


def flush(timeout: float = 10.0) -> bool:
    """Write every file now (status, in-flight, entries) and wait; for tests and scripts."""
    reporter = _reporter
    try:
        return reporter.flush(timeout) if reporter is not None else False
    except Exception:
        return False


def health() -> dict[str, Any]:
    """The reporter's own state: running, ticks, errors, disabled and why."""
    reporter = _reporter
    return reporter.health() if reporter is not None else {"running": False}


def stop() -> None:
    reporter = _reporter
    if reporter is not None:
        reporter.stop()
