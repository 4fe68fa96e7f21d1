"""The pages as a person sees them: a real headless Chromium opens them, reads what is shown
(innerText, where each element lands, whether the page fits 1280 px) and keeps a screenshot of
each under $LLMMON_TEST_ARTEFACTS (else the test's tmp_path).

The incident pages come from the app under llmmon's HTTP server in this process, over an
incident directory built per the format and a ranks collector over the 4-rank fixture spool;
the node status page also from a real `llmmon serve`, with its collector process up and then
frozen.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Iterator

import pytest
import requests
import uvicorn

from llmmon.incidents.store import Store
from llmmon.sampler import Sampler
from llmmon.serve import httpserver
from llmmon.serve.app import create_app
from llmmon.serve.routes import collector_routes
from llmmon_reporter.spoolfile import write_atomic
from tests.conftest import FIXTURES
from tests.helpers import wait_for
from tests.incidents.fixtures import write_incident
from tests.ranks.jobs import make_collector, scrape
from tests.ranks.test_nccl_dumps import staged
from tests.slow.incidents.browser import HEIGHT, WIDTH, Browser, Tab, colours, png_size, running

INCIDENT = "20261130T005320Z-team-a.llama-3f2a9c"
LAYOUT = """JSON.stringify({
  title: document.title, text: document.body.innerText, path: location.pathname,
  overflow: document.documentElement.scrollWidth - document.documentElement.clientWidth,
  resources: performance.getEntriesByType('resource').map(r => r.name)})"""


def box(tab: Tab, selector: str) -> dict:
    """Where the first element matching `selector` is drawn, and whether it is visible."""
    return tab.evaluate(f"""(() => {{
      const e = document.querySelector({selector!r});
      if (!e) return null;
      const r = e.getBoundingClientRect(), s = getComputedStyle(e);
      return {{top: r.top, bottom: r.bottom, left: r.left, right: r.right, width: r.width,
               height: r.height, visible: s.visibility === 'visible' && s.display !== 'none'
               && parseFloat(s.opacity) > 0, text: e.innerText}};
    }})()""")


def seen(tab: Tab) -> dict:
    """What the page shows: its title, text, path, overflow and the resources it loaded."""
    return json.loads(tab.evaluate(LAYOUT))


def artefacts(tmp_path: Path) -> Path:
    return Path(os.environ.get("LLMMON_TEST_ARTEFACTS", tmp_path)) / "incidents"


def looks_like_a_page(png: bytes) -> None:
    """A full viewport with text and colour on it, not a blank or half-drawn screen."""
    assert png_size(png) == (WIDTH, HEIGHT)
    assert colours(png, 400) > 50


@contextlib.contextmanager
def serving(app: object) -> Iterator[str]:
    """The app under llmmon's own HTTP server, in a thread; its base URL."""
    limits = httpserver.ConnectionLimits(max_connections=16, read_timeout=10.0,
                                         idle_timeout=10.0, shutdown_grace=1.0)
    listener = httpserver.Listener(httpserver.bind("127.0.0.1", 0, 16), limits)
    server = httpserver.HTTPServer(uvicorn.Config(app, http="h11", lifespan="off",
                                                  log_config=None), listener)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 60, "the server to start")
        yield f"http://127.0.0.1:{listener.sock.getsockname()[1]}"
    finally:
        server.handle_exit(signal.SIGTERM, None)
        thread.join(timeout=30)
    assert not thread.is_alive(), "the server did not stop"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    with running(tmp_path) as started:  # killed, process group and all, however the test ends
        yield started


@pytest.fixture
def node(tmp_path: Path) -> Iterator[str]:
    """The app over an incident directory and the fixture job's ranks, stalled: rank 3 never
    enqueued _all_gather_base #16, ranks 0-2 wait in it."""
    root = tmp_path / "incidents"
    write_incident(root)
    write_incident(root, job_id="team-b.bert", onset=1796000000.0 - 86400, suffix="00000b")
    spool, now = staged(tmp_path, "nccl4")
    collector = make_collector(spool, tmp_path, stall_after="5s")
    scrape(collector, now)
    app = create_app(Sampler([collector], "test"), collector_routes([collector]),
                     incidents=Store(str(root)))
    with serving(app) as url:
        yield url


def test_an_incident_reads_in_a_browser(browser: Browser, node: str, tmp_path: Path) -> None:
    tab = browser.tab()
    tab.open(f"{node}/incidents/latest?job_id=team-a.llama")  # a redirect to the page
    page = seen(tab)
    assert page["path"] == f"/incidents/{INCIDENT}"
    assert page["title"] == f"team-a.llama: incident {INCIDENT} on node-a · llmmon"
    assert page["overflow"] <= 0, f"{page['overflow']} px wider than a {WIDTH} px window"
    assert page["resources"] == []  # nothing loaded from anywhere: it works offline
    text = page["text"]
    assert "Culprit: rank 3 — it never enqueued the collective the other ranks wait in" in text
    assert "complete 23.0 s after onset" in text
    assert "nfs: server storage-1 not responding, still trying" in text
    assert "llmmon incident team-a.llama --prometheus URL" in text
    culprit = box(tab, "#culprit-line")
    assert culprit["visible"] and 0 <= culprit["top"] < culprit["bottom"] <= HEIGHT, culprit
    assert culprit["text"].startswith("Culprit: rank 3")
    groups = tab.evaluate("[...document.querySelectorAll('#stacks .group h3')]"
                          ".map(h => [h.innerText, h.parentElement.className])")
    assert groups == [["rank 3 — culprit in load_next_batch (data.py:41)", "group culprit"],
                      ["ranks 0–2 in all_reduce #42 (group 0, world)", "group"]]
    highlighted = tab.evaluate("getComputedStyle(document.querySelector('#gpus tr.hl td'))"
                               ".backgroundColor")
    assert highlighted == "rgb(255, 243, 205)"  # what changed most stands out
    looks_like_a_page(tab.screenshot(artefacts(tmp_path) / "incident.png"))

    link = tab.evaluate("document.querySelector(\"#files a[href$='fr/rank_3.json']\").href")
    assert requests.get(link, timeout=10).json()["pg_status"]["0"][
        "last_enqueued_collective"] == 41


