"""The simulated cluster: nodes, the jobs placed on them, the active scenarios and the tick.

Nodes are `sim-00`, `sim-01`, ...; jobs take `job_nodes` consecutive nodes each (all of them
by default), one rank per GPU.  A tick advances the jobs under the scenarios' effects, then
builds each node's condition (the job's baseline bent by the node's scenarios) and writes
its files.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from llmmon.simulate import hardware
from llmmon.simulate.control import Spec
from llmmon.simulate.job import RING, Job, JobEffects, Rank
from llmmon.simulate.node import NodeSim
from llmmon.simulate.scenarios import SCENARIOS, Scenario, Tick

FIRST_PID = 41000


@dataclass(frozen=True)
class ClusterConfig:
    nodes: int = 1
    gpus: int = 8
    nics: int = 8
    disks: int = 6
    job_nodes: int = 0  # nodes per job; 0: one job over every node
    speed: float = 1.0  # scenario seconds per wall second
    tick: float = 1.0  # wall seconds between rewrites
    entries_interval: float = 5.0  # Flight Recorder entries files, wall seconds
    ring: int = RING  # Flight Recorder records each rank keeps
    name: str = "sim"

    def __post_init__(self) -> None:
        if (self.nodes < 1 or self.speed <= 0 or self.tick <= 0 or self.entries_interval <= 0
                or self.ring < 1):
            raise ValueError("nodes and ring must be >= 1 and speed, tick, entries interval "
                             "positive")
        if self.job_nodes < 0 or (self.job_nodes and self.nodes % self.job_nodes):
            raise ValueError(f"job_nodes {self.job_nodes} must divide nodes {self.nodes}")


@dataclass
class Active:
    spec: Spec
    scenario: Scenario
    started: float
    previous: float = -1e-9


@dataclass
class Cluster:
    root: Path
    config: ClusterConfig = field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        config = self.config
        now = time.time()
        self.nodes = [NodeSim(self.root / f"sim-{i:02d}",
                              hardware.build(f"sim-{i:02d}", i, config.gpus, config.nics,
                                           config.disks), config.entries_interval)
                      for i in range(config.nodes)]
        per_job = config.job_nodes or config.nodes
        self.jobs: list[Job] = []
        self.job_of: dict[int, Job] = {}
        for number, first in enumerate(range(0, config.nodes, per_job)):
            members = self.nodes[first:first + per_job]
            ranks = [Rank(position * config.gpus + gpu.index, gpu.index, node.layout.index,
                          gpu.uuid, FIRST_PID + 100 * node.layout.index + gpu.index,
                          ring_size=config.ring)
                     for position, node in enumerate(members) for gpu in node.layout.gpus]
            job = Job(f"pretrain-{number}", ranks, now, seed=number)
            self.jobs.append(job)
            self.job_of.update({node.layout.index: job for node in members})
        self.active: list[Active] = []
        self._last = now

    def node_index(self, name: str | None) -> int:
        if name is None:
            return 0
        for node in self.nodes:
            if node.name == name:
                return node.layout.index
        raise ValueError(f"no node {name!r} (nodes: {', '.join(n.name for n in self.nodes)})")

    def set_scenarios(self, specs: list[Spec], now: float) -> None:
        """Make `specs` the active set; raises ValueError (changing nothing) if one is bad."""
        kept = {a.spec: a for a in self.active}
        active = []
        for spec in specs:
            if spec in kept:
                active.append(kept.pop(spec))
                continue
            cls = SCENARIOS.get(spec.name)
            if cls is None:
                raise ValueError(f"unknown scenario {spec.name!r}; known: "
                                 f"{', '.join(SCENARIOS)}")
            node = self.node_index(spec.node)
            scenario = cls(node, dict(spec.params))
            scenario.bind(self.job_of[node], self.nodes[node].layout)
            active.append(Active(spec, scenario, now))
        self.active = active

    def tick(self, now: float) -> None:
        seconds = max(now - self._last, 0.0)
        self._last = now
        ticks = {}
        for active in self.active:
            elapsed = (now - active.started) * self.config.speed
            ticks[id(active)] = Tick(now, elapsed, active.previous)
            active.previous = elapsed
        effects = {id(job): JobEffects() for job in self.jobs}
        for active in self.active:
            job = self.job_of[active.scenario.node]
            active.scenario.job(effects[id(job)], ticks[id(active)])
        for job in self.jobs:
            job.advance(now, effects[id(job)])
        window = self.config.tick * 1.5 + 1.0
        for node in self.nodes:
            job = self.job_of[node.layout.index]
            cond = node.baseline(job)
            for active in self.active:
                if active.scenario.node == node.layout.index:
                    active.scenario.condition(cond, ticks[id(active)])
            node.write(now, seconds, cond, job, window)
