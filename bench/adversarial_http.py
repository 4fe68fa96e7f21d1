"""Adversarial soak, HTTP half: hostile loopback clients against a real `llmmon serve`.

Each case starts a fresh daemon (HTTPS with basic auth, the disk collector on the fixture
procfs, an open-file limit of 1024 as in a default container) and runs for `--seconds`: a
Prometheus-like scraper (one keep-alive TLS connection, OpenMetrics + gzip, credentials, a
scrape every 0.5 s, 10 s timeout, one reconnect when the server closed the connection) while an
attacker on 127.0.0.1 keeps up one of:

- `idle`: nothing (the baseline);
- `tcp-flood`: 1,100 bare TCP connections, reopened as the daemon closes them;
- `slowloris`: 200 TLS connections trickling header lines and 200 trickling a body, a byte
  every second each, reopened as they are closed;
- `tls-idle`: 720 idle connections, half of them after a TLS handshake, half before one;
- `auth-flood`: 200 clients sending wrong passwords as fast as they are answered;
- `pipeline-unread`: 300 TLS connections that pipeline 100 authenticated scrapes each and never
  read an answer, reopened as they are closed;
- `pipeline-refused`: the same without credentials (each refusal is held back a second);
- `header-bomb`: 50 clients sending requests with 64 KiB of headers as fast as answered.

Sampled every 0.5 s: the daemon's RSS and open descriptors; reported: their peaks, scrape
p50/p99/max and failures, and how much the log grew. Every attack is bounded: a case opens at
most 20 x its connection count in all and stops at the deadline. The attacker shares the
machine's cores with the daemon and the scraper (in a process of its own). Prints a table and writes
bench/results/adversarial_http.json. `--seconds 15` takes about two minutes.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import multiprocessing
import os
import resource
import select
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import bcrypt
import yaml

from common import free_port, rss_mib, stop
from scrape import PROMETHEUS_HEADERS

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "bench-scrape-password"


def basic(password: str) -> str:
    return "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()


def certificate(workdir: Path) -> tuple[Path, Path]:
    cert, key = workdir / "server.crt", workdir / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def start(workdir: Path, cert: Path, key: Path, pythonpath: str) -> tuple[subprocess.Popen,
                                                                           int, Path]:
    web = workdir / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(cert),
                                                         "key_file": str(key)},
                                   "basic_auth_users": {"prometheus": hashed}}))
    port = free_port()
    log = workdir / f"serve-{port}.log"
    fixtures = ROOT / "tests" / "fixtures"
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmmon", "serve", f"--web.listen-address=127.0.0.1:{port}",
         f"--web.config.file={web}", "--collector.disable-defaults", "--collector.disk",
         f"--path.procfs={fixtures / 'proc'}", f"--path.sysfs={fixtures / 'sys'}"],
        stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": pythonpath},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)))
    wait_http_tls(port, cert)
    return proc, port, log


def wait_http_tls(port: int, cert: Path, timeout: float = 120.0) -> None:
    context = ssl.create_default_context(cafile=str(cert))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=2, context=context)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"llmmon did not answer on 127.0.0.1:{port}")


class Scraper(threading.Thread):
    """Prometheus' pattern: one keep-alive connection, reopened once when found closed."""

    def __init__(self, port: int, cert: Path, until: float) -> None:
        super().__init__(daemon=True)
        self.port, self.until = port, until
        self.context = ssl.create_default_context(cafile=str(cert))
        self.latencies: list[float] = []
        self.failures = 0
        self.reconnects = 0

    def _connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10,
                                           context=self.context)

    def scrape_once(self) -> None:
        conn = self._connect()
        conn.request("GET", "/metrics", headers={"Authorization": basic(PASSWORD)})
        assert conn.getresponse().status == 200
        conn.close()

    def run(self) -> None:
        conn = self._connect()
        headers = {**PROMETHEUS_HEADERS, "Authorization": basic(PASSWORD)}
        while time.monotonic() < self.until:
            started = time.perf_counter()
            for attempt in range(2):
                try:
                    conn.request("GET", "/metrics", headers=headers)
                    response = conn.getresponse()
                    response.read()
                    ok = response.status == 200
                    break
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn = self._connect()
                    self.reconnects += attempt == 0
                    ok = False
            if ok:
                self.latencies.append((time.perf_counter() - started) * 1000)
            else:
                self.failures += 1
            time.sleep(max(0.0, 0.5 - (time.perf_counter() - started)))
        conn.close()


def hold(port: int, count: int, until: float, opener: Callable[[], socket.socket],
         trickle: bytes = b"", read: bool = True) -> None:
    """Keep `count` connections open until `until`, reopening closed ones (bounded); with
    `read` False nothing is read from them, and only a reset or hang-up counts as closed."""
    budget = 20 * count
    held: list[socket.socket] = []
    last_trickle = 0.0
    while time.monotonic() < until:
        while len(held) < count and budget > 0 and time.monotonic() < until:
            budget -= 1
            try:
                held.append(opener())
            except OSError:
                break
        poller = select.poll()
        for sock in held:
            poller.register(sock, select.POLLIN if read else 0)
        ready = {fd for fd, _ in poller.poll(0)}
        for sock in [s for s in held if s.fileno() in ready]:
            try:
                if not read or not sock.recv(65536):
                    raise ConnectionError
            except (OSError, ssl.SSLError):
                held.remove(sock)
                sock.close()
        if trickle and time.monotonic() - last_trickle >= 1.0:
            last_trickle = time.monotonic()
            for sock in list(held):
                try:
                    sock.send(trickle)
                except (OSError, ssl.SSLError):
                    held.remove(sock)
                    sock.close()
        time.sleep(0.05)
    for sock in held:
        sock.close()


