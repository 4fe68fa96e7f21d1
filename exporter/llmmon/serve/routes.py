"""The daemon's JSON endpoints as plain callables keyed by their path under /api/v1.

One table serves both ways: in-process (tests and tools call the collectors directly) and
across the collector process's pipe (`llmmon serve`, where the server only forwards).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from llmmon.collector import Collector


@dataclass
class Routes:
    get: dict[str, Callable[[], Any]] = field(default_factory=dict)
    # POST handlers get the query; ValueError is a bad or unknown argument (400).
    post: dict[str, Callable[[dict[str, str]], Any]] = field(default_factory=dict)


def collector_routes(collectors: list[Collector],
                     extra: dict[str, Callable[[], Any]] | None = None) -> Routes:
    routes = Routes(get=dict(extra or {}))
    for collector in collectors:
        routes.get.update(collector.api())
        routes.post.update(collector.actions())
    return routes
