"""A fleet of simulated nodes in one process: N `/metrics` endpoints from one recorded exposition.

Running N real `llmmon serve` daemons would need N Python processes; a 2-core machine holds a
dozen.  The fleet instead records what one simulated node's unmodified exporter serves
(`llmmon simulate`, 8 H200s, 8 RDMA ports, 16 disks, an 8-rank job, every collector at its
default flags) and serves it N times from one asyncio process, as `/nodes/<i>/metrics`:

- per node, the labels that identify hardware or a job are rewritten so that no two nodes share
  a GPU (`uuid`, `serial`), and nodes form jobs of `--job-nodes` nodes with global ranks
  (`job_id`, `rank`, `ranks`, `world_size`, `pod`), as a real fleet has;
- counters, histogram buckets, sums and counts advance: each is scaled by (1 + t/600 s), so a
  rate is constant and a histogram stays monotone in `le`; `*_timestamp_seconds` gauges keep
  the age they had when the exposition was recorded and advance with the clock (no job looks
  hung, however old the recording), every other gauge stays as recorded;
- `--hung-jobs K` freezes the last-progress timestamps (each rank's and each group's) of the
  first K jobs' nodes `HUNG_FOR_S` before the fleet started: those jobs look hung to the rules
  (past the 180 s hang window) from the start, so that what a rule costs while jobs hang can
  be measured, not only when none does;
- the `node` and `cluster` labels come from the file_sd targets file it writes, as they do in
  the shipped scrape configs.

The body of a node is one %-format of a template built once, so N=1000 nodes scraped every
15 s cost well under one core.

    python bench/fleet.py --nodes 1000 --port 9900 --targets /tmp/fleet.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "exporter"), str(ROOT / "reporter"), str(ROOT)]

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
GROWTH_S = 600.0  # a counter grows by its recorded value every GROWTH_S seconds
GPUS = 8
NODE_LABELS = ("uuid", "serial", "job_id", "rank", "ranks", "world_size", "pod")
RECORD_SETTLE_S = 40.0  # the GPU collector's 15 s slow calls and two ranks ticks
# A rank's collective marks (multiples of 256) come after ~65 s of the simulated job; the
# straggler rules compare ranks across nodes by them, so the recording waits for one.
MARK = "llmmon_nccl_mark_enqueue_timestamp_seconds{"
RECORD_DEADLINE_S = 300.0
HUNG_FOR_S = 600.0  # how long a --hung-jobs job has completed nothing when the fleet starts
# Frozen on a hung job's nodes: each rank's last progress, and the newest of them per group.
PROGRESS = ("llmmon_nccl_last_progress_timestamp_seconds",
            "llmmon_nccl_group_last_progress_timestamp_seconds")


class Template:
    """One recorded exposition as a two-stage %-format: values first (once per second, shared by
    every node), then the node's own labels (`%%s` slots, which survive the first stage)."""

    def __init__(self, exposition: str) -> None:
        kinds: dict[str, str] = {}
        parts: list[str] = []
        self.values: list[tuple[str, float]] = []  # ("counter" | "clock" | "progress", value)
        self.labels: list[tuple[str, str]] = []  # (label key, recorded value) per label slot
        for line in exposition.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                kinds[name] = kind
            if not line or line[0] == "#":
                parts.append(line.replace("%", "%%%%") + "\n")
                continue
            match = SAMPLE.match(line)
            if match is None:
                raise ValueError(f"not an exposition line: {line!r}")
            name, labels, value = match.groups()
            parts.append(name)
            if labels:
                parts.append(LABEL.sub(self._label, labels.replace("%", "%%%%")))
            parts.append(" " + self._value(name, kinds, value) + "\n")
        self.format = "".join(parts)
        # When it was recorded: its newest timestamp (the exporter's last collector run).
        self.recorded_at = max((v for kind, v in self.values if kind != "counter"), default=0.0)

    def _label(self, match: re.Match[str]) -> str:
        key, value = match.groups()
        if key in NODE_LABELS:
            self.labels.append((key, value))
            return f'{key}="%%s"'
        return match.group(0)

    def _value(self, name: str, kinds: dict[str, str], value: str) -> str:
        family = re.sub(r"_(total|bucket|sum|count|created)$", "", name)
        if name.endswith("_timestamp_seconds"):
            self.values.append(("progress" if name in PROGRESS else "clock", float(value)))
            return "%s"
        if float(value) and (kinds.get(family) in ("counter", "histogram", "summary")
                             or kinds.get(name) == "counter"):
            self.values.append(("counter", float(value)))
            return "%s"
        return value

    def at(self, started: float, elapsed: float, hung: bool = False) -> str:
        """The exposition `elapsed` seconds after `started` (Unix time), with every node label
        still a `%s` slot; `hung`: the last-progress timestamps stay `HUNG_FOR_S` before
        `started`."""
        scale = 1.0 + elapsed / GROWTH_S
        shift = started - self.recorded_at
        return self.format % tuple(
            repr(round(v * scale, 3)) if kind == "counter"
            else repr(v + shift - HUNG_FOR_S) if hung and kind == "progress"
            else repr(v + shift + elapsed)
            for kind, v in self.values)