def attack(case: str, port: int, cert: Path, until: float) -> None:
    """The attacker: its own process, so that its threads do not starve the scraper's of the
    GIL (on a node the attacker is another machine; here it shares the cores)."""
    context = ssl.create_default_context(cafile=str(cert))

    def bare() -> socket.socket:
        return socket.create_connection(("127.0.0.1", port), timeout=5)

    def tls(first: bytes) -> Callable[[], socket.socket]:
        def opener() -> socket.socket:
            sock = context.wrap_socket(bare(), server_hostname="127.0.0.1")
            if first:
                sock.sendall(first)
            return sock
        return opener

    def hammer(headers: dict[str, str]) -> None:
        """GET /metrics with `headers` as fast as answered, reconnecting when closed."""
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)
        while time.monotonic() < until:
            try:
                conn.request("GET", "/metrics", headers=headers)
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30,
                                                   context=context)
                time.sleep(0.05)

    def unread(first: bytes) -> Callable[[], socket.socket]:
        """A TLS connection that sends `first` and never reads: a small receive buffer, so the
        daemon's answers back up at once, as on a client that stopped reading."""
        def opener() -> socket.socket:
            raw = socket.socket()
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            raw.settimeout(5)
            raw.connect(("127.0.0.1", port))
            sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
            sock.setblocking(False)
            try:
                sock.send(first)
            except (ssl.SSLWantWriteError, BlockingIOError):
                pass
            return sock
        return opener

    bomb = {f"X-Filler-{i}": "a" * 8000 for i in range(8)}  # 64 KiB of headers
    head = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    scrape = (head + b"Accept-Encoding: identity\r\nAuthorization: "
              + basic(PASSWORD).encode() + b"\r\n\r\n")
    post = b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000\r\n\r\n"
    plans: dict[str, list[tuple[Callable[..., None], tuple]]] = {
        "idle": [],
        "tcp-flood": [(hold, (port, 1100, until, bare))],
        "slowloris": [(hold, (port, 200, until, tls(head), b"X-a: b\r\n")),
                      (hold, (port, 200, until, tls(post), b"x"))],
        "tls-idle": [(hold, (port, 360, until, tls(b""))), (hold, (port, 360, until, bare))],
        "auth-flood": [(hammer, ({"Authorization": basic(f"wrong-{n}")},)) for n in range(200)],
        "pipeline-unread": [(hold, (port, 300, until, unread(scrape * 100), b"", False))],
        "pipeline-refused": [(hold, (port, 300, until, unread((head + b"\r\n") * 100), b"",
                                     False))],
        "header-bomb": [(hammer, (bomb,)) for _ in range(50)],
    }
    threads = [threading.Thread(target=f, args=a, daemon=True) for f, a in plans[case]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, until - time.monotonic()) + 15)


def run_case(case: str, seconds: float, workdir: Path, cert: Path, key: Path,
             pythonpath: str) -> dict:
    proc, port, log = start(workdir, cert, key, pythonpath)
    try:
        Scraper(port, cert, 0).scrape_once()  # credentials checked (and cached) before
        until = time.monotonic() + seconds
        attacker = multiprocessing.get_context("fork").Process(
            target=attack, args=(case, port, cert, until), daemon=True)
        attacker.start()
        time.sleep(min(2.0, seconds / 5))  # the attack is up before the scraper starts
        scraper = Scraper(port, cert, until)
        scraper.start()
        rss, fds = [], []
        while time.monotonic() < until:
            rss.append(rss_mib(proc.pid)[0])
            fds.append(len(os.listdir(f"/proc/{proc.pid}/fd")))
            time.sleep(0.5)
        peak_rss = rss_mib(proc.pid)[1]
        scraper.join(15)
        attacker.join(30)
    finally:
        stop(proc)
    lat = sorted(scraper.latencies) or [float("nan")]
    return {"case": case, "rss_peak_mib": round(peak_rss, 1), "rss_max_sampled_mib":
            round(max(rss), 1), "fds_max": max(fds), "scrapes": len(scraper.latencies),
            "scrape_failures": scraper.failures, "reconnects": scraper.reconnects,
            "p50_ms": round(statistics.median(lat), 2),
            "p99_ms": round(lat[max(0, int(len(lat) * 0.99) - 1)], 2),
            "max_ms": round(lat[-1], 2), "log_bytes": log.stat().st_size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="each case's length")
    parser.add_argument("--cases", default="idle,tcp-flood,slowloris,tls-idle,auth-flood,"
                        "pipeline-unread,pipeline-refused,header-bomb")
    parser.add_argument("--pythonpath",
                        default=os.pathsep.join(str(ROOT / d) for d in ("exporter", "reporter")),
                        help="where `llmmon` is imported from (default: this checkout)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" /
                                             "adversarial_http.json"))
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attacker's own sockets
    results = []
    with tempfile.TemporaryDirectory(prefix="llmmon-adversarial-") as tmp:
        workdir = Path(tmp)
        cert, key = certificate(workdir)
        for case in args.cases.split(","):
            results.append(run_case(case, args.seconds, workdir, cert, key, args.pythonpath))
            print(f"{case}: done", file=sys.stderr)
    columns = ("case", "rss_peak_mib", "fds_max", "scrapes", "scrape_failures", "reconnects",
               "p50_ms", "p99_ms", "max_ms", "log_bytes")
    print(" | ".join(columns))
    for row in results:
        print(" | ".join(str(row[c]) for c in columns))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seconds": args.seconds, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
