"""Another process' Python stack, read from outside with py-spy (no code in the process).

`py-spy dump --nonblocking` reads the interpreter's memory with process_vm_readv without
stopping the process (the cost to the trainer is the memory reads, not a pause; a read can
then see a frame mid-update, which the next sample corrects).  It needs CAP_SYS_PTRACE over
the process (root, or the DaemonSet's overlay, docs/deployment.md).  Only the thread running
the training loop is kept: the one py-spy names MainThread, else the one whose id is the pid.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

MAX_OUTPUT = 4 * 1024 * 1024  # a dump of every thread of a process with deep stacks
MAX_FRAMES = 64
_LIBRARY_DIRS = ("site-packages", "dist-packages")


class StackError(Exception):
    """py-spy could not read the process (gone, no permission, not Python, timed out)."""


@dataclass(frozen=True)
class StackFrame:
    file: str
    line: int
    function: str
    module: str  # dotted, from the file's place under site-packages (torch.distributed....)


def find_binary(given: str) -> str | None:
    """The py-spy executable: `given` if it is a path, else looked up on PATH and beside this
    interpreter (a virtual environment's bin directory)."""
    if os.sep in given:
        return given if os.access(given, os.X_OK) else None
    beside = os.path.join(os.path.dirname(sys.executable), given)
    return shutil.which(given) or (beside if os.access(beside, os.X_OK) else None)


def dump(binary: str, pid: int, timeout: float) -> tuple[StackFrame, ...]:
    """The training thread's frames, innermost first."""
    try:
        done = subprocess.run([binary, "dump", "--pid", str(pid), "--json", "--nonblocking"],
                              capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise StackError(f"py-spy dump --pid {pid}: no answer in {timeout:g}s") from None
    except OSError as exc:
        raise StackError(f"{binary}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise StackError(f"py-spy dump --pid {pid}: {why[-1][:200] if why else done.returncode}")
    if len(done.stdout) > MAX_OUTPUT:
        raise StackError(f"py-spy dump --pid {pid}: more than {MAX_OUTPUT} bytes")
    return parse(done.stdout, pid)


def parse(data: bytes, pid: int) -> tuple[StackFrame, ...]:
    """py-spy's JSON dump (a list of threads) to the training thread's frames."""
    try:
        threads = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise StackError(f"py-spy output is not JSON: {str(exc)[:120]}") from None
    if not isinstance(threads, list) or not all(isinstance(t, dict) for t in threads):
        raise StackError("py-spy output is not a list of threads")
    main = next((t for t in threads if t.get("thread_name") == "MainThread"), None) or next(
        (t for t in threads if t.get("os_thread_id") == pid), None)
    if main is None:
        raise StackError(f"py-spy found no main thread in pid {pid}")
    frames = main.get("frames")
    if not isinstance(frames, list):
        raise StackError("py-spy thread without frames")
    return tuple(_frame(f) for f in frames[:MAX_FRAMES] if isinstance(f, dict))


def _frame(raw: dict[str, Any]) -> StackFrame:
    file = str(raw.get("filename") or "")[:500]
    line = raw.get("line")
    return StackFrame(file, line if isinstance(line, int) and 0 <= line < 1 << 31 else 0,
                      str(raw.get("name") or "")[:200], module_of(file))


def module_of(file: str) -> str:
    """`.../site-packages/torch/distributed/distributed_c10d.py` -> torch.distributed.
    distributed_c10d; a file outside an installed package: its base name."""
    parts = file.replace("\\", "/").split("/")
    start = max((i + 1 for i, p in enumerate(parts) if p in _LIBRARY_DIRS), default=len(parts) - 1)
    dotted = [p for p in parts[start:] if p]
    if not dotted:
        return ""
    dotted[-1] = dotted[-1].removesuffix(".py")
    if dotted[-1] == "__init__" and len(dotted) > 1:
        dotted.pop()
    return ".".join(dotted)
