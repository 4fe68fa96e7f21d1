"""pyroute2, imported on first use and by one thread at a time.

The HTTP server process imports the collector modules (for their flags) but never reads
netlink or ethtool; importing pyroute2 there cost it ~9 MiB.  pyroute2's package import is
not safe in two threads at once (two collector threads importing it together failed with its
circular-import error), hence the lock.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # keeps pyroute2 in the import contracts' graph (only sources reach it)
    import pyroute2  # noqa: F401

_lock = threading.Lock()


def module(name: str) -> ModuleType:
    """`pyroute2` or one of its submodules, imported once."""
    with _lock:
        return importlib.import_module(name)
