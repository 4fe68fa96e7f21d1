"""One unmodified `llmmon serve` per simulated node, each on its own port, stopped by PID."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from llmmon.simulate.node import NodeSim

READY_TIMEOUT = 120.0  # ten daemons importing FastAPI on two busy cores take a while


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class Exporter:
    node: NodeSim
    host: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        stop_process(self.process)


def stop_process(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`; always reaped."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)


def start(nodes: list[NodeSim], host: str, port_base: int,
          extra_args: list[str]) -> list[Exporter]:
    """Start a daemon per node: port_base + node index, or free ports when port_base is 0."""
    exporters = []
    try:
        for node in nodes:
            port = port_base + node.layout.index if port_base else free_port(host)
            log = node.paths.root / "serve.log"
            with open(log, "ab") as handle:
                process = subprocess.Popen(
                    [sys.executable, "-m", "llmmon", "serve",
                     f"--web.listen-address={host}:{port}", *node.paths.serve_args(),
                     *extra_args],
                    stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
            exporters.append(Exporter(node, host, port, process, log))
        wait_ready(exporters)
    except BaseException:
        for exporter in exporters:
            exporter.stop()
        raise
    return exporters


def wait_ready(exporters: list[Exporter], timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    for exporter in exporters:
        while True:
            if exporter.process.poll() is not None:
                raise RuntimeError(f"llmmon serve for {exporter.node.name} exited with "
                                   f"{exporter.process.returncode}; see {exporter.log}")
            try:
                with urllib.request.urlopen(exporter.url + "/healthz", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"llmmon serve for {exporter.node.name} not ready after "
                                       f"{timeout:.0f}s; see {exporter.log}") from None
                time.sleep(0.1)


def write_targets(path: Path, exporters: list[Exporter], cluster: str) -> None:
    """A Prometheus file_sd file: one target per node, labelled with node and cluster."""
    targets = [{"targets": [f"{e.host}:{e.port}"], "labels": {"node": e.node.name,
                                                            "cluster": cluster}}
               for e in exporters]
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(targets, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def write_manifest(path: Path, exporters: list[Exporter]) -> None:
    """node -> URL, PID, tree and log of its daemon, for people and for scripts that must
    stop the daemons by PID should the simulator itself be killed."""
    manifest = [{"node": e.node.name, "url": e.url, "pid": e.process.pid,
                 "root": str(e.node.paths.root), "log": str(e.log)} for e in exporters]
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)
