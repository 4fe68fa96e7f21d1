"""torch's Flight Recorder JSON dumps called through their C++ functions, without the GIL.

torch's Python bindings of the dumps hold the GIL for the whole call (40 ms for a 2,000-record
gloo ring on torch 2.13's CPU build, 44-77 ms for NCCL's on an H200): the training thread
cannot run a line of Python meanwhile.  The same functions are exported from torch's shared
libraries (`c10d::dump_fr_trace_json`, `c10d::dump_nccl_trace_json`); called through ctypes,
which releases the GIL around a foreign call, the dump runs beside the training thread instead
of in front of it.

The functions return a `std::string`, which ctypes cannot: on x86-64 Linux (System V ABI,
libstdc++'s C++11 string) the caller passes the 32 bytes the string is built in as a hidden
first argument, and frees its heap buffer with `operator delete`.  Elsewhere (aarch64 returns
such values through a register ctypes cannot set) `load` returns None and the reporter uses the
bindings.  `LLMMON_REPORTER_NATIVE=0` turns it off.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from typing import Any, Mapping

# binding name -> mangled C++ function (bool includeCollectives, bool onlyActive)
SYMBOLS = {"_dump_fr_trace_json": "_ZN4c10d18dump_fr_trace_jsonB5cxx11Ebb",
           "_dump_nccl_trace_json": "_ZN4c10d20dump_nccl_trace_jsonB5cxx11Ebb"}
LIBRARIES = ("libtorch_cuda.so", "libtorch_cpu.so")  # where torch builds define them
OPERATOR_DELETE = "_ZdlPv"
_STRING_BYTES = 32  # sizeof(std::string): pointer, length, 16-byte inline buffer
_INLINE = 16  # offset of the inline buffer: a short string's pointer points here


class NativeDump:
    """One exported dump function; `__call__` has the binding's keyword arguments."""

    def __init__(self, function: Any, delete: Any) -> None:
        function.restype = ctypes.c_void_p
        function.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]
        delete.restype = None
        delete.argtypes = [ctypes.c_void_p]
        self._function, self._delete = function, delete

    def __call__(self, includeCollectives: bool, onlyActive: bool) -> bytes:  # noqa: N803
        result = ctypes.create_string_buffer(_STRING_BYTES)
        self._function(ctypes.addressof(result), includeCollectives, onlyActive)
        pointer = ctypes.c_void_p.from_buffer(result, 0).value
        length = ctypes.c_size_t.from_buffer(result, 8).value
        data = ctypes.string_at(pointer, length)
        if pointer != ctypes.addressof(result) + _INLINE:
            self._delete(pointer)
        return data


def supported() -> bool:
    return sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


def load(torch_file: str, api: str, env: Mapping[str, str]) -> NativeDump | None:
    """The exported function behind binding `api` of the torch imported from `torch_file`,
    or None where it cannot be called this way (the caller checks its output once)."""
    if env.get("LLMMON_REPORTER_NATIVE", "1") == "0" or not supported() or api not in SYMBOLS:
        return None
    lib_dir = os.path.join(os.path.dirname(torch_file), "lib")
    for name in LIBRARIES:
        path = os.path.join(lib_dir, name)
        if not os.path.exists(path):
            continue
        try:
            # torch has loaded it already: this returns the same handle (RTLD_NOLOAD)
            library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            return NativeDump(getattr(library, SYMBOLS[api]), getattr(library, OPERATOR_DELETE))
        except (OSError, AttributeError):
            continue
    return None
