"""Include/exclude regexes on device names, applied before a device is read.

Filtering before any I/O matters: on restricted HGX PFs merely reading RDMA counters fails and
floods the kernel log, which node_exporter's filter-after-read cannot prevent.
"""

from __future__ import annotations

import re

from llmmon.options import Option


class DeviceFilter:
    """`filter(name)` is True for names to read; empty regexes filter nothing."""

    def __init__(self, include: str, exclude: str) -> None:
        self._include = re.compile(include) if include else None
        self._exclude = re.compile(exclude) if exclude else None

    def __call__(self, name: str) -> bool:
        if self._include and not self._include.search(name):
            return False
        return not (self._exclude and self._exclude.search(name))


def filter_options(what: str, exclude_default: str = "",
                   exclude_help: str = "") -> tuple[Option, Option]:
    """The `device_include` and `device_exclude` options of a collector reading `what`."""
    return (
        Option("device_include", "regex", "",
               f"Only {what} matching this regex (empty: all). Others are never read."),
        Option("device_exclude", "regex", exclude_default,
               exclude_help or f"{what.capitalize()} to skip without reading them."),
    )
