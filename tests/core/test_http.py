"""Real HTTP round trips against `llmmon serve`, promtool on its output, and the golden file."""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Callable, Iterator

import pytest
import requests
import uvicorn

from llmmon.serve import httpserver
from tests.conftest import FIXTURES, compare_golden
from tests.helpers import wait_for

VOLATILE = re.compile(
    r"^(llmmon_exporter_collector_(?:duration_seconds|last_success_timestamp_seconds)\{.*\}) .*$",
    re.M)
DISK_ONLY = ("--collector.disable-defaults", "--collector.disk",
             f"--path.procfs={FIXTURES / 'proc'}", f"--path.sysfs={FIXTURES / 'sys'}")


def masked(text: str) -> str:
    return VOLATILE.sub(r"\1 <volatile>", text)


def test_metrics_golden_and_content_negotiation(serve) -> None:
    server = serve(*DISK_ONLY)
    server.wait_collected()
    text = requests.get(server.url + "/metrics", timeout=5)
    assert text.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    compare_golden("disk.prom", masked(text.text))

    prometheus_accept = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                         "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    om = requests.get(server.url + "/metrics", headers={"Accept": prometheus_accept,
                                                        "Accept-Encoding": "gzip"}, timeout=5,
                      stream=True)
    assert om.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert om.headers["content-encoding"] == "gzip"
    body = gzip.decompress(om.raw.read()).decode()
    assert body.endswith("# EOF\n") and body.count("# EOF") == 1
    assert 'llmmon_disk_reads_total{device="sda"} 2.5354637e+07' in body
    assert "# TYPE llmmon_disk_reads counter" in body


def test_healthz_landing_and_collectors_api(serve) -> None:
    server = serve(*DISK_ONLY)
    server.wait_collected()
    assert requests.get(server.url + "/healthz", timeout=5).text == "ok\n"
    landing = requests.get(server.url + "/", timeout=5)
    assert "text/html" in landing.headers["content-type"]
    assert "<td>disk</td><td class='ok'>ok</td>" in landing.text
    api = requests.get(server.url + "/api/v1/collectors", timeout=5).json()
    (disk,) = api["collectors"]
    assert disk["name"] == "disk" and disk["status"] == "ok" and disk["watched"] == 6
    # 8 basic fields on each of the 6 devices (the rest need --collector.disk.extended) + PSI.
    assert disk["errors_total"] == 0 and disk["series"] == 8 * 6 + 2
    assert requests.get(server.url + "/nope", timeout=5).status_code == 404


def test_promtool_accepts_the_exposition(serve) -> None:
    server = serve(*DISK_ONLY)
    server.wait_collected()
    body = requests.get(server.url + "/metrics", timeout=5).content
    result = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True,
                            timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == b""  # no lint warnings at all


def test_hung_source_behind_a_real_server(serve, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc", proc, ignore=shutil.ignore_patterns("[0-9]*", "self"))
    (proc / "diskstats").unlink()
    os.mkfifo(proc / "diskstats")
    server = serve("--collector.disable-defaults", "--collector.disk",
                   "--collector.disk.timeout=300ms", f"--path.procfs={proc}")
    try:
        (disk,) = server.wait_collected()
        assert disk["status"] == "failed" and "timed out" in disk["last_error"]
        for _ in range(20):  # the scrape path never waits on the blocked read
            response = requests.get(server.url + "/metrics", timeout=2)
            assert 'llmmon_exporter_collector_success{collector="disk"} 0.0' in response.text
    finally:
        threading.Thread(target=lambda: open(proc / "diskstats", "w").close(),
                         daemon=True).start()


def test_machine_without_gpus_rdma_or_ranks_is_not_a_failure(serve) -> None:
    """On this CI machine: every default collector is ok or has nothing to watch."""
    server = serve()
    states = {s["name"]: s for s in server.wait_collected(timeout=30)}
    assert states["disk"]["status"] == "ok"
    bad = {n: s for n, s in states.items() if s["status"] not in ("ok", "empty")}
    assert not bad, bad
    for name, state in states.items():
        if state["status"] == "empty":
            assert state["message"].startswith("nothing to watch")
            assert f"collector={name} found nothing to watch" in server.log()


async def _ok(scope: dict, receive: Callable, send: Callable) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok\n"})


@contextlib.contextmanager
def _serving(stop: Callable[[httpserver.HTTPServer], None]
             = lambda s: setattr(s, "should_exit", True)
             ) -> Iterator[tuple[httpserver.HTTPServer, str]]:
    """llmmon's own server and Listener, in a thread, with a minimal ASGI app; `stop` ends it."""
    limits = httpserver.ConnectionLimits(max_connections=4, read_timeout=10.0, idle_timeout=10.0,
                               shutdown_grace=1.0)
    listener = httpserver.Listener(httpserver.bind("127.0.0.1", 0, 16), limits)
    server = httpserver.HTTPServer(uvicorn.Config(_ok, http="h11", lifespan="off", log_config=None),
                               listener)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 60, "the server to start")
        yield server, f"http://127.0.0.1:{listener.sock.getsockname()[1]}/"
    finally:
        stop(server)
        thread.join(timeout=30)
    assert not thread.is_alive(), "the server did not stop"


def test_every_accepted_connection_sends_at_once_without_waiting_for_the_clients_ack() -> None:
    # The Listener accepts sockets itself, and asyncio sets TCP_NODELAY only on sockets whose
    # proto is IPPROTO_TCP (socket.create_server's are 0). Without it, a keep-alive scraper's
    # responses waited for its delayed ACK (40 ms) between their headers and their body.
    with _serving() as (server, url), requests.Session() as session:
        assert session.get(url, timeout=10).text == "ok\n"
        opened = [c.transport.get_extra_info("socket") for c in list(server.listener._open)]
        assert [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in opened] == [1]


def test_the_server_loop_renews_the_date_on_every_wakeup(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    # uvicorn's loop wakes ten times a second to renew a Date header of a second's resolution
    # (0.2 % of a core here); llmmon's wakes every TICK, and each wakeup renews it.
    monkeypatch.setattr(httpserver, "TICK", 0.05)
    ticks: list[int] = []
    with _serving() as (server, _):
        on_tick = server.on_tick

        async def counted(counter: int) -> bool:
            ticks.append(counter)
            return await on_tick(counter)

        server.on_tick = counted  # type: ignore[method-assign]
        wait_for(lambda: len(ticks) >= 3, 60, "three wakeups")
    assert all(counter % 10 == 0 for counter in ticks), ticks


def test_a_stop_signal_wakes_the_server_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpserver, "TICK", 3600.0)  # only the signal can end its wait
    with _serving(lambda server: server.handle_exit(signal.SIGTERM, None)) as (server, _):
        pass
    server.handle_exit(signal.SIGTERM, None)  # a late signal, its loop closed: no error
