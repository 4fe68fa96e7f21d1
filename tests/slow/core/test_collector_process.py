"""`llmmon serve` as two processes, the real binary on fixture trees: the server answers from
the collector process's last snapshot whatever that process does (frozen, killed, over its
memory cap), starts it again and counts it, and takes it down when it stops."""

from __future__ import annotations

import os
import re
import signal

import requests

from tests.conftest import FIXTURES
from tests.helpers import wait_for

DISK_ONLY = ("--collector.disable-defaults", "--collector.disk", "--collector.disk.interval=1s",
             f"--path.procfs={FIXTURES / 'proc'}", f"--path.sysfs={FIXTURES / 'sys'}")
DISK_OK = 'llmmon_exporter_collector_success{collector="disk"} 1'


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError):
                continue
    return found


def collector_process(pid: int, other_than: int | None = None, timeout: float = 60) -> int:
    """The server's collector process (a new one, when `other_than` names the old)."""
    return wait_for(lambda: next((c for c in children(pid) if c != other_than and
                                  "llmmon.serve.child" in
                                  open(f"/proc/{c}/cmdline").read().replace("\0", " ")), None),
                    timeout, f"a collector process under {pid}", interval=0.05)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def last_success(url: str) -> float:
    states = requests.get(url + "/api/v1/collectors", timeout=10).json()["collectors"]
    return states[0]["last_success"] or 0.0


def test_the_server_answers_while_the_collector_process_is_frozen(serve):
    """SIGSTOP the collector process: scrapes keep their bytes, health and the collector
    states answer from the server, a forwarded call answers 504; SIGCONT and it goes on."""
    server = serve(*DISK_ONLY)
    server.wait_collected()
    child = collector_process(server.proc.pid)
    with open(f"/proc/{child}/environ", "rb") as environ:  # flat RSS with a dozen threads
        assert b"MALLOC_ARENA_MAX=2" in environ.read().split(b"\0")
    os.kill(child, signal.SIGSTOP)
    try:
        frozen_at = last_success(server.url)
        for _ in range(20):
            scrape = requests.get(server.url + "/metrics", timeout=5)
            assert scrape.status_code == 200 and DISK_OK in scrape.text
        assert requests.get(server.url + "/healthz", timeout=5).text == "ok\n"
        assert last_success(server.url) == frozen_at
        answer = requests.get(server.url + "/api/v1/diagnose", timeout=30)
        assert answer.status_code == 504, answer.text
        assert "did not answer" in answer.json()["error"]
    finally:
        os.kill(child, signal.SIGCONT)
    wait_for(lambda: last_success(server.url) > frozen_at, 60, "a run after SIGCONT")
    assert requests.get(server.url + "/api/v1/diagnose", timeout=30).status_code == 200


def test_a_killed_collector_process_is_started_again_and_counted(serve):
    server = serve(*DISK_ONLY)
    server.wait_collected()
    child = collector_process(server.proc.pid)
    os.kill(child, signal.SIGKILL)
    log = server.wait_log("collector process exited (killed by SIGKILL); starting it again in 1s")
    assert "Traceback" not in log, log
    new = collector_process(server.proc.pid, other_than=child)
    def counted() -> str | None:
        text = requests.get(server.url + "/metrics", timeout=5).text
        counted = "llmmon_exporter_collector_process_restarts_total 1.0" in text
        return text if counted and DISK_OK in text else None  # the new process ran disk

    wait_for(counted, 60, "the restart counted in /metrics, disk collected again")
    assert alive(new) and not alive(child)


def test_a_collector_process_over_its_memory_cap_is_killed_and_reported(serve):
    """A cap no interpreter fits in: every collector process is killed, the log says why, and
    past --sampler.max-staleness every collector reads failed (LLMMonCollectorFailing)."""
    server = serve(*DISK_ONLY, "--sampler.max-rss-mib=16", "--sampler.max-staleness=1s")
    server.wait_log("over --sampler.max-rss-mib=16: killed")

    def failed() -> str | None:
        text = requests.get(server.url + "/metrics", timeout=5).text
        return text if 'llmmon_exporter_collector_success{collector="disk"} 0' in text else None

    text = wait_for(failed, 60, "disk reported failed")
    restarts = re.search(r"^llmmon_exporter_collector_process_restarts_total (\S+)$", text, re.M)
    assert restarts is not None, text
    answer = requests.get(server.url + "/api/v1/diagnose", timeout=30)
    assert answer.status_code in (503, 504), answer.text  # down, or killed while answering


def test_the_collector_process_stops_with_the_server(serve):
    """SIGTERM: the server tells it to stop (no 'went away' warning); SIGKILL of the server:
    it sees the socket close and exits by itself."""
    polite = serve(*DISK_ONLY)
    polite.wait_collected()
    child = collector_process(polite.proc.pid)
    polite.proc.send_signal(signal.SIGTERM)
    polite.proc.wait(30)
    wait_for(lambda: not alive(child), 60, "the collector process gone after SIGTERM")
    assert "went away" not in polite.log(), polite.log()

    killed = serve(*DISK_ONLY)
    killed.wait_collected()
    child = collector_process(killed.proc.pid)
    killed.proc.kill()
    killed.proc.wait(30)
    wait_for(lambda: not alive(child), 60, "the collector process gone after the server's SIGKILL")
    assert "the server went away" in killed.wait_log("went away")


PROMETHEUS_ACCEPT = {"Accept": "application/openmetrics-text;version=1.0.0,"
                               "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"}


def rendered(url: str) -> dict[str, list[str]]:
    states = requests.get(url + "/api/v1/collectors", timeout=10).json()["collectors"]
    return {s["name"]: s["formats"] for s in states}


def test_a_format_nobody_scrapes_is_no_longer_rendered_until_asked_for(serve):
    """Scraped by Prometheus alone (OpenMetrics), the collector process stops rendering text
    after --sampler.format-idle; a text scrape then gets the whole text exposition at once and
    text is rendered again from then on."""
    server = serve(*DISK_ONLY, "--sampler.format-idle=1s")
    server.wait_collected()

    def openmetrics_only() -> bool:
        scrape = requests.get(server.url + "/metrics", headers=PROMETHEUS_ACCEPT, timeout=10)
        assert scrape.status_code == 200 and scrape.text.endswith("# EOF\n")
        return rendered(server.url) == {"disk": ["openmetrics"]}

    wait_for(openmetrics_only, 60, "the text format dropped after 1s without a text scrape")
    text = requests.get(server.url + "/metrics", headers={"Accept": "text/plain"}, timeout=10)
    assert text.status_code == 200
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert DISK_OK in text.text and "llmmon_disk_reads_total{" in text.text
    assert "# EOF" not in text.text
    assert rendered(server.url) == {"disk": ["text", "openmetrics"]}
    # A frozen collector process cannot render it: the scrape is refused, not hung
    wait_for(openmetrics_only, 60, "the text format dropped again")
    child = collector_process(server.proc.pid)
    os.kill(child, signal.SIGSTOP)
    try:
        refused = requests.get(server.url + "/metrics", headers={"Accept": "text/plain"},
                               timeout=30)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
        assert "has not rendered this exposition format" in refused.text
        assert requests.get(server.url + "/metrics", headers=PROMETHEUS_ACCEPT,
                            timeout=10).status_code == 200
    finally:
        os.kill(child, signal.SIGCONT)
    assert requests.get(server.url + "/metrics", headers={"Accept": "text/plain"},
                        timeout=30).status_code == 200
