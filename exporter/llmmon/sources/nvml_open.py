"""Opening NVML: the factory that picks a backend, kept apart so neither backend imports it."""

from __future__ import annotations

from llmmon.sources.nvml import NvmlSource
from llmmon.sources.nvml_real import RealNvml
from llmmon.sources.nvml_replay import ReplayNvml


def open_nvml(fake_path: str = "") -> NvmlSource:
    """The replay backend for `fake_path` (a file or a directory), else the real library.

    A bad replay path raises ValueError; a missing library shows up later, as
    NvmlUnavailable from `device_count()`, so that opening never blocks or fails."""
    if fake_path:
        return ReplayNvml(fake_path)
    return RealNvml()
