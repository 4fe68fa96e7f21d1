"""Hostile and careless clients against a real `llmmon serve` on 127.0.0.1: connection floods,
slow and partial requests, a client that stops reading at SIGTERM, a port in use; the scraper
with a good request keeps getting /metrics throughout. Attack sizes are bounded."""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Callable

import requests

from tests.conftest import FIXTURES, ROOT
from tests.helpers import free_port

DISK_ONLY = ("--collector.disable-defaults", "--collector.disk", "--collector.disk.interval=1s",
             f"--path.procfs={FIXTURES / 'proc'}", f"--path.sysfs={FIXTURES / 'sys'}")
FD_RESERVE = 128  # llmmon.serve.httpserver.FD_RESERVE, restated: the test says what it expects


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def connect(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(count)]


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the server has closed (or reset) this connection; reads what it sent."""
    while select.select([sock], [], [], 0)[0]:
        try:
            if not sock.recv(65536):
                return True
        except ConnectionError:
            return True
    return False


def send_queue(local_port: int, remote_port: int) -> int:
    """Bytes the kernel holds unsent on that TCP connection (/proc/net/tcp's tx_queue)."""
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        if (int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16)) == (
                local_port, remote_port):
            return int(fields[4].split(":")[0], 16)
    return 0


def limit_open_files(soft: int, hard: int) -> Callable[[], None]:
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def collected_since(url: str, since: float) -> dict:
    """The disk collector's state once it has run successfully after `since`."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = {s["name"]: s for s in requests.get(url + "/api/v1/collectors",
                                                    timeout=10).json()["collectors"]}["disk"]
        if (state["last_success"] or 0) > since:
            return state
        time.sleep(0.2)
    raise AssertionError(f"disk collector has not succeeded since the flood began: {state}")


def test_a_connection_flood_neither_exhausts_descriptors_nor_shuts_out_the_scraper(serve):
    """600 bare connections against a daemon whose hard open-file limit is 300: it raises its
    soft limit (100) to 300, keeps FD_RESERVE descriptors for collectors by lowering
    --web.max-connections, closes the connections idle longest to make room, and neither
    fails a collector run nor logs a line per connection."""
    server = serve(*DISK_ONLY, preexec_fn=limit_open_files(100, 300))
    server.wait_collected()
    log = server.log()
    assert f"--web.max-connections lowered from 256 to {300 - FD_RESERVE}" in log, log
    assert "open-file limit 300 (was 100)" in log, log
    before = open_fds(server.proc.pid)
    started = time.time()
    flood = connect(server.port, 600)
    try:
        for _ in range(3):
            scrape = requests.get(server.url + "/metrics", timeout=30)
            assert scrape.status_code == 200
            assert 'llmmon_exporter_collector_success{collector="disk"} 1' in scrape.text
        assert open_fds(server.proc.pid) <= before + 300 - FD_RESERVE
        state = collected_since(server.url, started)
        assert state["status"] == "ok" and state["last_error"] is None, state
        assert sum(closed_by_peer(s) for s in flood) >= 600 - (300 - FD_RESERVE)
    finally:
        for sock in flood:
            sock.close()
    log = server.wait_log("connections dropped")  # the next sweep's summary
    assert "Too many open files" not in log and "out of system resource" not in log, log
    drops = [line for line in log.splitlines() if "connections dropped" in line]
    assert 1 <= len(drops) <= 3, log  # one summary a minute, not a line per connection
    assert "closed at --web.max-connections=172" in drops[0], log


def test_slow_and_partial_requests_are_cut_off_at_the_read_timeout(serve):
    """A connection that sends nothing, one that trickles its headers and one that trickles
    its body are all closed once --web.read-timeout has passed, however long they keep
    sending; a scraper's whole request meanwhile gets /metrics."""
    server = serve(*DISK_ONLY, "--web.read-timeout=1s")
    silent, headers, body = connect(server.port, 3)
    headers.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    body.sendall(b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n")
    assert requests.get(server.url + "/metrics", timeout=30).status_code == 200
    trickling = {headers: b"X-Slow: 1\r\n", body: b"x"}
    open_ = {silent, headers, body}
    deadline = time.monotonic() + 60
    while open_ and time.monotonic() < deadline:
        for sock, more in trickling.items():
            if sock in open_:
                try:
                    sock.sendall(more)  # a byte at a time never restarts the deadline
                except ConnectionError:
                    pass
        open_ -= {s for s in open_ if closed_by_peer(s)}
        time.sleep(0.1)
    names = {silent: "silent", headers: "trickled headers", body: "trickled body"}
    assert not open_, f"still open: {[names[s] for s in open_]}"
    for sock in (silent, headers, body):
        sock.close()
    assert requests.get(server.url + "/metrics", timeout=30).status_code == 200


def test_sigterm_ends_the_daemon_after_the_grace_while_clients_stall(serve):
    """SIGTERM while one client stalls mid-body and another has pipelined requests it never
    reads the answers to: one line says shutdown began, and after --web.shutdown-grace the
    remaining connections are closed and the daemon exits."""
    server = serve(*DISK_ONLY, "--web.shutdown-grace=1s", "--web.read-timeout=10m")
    stalled = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    stalled.sendall(b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\nab")
    deaf = socket.socket()
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    deaf.connect(("127.0.0.1", server.port))
    deaf.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 2000)
    # 2,000 answers of ~5 kB do not fit in the kernel's buffers (4 MB at most): wait until
    # the daemon's send queue to that client is full and stays so, its writes blocked.
    previous, queued = -1, 0
    deadline = time.monotonic() + 60
    while not queued or queued != previous:
        assert time.monotonic() < deadline, f"send queue never filled: {queued} bytes"
        time.sleep(0.5)
        previous, queued = queued, send_queue(server.port, deaf.getsockname()[1])
    assert requests.get(server.url + "/metrics", timeout=30).status_code == 200
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(120)
    finally:
        stalled.close()
        deaf.close()
    lines = server.log().splitlines()
    assert sum("shutting down" in line for line in lines) == 1, lines
    assert any("connection(s) still open after the 1s grace" in line for line in lines), lines


def test_a_port_in_use_is_one_log_line_in_llmmons_format_and_a_failed_exit():
    """Bound before anything is logged as listening: the failure is llmmon's own JSON line."""
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):
        done = subprocess.run(
            [sys.executable, "-m", "llmmon", "serve", f"--web.listen-address=127.0.0.1:{port}",
             "--log.format=json", *DISK_ONLY], cwd=ROOT, capture_output=True, text=True,
            timeout=120)
    assert done.returncode == 1, done
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # every line is llmmon's
    errors = [line for line in lines if line["level"] == "error"]
    assert [e["msg"] for e in errors] == [
        f"cannot listen on 127.0.0.1:{port}: Address already in use"], lines
    assert not any("listening on" in line["msg"] for line in lines), lines


def test_diagnose_without_a_daemon_says_no_daemon_answers():
    url = f"http://127.0.0.1:{free_port()}"
    for branch in ((), ("--ranks",)):
        done = subprocess.run([sys.executable, "-m", "llmmon", "diagnose", "--url", url, *branch],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done
        assert done.stderr == (f"llmmon diagnose: no llmmon daemon answers at {url} "
                               "(connection refused)\n"), done.stderr


def test_a_dump_request_without_job_id_says_it_is_required(serve):
    server = serve("--collector.disable-defaults", "--collector.ranks")
    answer = requests.post(server.url + "/api/v1/ranks/dump", timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"].startswith("job_id is required: "), answer.json()
