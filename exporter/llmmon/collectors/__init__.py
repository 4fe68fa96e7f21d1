"""Collectors, one per module; every `Collector` subclass defined here is discovered."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from llmmon.collector import Collector


def discover() -> list[type[Collector]]:
    """All collector classes in this package, in module name order."""
    found: list[type[Collector]] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Collector) and cls.__module__ == module.__name__ and cls.name:
                found.append(cls)
    names = [c.name for c in found]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise RuntimeError(f"duplicate collector names: {sorted(duplicates)}")
    return found