def test_the_list_of_incidents(browser: Browser, node: str, tmp_path: Path) -> None:
    tab = browser.tab()
    tab.open(f"{node}/incidents")
    page = seen(tab)
    assert page["title"] == "Incidents on this node · llmmon" and page["overflow"] <= 0
    rows = tab.evaluate("[...document.querySelectorAll('table tr')].slice(1)"
                        ".map(r => r.cells[1].innerText)")
    assert rows == ["team-a.llama", "team-b.bert"]  # newest first
    looks_like_a_page(tab.screenshot(artefacts(tmp_path) / "list.png"))
    tab.open(tab.evaluate("document.querySelector('table a').href"))
    assert seen(tab)["path"] == f"/incidents/{INCIDENT}"


def test_the_node_status_shows_the_stalled_job_and_its_incidents(browser: Browser, node: str,
                                                                  tmp_path: Path) -> None:
    tab = browser.tab()
    tab.open(f"{node}/")
    page = seen(tab)
    assert page["title"] == "llmmon exporter" and page["overflow"] <= 0
    text = page["text"]
    assert "job llama-8b: rank 3 (world group 0 {0-3}) waits on nothing; ranks 0–2 wait in " \
           "world _all_gather_base #16 (group 0) for rank 3" in text
    verdict = box(tab, "#ranks .culprit")
    assert verdict["visible"] and verdict["bottom"] <= HEIGHT, verdict
    ranks = tab.evaluate("[...document.querySelectorAll('#ranks tr')].slice(1)"
                         ".map(r => [r.cells[0].innerText, r.cells[1].innerText, r.className])")
    assert ranks == [["0", "llama-8b-worker-0", ""], ["1", "llama-8b-worker-1", ""],
                     ["2", "llama-8b-worker-2", ""], ["3", "llama-8b-worker-3", "hl"]]
    incidents = tab.evaluate("[...document.querySelectorAll('#incidents a')].map(a => a.href)")
    assert incidents[0] == f"{node}/incidents/{INCIDENT}" and len(incidents) == 2
    looks_like_a_page(tab.screenshot(artefacts(tmp_path) / "status.png"))


def _child(server_pid: int) -> int:
    """The collector process of a `llmmon serve`."""
    for task in Path(f"/proc/{server_pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            if b"llmmon.serve.child" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
    raise AssertionError("no collector process")


def test_a_real_server_status_page_with_its_collector_process_up_then_frozen(
        serve, browser: Browser, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    shutil.copytree(FIXTURES / "spool" / "nccl4", spool)
    for path in spool.glob("*/*.json"):  # written now: the ranks are up
        write_atomic(str(path.parent), path.name, path.read_bytes())
    incidents = tmp_path / "incidents"
    server = serve("--collector.disable-defaults", "--collector.ranks", f"--spool.dir={spool}",
                   "--collector.ranks.stale-after=1h", "--collector.ranks.auto-dump=false",
                   "--collector.incidents", f"--collector.incidents.dir={incidents}")
    server.wait_collected()
    # the stalled fixture job: the daemon keeps an incident of it on its own
    listed = wait_for(lambda: requests.get(server.url + "/api/v1/incidents", timeout=5)
                      .json()["incidents"] or None, 60, "the daemon's incident")
    tab = browser.tab()
    tab.open(server.url + "/")
    text = seen(tab)["text"]
    assert "job llama-8b ranks 0–3 here stalled" in text
    assert "rank 3 (world group 0 {0-3}) waits on nothing" in text
    assert "ranks\tok" in text  # the collectors table, as before
    looks_like_a_page(tab.screenshot(artefacts(tmp_path) / "status-serve.png"))

    child = _child(server.proc.pid)
    os.kill(child, signal.SIGSTOP)  # it cannot answer: the page must still come, and say so
    try:
        tab.open(server.url + "/")
        page = seen(tab)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGCONT)
    assert page["title"] == "llmmon exporter"
    for section in ("#ranks", "#diagnosis"):
        said = box(tab, section)
        assert said["visible"] and "not available now: the collector process" in said["text"]
    looks_like_a_page(tab.screenshot(artefacts(tmp_path) / "status-collector-frozen.png"))
    # the incident is read from disk: its page comes while the collector process is stopped
    os.kill(child, signal.SIGSTOP)
    try:
        tab.open(f"{server.url}/incidents/{listed[0]['id']}")
        page = seen(tab)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGCONT)
    assert "rank 3 (world group 0 {0-3}) waits on nothing" in page["text"], page["text"][:2000]
    looks_like_a_page(tab.screenshot(artefacts(tmp_path) / "incident-serve.png"))
