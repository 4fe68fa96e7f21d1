"""The collector contract: what every collector declares and how it reports trouble.

A collector reads one kind of source and returns fresh metric families.  It never raises for
bad data about one device: it calls `ctx.error()` (counted, logged once) and carries on, so
one malformed file never blanks the rest of the node.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable

from prometheus_client.core import Metric

from llmmon.metrics import MetricSpec
from llmmon.options import Option
from llmmon.sources.fs import RootedFS

log = logging.getLogger("llmmon.collector")


class RouteError(Exception):
    """An /api/v1 answer other than 200, with its status: raised by a collector's endpoint or
    action (429: asked again too soon), or by the server when the collector process cannot
    answer (503, 504).  ValueError is a bad or unknown argument (400)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Environment:
    """What the daemon hands every collector: rooted file systems and global settings."""

    sysfs: RootedFS
    procfs: RootedFS
    settings: dict[str, Any] = field(default_factory=dict)

    def root_problems(self, kinds: Iterable[str]) -> list[str]:
        """For each root in `kinds` (sysfs, procfs) that lacks what every Linux root has,
        one line naming the flag, the path and what is missing."""
        problems = []
        for kind in kinds:
            root: RootedFS = getattr(self, kind)
            why = root.not_a_root(kind)
            if why:
                problems.append(f"--path.{kind}={root.root} {why}: not a {kind} root")
        return problems


class ErrorLog:
    """Logs each distinct problem once, and its recovery once, instead of every cycle."""

    def __init__(self, collector: str) -> None:
        self._collector = collector
        self._active: dict[str, str] = {}

    def cycle(self, errors: dict[str, str]) -> None:
        for key, message in errors.items():
            if self._active.get(key) != message:
                log.warning("collector=%s problem=%s: %s", self._collector, key, message)
        for key in self._active.keys() - errors.keys():
            log.info("collector=%s problem=%s: recovered", self._collector, key)
        self._active = dict(errors)

    def fail(self, message: str) -> None:
        """A failed or hung run says nothing about the problems it did not get to: they
        stay active rather than being logged as recovered."""
        self.cycle({**self._active, "collector": message})


class Context:
    """Per-run scratchpad: errors to count, and what the collector found to watch."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}
        self.error_count = 0
        self.watched: int | None = None
        self.watched_what = ""

    def error(self, key: str, message: str) -> None:
        """Count one problem; `key` identifies it (e.g. 'mlx5_0/port_xmit_data') for the log."""
        self.error_count += 1
        self.errors[key] = message

    def persists(self, key: str, message: str) -> None:
        """A problem counted by an earlier run that is still there (a bad file parsed once):
        not counted again, but still active, so its recovery is not logged."""
        self.errors[key] = message

    def watching(self, count: int, what: str) -> None:
        """Say how many things this run watched; zero means 'nothing here', not a failure."""
        self.watched = count
        self.watched_what = what


class Collector:
    """Base class.  Subclasses are discovered from `llmmon.collectors` modules."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    specs: ClassVar[tuple[MetricSpec, ...]] = ()
    options: ClassVar[tuple[Option, ...]] = ()
    enabled_by_default: ClassVar[bool] = True
    # The roots (sysfs, procfs) the things it watches are found under: a run that finds
    # nothing under a root that is not one fails, naming the root, instead of reading 'empty'.
    roots: ClassVar[tuple[str, ...]] = ()
    interval: ClassVar[float] = 5.0
    timeout: ClassVar[float] = 3.0

    def __init__(self, env: Environment, config: dict[str, Any]) -> None:
        self.env = env
        self.config = config

    def start(self) -> None:
        """Start background threads (fast samplers, event waiters); called once before runs."""

    def close(self) -> None:
        """Stop background threads; called once on shutdown."""

    def collect(self, ctx: Context) -> Iterable[Metric]:
        raise NotImplementedError

    def api(self) -> dict[str, Callable[[], Any]]:
        """Extra JSON endpoints, mounted at GET /api/v1/<key>."""
        return {}

    def actions(self) -> dict[str, Callable[[dict[str, str]], Any]]:
        """Side-effecting endpoints, mounted at POST /api/v1/<key>; they get the query.

        Raising ValueError answers 400 with its message (a bad or unknown argument)."""
        return {}
