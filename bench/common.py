"""Benchmark helpers: start exporters, scrape them over one keep-alive connection, read RSS, and
write results: raw JSON under bench/results/, the dated result file under docs/benchmarks/."""

from __future__ import annotations

import http.client
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
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


ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "docs" / "benchmarks"


def write_json(name: str, result: object) -> Path:
    """bench/results/<name>.json: the raw figures, not committed."""
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> str:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    return "unknown"


def result_header(title: str, when: datetime, command: str) -> str:
    """The facts every dated result starts with: when, what ran, on what, at which commit."""
    commit = _git("rev-parse", "--short", "HEAD") or "unknown (not a git checkout)"
    if _git("status", "--porcelain", "--untracked-files=no"):
        commit += " with uncommitted changes"
    try:
        load = f"{os.getloadavg()[0]:.1f}"
    except OSError:
        load = "unknown"
    rows = [("date", when.strftime("%Y-%m-%d %H:%M UTC")),
            ("command", f"`{command}`"),
            ("host cores", f"{os.cpu_count()} ({_cpu_model()}), {_memory_gib()} memory, "
                           f"load average {load} when written"),
            ("kernel", f"{platform.system()} {platform.release()}"),
            ("python", platform.python_version()),
            ("git commit", commit)]
    return "\n".join([f"# {title}", "", "| | |", "|---|---|",
                      *(f"| {key} | {value} |" for key, value in rows), ""])


def write_result(name: str, markdown: str, *, title: str | None = None,
                 command: str | None = None, when: datetime | None = None,
                 out_dir: Path | None = None) -> Path:
    """Write a benchmark's result as docs/benchmarks/<YYYY-MM-DD>-<name>.md and return its path.

    The file starts with a header (date, command, host cores, kernel, python, git commit) and
    then `markdown`, the bench's own tables and notes.  A second result of the same bench on the
    same day gets `-2`, `-3`, ... : a dated result is never overwritten.  Add the new file to
    docs/benchmarks/README.md and point the method page at it when it becomes the figure of
    record.
    """
    when = when or datetime.now(timezone.utc)
    out = out_dir or RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{when:%Y-%m-%d}-{name}"
    path, n = out / f"{stem}.md", 1
    while path.exists():
        n += 1
        path = out / f"{stem}-{n}.md"
    if command is None:
        script = Path(sys.argv[0])
        try:
            script = script.resolve().relative_to(ROOT)
        except ValueError:
            pass
        command = " ".join([f"python {script}", *sys.argv[1:]])
    header = result_header(title or f"{name}: benchmark result", when, command)
    path.write_text(header + "\n" + markdown.rstrip("\n") + "\n", encoding="utf-8")
    return path


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
