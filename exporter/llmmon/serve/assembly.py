"""Assembles the collector side of an exporter from settings: collectors, sampler, diagnoser.

The HTTP app is made apart (`llmmon.serve.app.create_app`) so that the collector process of
`llmmon serve` never imports the web stack.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from llmmon import __version__
from llmmon.collector import Collector, Environment
from llmmon.collectors import discover
from llmmon.collectors.incidents import IncidentsCollector
from llmmon.collectors.nccl import NcclCollector
from llmmon.collectors.ranks import RanksCollector
from llmmon.config import Settings
from llmmon.diagnose import Diagnoser
from llmmon.diagnose.window import digest
from llmmon.serve.routes import Routes, collector_routes
from llmmon.sampler import Sampler
from llmmon.sources.fs import SKELETONS, RootedFS

log = logging.getLogger("llmmon.serve.assembly")


@dataclass
class Daemon:
    collectors: list[Collector]
    sampler: Sampler
    diagnoser: Diagnoser

    def routes(self) -> Routes:
        """Every /api/v1 endpoint: the collectors' and GET /api/v1/diagnose."""
        return collector_routes(self.collectors, {"diagnose": self.diagnoser.result})


def build(settings: Settings, restarts: int | None = None) -> Daemon:
    """Instantiate the enabled collectors; a collector that cannot be built is a config error."""
    env = Environment(RootedFS(settings["path.sysfs"]), RootedFS(settings["path.procfs"]),
                      settings.values)
    collectors: list[Collector] = []
    for cls in discover():
        config = settings.collectors[cls.name]
        if not config["enabled"]:
            continue
        collectors.append(cls(env, config))
    log.info("collectors enabled: %s", ", ".join(c.name for c in collectors) or "none")
    for kind in ("sysfs", "procfs"):
        for problem in env.root_problems([kind]):
            users = [c.name for c in collectors if kind in c.roots]
            log.log(logging.ERROR if users else logging.WARNING,
                    "%s (every Linux %s has %s); collectors that find nothing under it "
                    "fail: %s", problem, kind, ", ".join(SKELETONS[kind]),
                    ", ".join(users) or "none enabled")
    sampler = Sampler(collectors, __version__, settings["sampler.max_staleness"],
                      settings["sampler.series_budget"], restarts, digest=digest)
    _attach_to_ranks(collectors, sampler)
    return Daemon(collectors, sampler, Diagnoser(sampler))


def _attach_to_ranks(collectors: list[Collector], sampler: Sampler) -> None:
    """The incidents and nccl collectors work from the ranks collector's verdicts and the
    sampler's digests; collectors never import each other, so they meet here."""
    by_name = {c.name: c for c in collectors}
    ranks = by_name.get("ranks")
    if not isinstance(ranks, RanksCollector):
        return
    incidents, nccl = by_name.get("incidents"), by_name.get("nccl")
    if isinstance(incidents, IncidentsCollector):
        incidents.attach(ranks.latest, ranks.config["fr_dir"], ranks.config["pipe_dir"],
                         sampler.digests)
    if isinstance(nccl, NcclCollector):
        nccl.attach(ranks.latest, ranks.config["fr_dir"], sampler.digests)
