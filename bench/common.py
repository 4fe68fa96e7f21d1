"""Benchmark helpers: start exporters, scrape them over one keep-alive connection, read RSS."""

from __future__ import annotations

import http.client
import json
import os
import socket
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(port: int, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing answered on 127.0.0.1:{port}{path}")


def rss_mib(pid: int) -> tuple[float, float]:
    """Current and peak resident set size of a process, in MiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def daemon_parts(pid: int) -> dict[str, int]:
    """`llmmon serve`'s processes: the server (pid) and its live collector process."""
    parts = {"server": pid}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline") as cmdline:
                command = cmdline.read()
        except (OSError, ValueError):
            continue
        if ppid == pid and "llmmon.serve.child" in command:
            parts["collector"] = int(entry)
    return parts


def pss_mib(pid: int) -> float:
    """Proportional set size: pages shared between processes counted once in the sum."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Timing:
    median_ms: float
    p99_ms: float
    bytes: int


def scrape_times(port: int, path: str, count: int, headers: dict[str, str]) -> Timing:
    """Time `count` GETs on one keep-alive connection, as Prometheus scrapes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    samples = []
    size = 0
    for _ in range(count):
        started = time.perf_counter()
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        body = response.read()
        samples.append((time.perf_counter() - started) * 1000)
        if response.status != 200:
            raise RuntimeError(f"scrape answered {response.status}")
        size = len(body)
    conn.close()
    samples.sort()
    return Timing(statistics.median(samples), samples[int(len(samples) * 0.99) - 1], size)


def write_result(name: str, result: object) -> Path:
    """bench/results/<name>.json."""
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
