"""Clients that never read what they asked for, and oversized request heads, against a real
`llmmon serve`: a scraper still gets in, and the bound is what docs/security.md says."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

import requests

from tests.conftest import FIXTURES

NODE = ("--collector.disable-defaults", "--collector.disk", "--collector.gpu",
        f"--path.procfs={FIXTURES / 'proc'}", f"--path.sysfs={FIXTURES / 'sys'}",
        f"--fake-nvml={FIXTURES / 'nvml' / 'h200x8'}")


def _flooder(port: int, requests_each: int) -> socket.socket:
    """A connection that pipelines GET /metrics and never reads a byte of the answers."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills the server's buffer
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        sock.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * requests_each)
    return sock


def _connections(pid: int) -> int:
    """Sockets the server holds; one closed between the listing and its read is not one."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):
            count += os.readlink(fd).startswith("socket:")
    return count


def test_clients_that_never_read_their_answers_do_not_lock_a_scraper_out(serve) -> None:
    server = serve(*NODE, "--web.max-connections=16", "--web.read-timeout=3s")
    server.wait_collected()
    port = server.port
    before = _connections(server.proc.pid)
    flood = [_flooder(port, 200) for _ in range(32)]
    try:
        deadline = time.monotonic() + 60
        while True:  # the scraper retries as Prometheus does, on its next scrape
            with contextlib.suppress(requests.RequestException):
                scrape = requests.get(server.url + "/metrics", timeout=5,
                                      headers={"Connection": "close"})
                if scrape.status_code == 200:
                    break
            assert time.monotonic() < deadline, "no scrape got through the flood"
            time.sleep(0.5)
        assert "llmmon_gpu_info" in scrape.text
        # and every flooder is dropped once its answer has waited --web.read-timeout unread,
        # while the flooders still hold their ends open
        deadline = time.monotonic() + 60
        while _connections(server.proc.pid) > before:
            assert time.monotonic() < deadline, f"{_connections(server.proc.pid)} > {before}"
            time.sleep(0.5)
    finally:
        for sock in flood:
            sock.close()


def _status(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        return sock.recv(64).split(b"\r\n")[0]


def test_request_heads_over_16_kib_are_refused_with_431(serve) -> None:
    server = serve("--collector.disable-defaults", "--collector.disk")
    filler = b"X-Filler: " + b"a" * 8000 + b"\r\n"
    fits = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + filler + b"Connection: close\r\n\r\n"
    assert _status(server.port, fits) == b"HTTP/1.1 200 OK"
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + filler * 8 + b"Connection: close\r\n\r\n"
    assert _status(server.port, big).startswith(b"HTTP/1.1 431")
