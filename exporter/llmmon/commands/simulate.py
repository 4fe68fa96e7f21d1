"""`llmmon simulate`: simulated training nodes served by the real exporter (docs/simulate.md)."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from llmmon.simulate.cluster import ClusterConfig
from llmmon.simulate.control import Spec, SpecError, parse
from llmmon.simulate.job import RING
from llmmon.simulate.scenarios import SCENARIOS

if TYPE_CHECKING:
    from llmmon.simulate.runner import Simulation


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that shape a simulated cluster; `llmmon demo` takes them too."""
    parser.add_argument("--nodes", type=int, default=1, help="simulated nodes (default 1)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--nics", type=int, default=8, help="RDMA NICs per node (default 8)")
    parser.add_argument("--disks", type=int, default=6,
                        help="block devices per node: OS NVMe, data NVMe, md0 (default 6)")
    parser.add_argument("--job-nodes", type=int, default=0, metavar="N",
                        help="nodes per training job (default: one job across all nodes)")
    parser.add_argument("--scenario", action="append", default=[], metavar="SPEC",
                        help="NAME[@NODE][:key=value,...]; repeat to combine. Scenarios: "
                             + ", ".join(SCENARIOS))
    parser.add_argument("--speed", type=float, default=1.0,
                        help="scenario seconds per wall second (default 1)")
    parser.add_argument("--tick", type=float, default=1.0,
                        help="wall seconds between rewrites of the inputs (default 1)")
    parser.add_argument("--ring", type=int, default=RING, metavar="N",
                        help=f"Flight Recorder records each rank keeps (default {RING}; "
                             "torch's TORCH_NCCL_TRACE_BUFFER_SIZE is often 2000)")
    parser.add_argument("--dir", type=Path,
                        help="where the node trees go (default: a temporary directory on "
                             "/dev/shm, removed at exit)")
    parser.add_argument("--host", default="127.0.0.1", help="address the daemons listen on")
    parser.add_argument("--port", type=int, default=9500,
                        help="port of the first node's daemon, +1 per node (0: free ports)")
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="extra `llmmon serve` flag for every node, e.g. "
                             "--serve-arg=--collector.gpu.interval=1s")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "simulate", help="Run simulated training nodes, each served by the real exporter.",
        description="Simulated H200 nodes (GPUs, RDMA NICs, disks, a training job) written as "
        "the files a real node gives the exporter, each served by `llmmon serve` on its own "
        "port. Switch scenarios while it runs by editing DIR/scenarios (one spec a line). "
        "See docs/simulate.md.")
    add_cluster_arguments(parser)
    parser.add_argument("--duration", type=float, metavar="SECONDS",
                        help="stop after this many wall seconds (default: until Ctrl-C)")
    parser.add_argument("--no-serve", action="store_true",
                        help="only write the trees; start no daemons")
    parser.add_argument("--list-scenarios", action="store_true",
                        help="describe every scenario, its parameters and the alerts it "
                             "should raise, and exit")
    parser.set_defaults(func=run)


def scenario_list() -> str:
    lines = []
    for name, cls in SCENARIOS.items():
        params = ", ".join([*sorted(cls.optional), *(f"{k}={v:g}" for k, v in
                                                     cls.defaults.items())]) or "none"
        lines += [f"{name}  (parameters: {params}; alerts: {', '.join(cls.alerts) or 'none'})",
                  f"    {cls.help}"]
    return "\n".join(lines)


def cluster_config(args: argparse.Namespace) -> ClusterConfig:
    return ClusterConfig(nodes=args.nodes, gpus=args.gpus, nics=args.nics, disks=args.disks,
                         job_nodes=args.job_nodes, speed=args.speed, tick=args.tick,
                         ring=args.ring)


def specs(args: argparse.Namespace) -> list[Spec]:
    return [parse(text) for text in args.scenario]


@contextlib.contextmanager
def work_dir(given: Path | None) -> Iterator[Path]:
    """The given directory (kept), or a fresh one on tmpfs where possible (removed)."""
    if given is not None:
        yield given
        return
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix="llmmon-sim-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM, so the loop can stop every process it started."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def describe(simulation: Simulation, serving: bool) -> str:
    cluster = simulation.cluster
    lines = [f"llmmon simulate: {len(cluster.nodes)} node(s), speed x{simulation.config.speed:g}"]
    for job in cluster.jobs:
        nodes = sorted({cluster.nodes[r.node].name for r in job.ranks})
        lines.append(f"  job {job.job_id}: {job.world_size} ranks on {', '.join(nodes)}")
    for exporter in simulation.exporters:
        lines.append(f"  {exporter.node.name}  {exporter.url}/metrics  {exporter.node.paths.root}")
    if not serving:
        for node in cluster.nodes:
            lines.append(f"  {node.name}  llmmon serve {' '.join(node.paths.serve_args())}")
    active = ", ".join(a.spec.text for a in cluster.active) or "healthy"
    lines += [f"  scenarios: {active}",
              f"  switch: echo 'hang@sim-00' > {simulation.control.path}  "
              "(one NAME[@NODE][:key=value,...] a line; empty: healthy)",
              f"  scenarios known: {', '.join(SCENARIOS)}"]
    if serving:
        lines.append(f"  Prometheus file_sd targets: {simulation.targets_file}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from llmmon import logs
    from llmmon.simulate.runner import Simulation

    if args.list_scenarios:
        print(scenario_list())
        return 0
    logs.setup("info", "logfmt")
    try:
        config, initial = cluster_config(args), specs(args)
    except (SpecError, ValueError) as exc:
        print(f"llmmon simulate: {exc}", file=sys.stderr)
        return 2
    with work_dir(args.dir) as root, stop_on_signals() as stop:
        try:
            simulation = Simulation(root, config, initial)
        except ValueError as exc:
            print(f"llmmon simulate: {exc}", file=sys.stderr)
            return 2
        try:
            if not args.no_serve:
                simulation.serve(args.host, args.port, args.serve_arg)
            print(describe(simulation, not args.no_serve), flush=True)
            simulation.run(stop, args.duration)
        except RuntimeError as exc:
            print(f"llmmon simulate: {exc}", file=sys.stderr)
            return 1
        finally:
            simulation.close()
    return 0
