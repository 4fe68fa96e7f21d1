"""The simulator's loop: follow the control file, tick the cluster, keep the daemons serving."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from llmmon.simulate import control, exporters
from llmmon.simulate.cluster import Cluster, ClusterConfig
from llmmon.simulate.control import ControlFile, Spec, SpecError

log = logging.getLogger("llmmon.simulate")
CONTROL_FILE = "scenarios"
TARGETS_FILE = "targets.json"
MANIFEST_FILE = "exporters.json"


class Simulation:
    def __init__(self, root: Path, config: ClusterConfig, specs: list[Spec]) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.config = config
        self.cluster = Cluster(root, config)
        now = time.time()
        self.cluster.set_scenarios(specs, now)  # a bad spec fails here, before anything runs
        self.control = ControlFile(root / CONTROL_FILE)
        control.write(self.control.path, specs)
        self.control.changed()
        self.cluster.tick(now)
        self.exporters: list[exporters.Exporter] = []

    @property
    def targets_file(self) -> Path:
        return self.root / TARGETS_FILE

    def serve(self, host: str, port_base: int, extra_args: list[str]) -> None:
        """Start the daemons (the trees exist since the first tick) and the targets file."""
        self.exporters = exporters.start(self.cluster.nodes, host, port_base, extra_args)
        exporters.write_manifest(self.root / MANIFEST_FILE, self.exporters)
        exporters.write_targets(self.targets_file, self.exporters, self.config.name)

    def step(self, now: float) -> None:
        try:
            specs = self.control.changed()
            if specs is not None:
                self.cluster.set_scenarios(specs, now)
                log.info("scenarios: %s", ", ".join(s.text for s in specs) or "healthy")
        except (SpecError, ValueError) as exc:
            log.error("%s; keeping the running scenarios", exc)
        self.cluster.tick(now)
        for exporter in self.exporters:
            if exporter.process.poll() is not None:
                raise RuntimeError(f"llmmon serve for {exporter.node.name} exited with "
                                   f"{exporter.process.returncode}; see {exporter.log}")

    def run(self, stop: threading.Event, duration: float | None = None) -> None:
        """Tick until `stop` is set or `duration` wall seconds passed."""
        end = time.monotonic() + duration if duration else None
        next_tick = time.monotonic()
        while not stop.is_set() and (end is None or time.monotonic() < end):
            self.step(time.time())
            next_tick += self.config.tick
            delay = next_tick - time.monotonic()
            if delay < 0:  # a slow tick: skip the missed ones rather than rush
                next_tick, delay = time.monotonic(), 0.0
            stop.wait(delay)

    def close(self) -> None:
        for exporter in self.exporters:
            exporter.stop()
        self.exporters = []