@dataclass(frozen=True)
class Placement:
    """Where node `index` sits in the fleet: its job and the first global rank on it."""

    index: int
    job_nodes: int

    @property
    def job(self) -> str:
        return f"fleet-{self.index // self.job_nodes:04d}"

    @property
    def first_rank(self) -> int:
        return (self.index % self.job_nodes) * GPUS

    def label(self, key: str, value: str) -> str:
        if key == "uuid":  # GPU-xxxxxxxx-...: the first group names the node
            return f"GPU-{self.index:08x}{value[12:]}"
        if key == "serial":
            return f"{self.index:06d}{value[-7:]}"
        if key == "job_id":
            return self.job
        if key == "rank":
            return str(self.first_rank + int(value))
        if key == "ranks":
            return f"{self.first_rank}-{self.first_rank + GPUS - 1}"
        if key == "world_size":
            return str(self.job_nodes * GPUS)
        if key == "pod":
            return f"{self.job}-{self.index:04d}"
        raise KeyError(key)


class Fleet:
    def __init__(self, template: Template, nodes: int, job_nodes: int, hung_jobs: int = 0
                 ) -> None:
        self.template = template
        self.hung_nodes = hung_jobs * job_nodes
        self.started = time.time()
        unique = sorted(set(template.labels))
        slot_of = {label: i for i, label in enumerate(unique)}
        order = [slot_of[label] for label in template.labels]
        self.labels = []  # per node: the values of every label slot, in template order
        for index in range(nodes):
            place = Placement(index, job_nodes)
            resolved = [place.label(key, value) for key, value in unique]
            self.labels.append(tuple(resolved[i] for i in order))
        self._second, self._current = -1, ("", "")

    def body(self, index: int) -> bytes:
        second = int(time.time() - self.started)
        if second != self._second:
            self._second = second
            self._current = (self.template.at(self.started, second),
                             self.template.at(self.started, second, hung=True)
                             if self.hung_nodes else "")
        return (self._current[index < self.hung_nodes] % self.labels[index]).encode()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """HTTP/1.1 keep-alive GETs of /nodes/<i>/metrics (what Prometheus and vmagent send)."""
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                match = re.fullmatch(r"/nodes/(\d+)/metrics(\?.*)?", path)
                if match and int(match.group(1)) < len(self.labels):
                    body, status = self.body(int(match.group(1))), b"200 OK"
                else:
                    body, status = b"not found\n", b"404 Not Found"
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain; "
                             b"version=0.0.4\r\nContent-Length: " + str(len(body)).encode()
                             + b"\r\n\r\n" + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def write_targets(path: Path, host: str, port: int, nodes: int, cluster: str) -> None:
    """file_sd: one target per node, its path in `__metrics_path__`, labelled node and cluster."""
    targets = [{"targets": [f"{host}:{port}"],
                "labels": {"__metrics_path__": f"/nodes/{i}/metrics",
                           "node": f"fleet-{i:04d}", "cluster": cluster}}
               for i in range(nodes)]
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(targets) + "\n")
    os.replace(temporary, path)


def record(path: Path) -> str:
    """One scrape of a simulated fat node (8 GPUs, 8 NICs, 16 disks, 8 ranks), default flags,
    once its ranks have a collective mark."""
    from llmmon.simulate.cluster import ClusterConfig
    from llmmon.simulate.runner import Simulation

    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix="llmmon-fleet-", dir=shm))
    simulation = Simulation(work, ClusterConfig(nodes=1, disks=16), [])
    try:
        simulation.serve("127.0.0.1", 0, ["--log.level=warning"])
        started, text = time.monotonic(), ""
        while time.monotonic() - started < RECORD_SETTLE_S or MARK not in text:
            if time.monotonic() - started > RECORD_DEADLINE_S:
                raise RuntimeError(f"no {MARK[:-1]} series after {RECORD_DEADLINE_S:.0f} s "
                                   "of the simulated job")
            simulation.step(time.time())
            time.sleep(1.0)
            with urllib.request.urlopen(simulation.exporters[0].url + "/metrics",
                                        timeout=30) as r:
                text = r.read().decode()
    finally:
        simulation.close()
        shutil.rmtree(work, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


async def serve(fleet: Fleet, host: str, port: int) -> None:
    server = await asyncio.start_server(fleet.handle, host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=125)
    parser.add_argument("--job-nodes", type=int, default=16,
                        help="nodes per training job (default 16: 128-rank jobs)")
    parser.add_argument("--hung-jobs", type=int, default=0,
                        help="jobs whose last-progress timestamps stay frozen (default 0)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9900)
    parser.add_argument("--cluster", default="fleet")
    parser.add_argument("--targets", type=Path, required=True, help="file_sd file to write")
    parser.add_argument("--exposition", type=Path,
                        default=ROOT / "bench" / "results" / "fleet-node.prom",
                        help="recorded exposition; recorded from `llmmon simulate` if missing")
    parser.add_argument("--record", action="store_true", help="re-record the exposition")
    args = parser.parse_args()
    if args.record or not args.exposition.exists():
        text = record(args.exposition)
    else:
        text = args.exposition.read_text()
    fleet = Fleet(Template(text), args.nodes, args.job_nodes, args.hung_jobs)
    write_targets(args.targets, args.host, args.port, args.nodes, args.cluster)
    series = sum(1 for line in text.splitlines() if line and line[0] != "#")
    print(f"fleet: {args.nodes} nodes x {series} series on http://{args.host}:{args.port}"
          f"/nodes/<i>/metrics; targets {args.targets}", flush=True)
    try:
        asyncio.run(serve(fleet, args.host, args.port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
