"""The incident page, the list and the node status page as HTML: what they say, that anybody's
text in them is escaped, and that a bad file costs its own section only."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from llmmon.collector import RouteError
from llmmon.incidents import incidentpage
from llmmon.incidents.html import list_page
from llmmon.incidents.incidentpage import Incident, incident_page
from llmmon.incidents.status import Answer, NodeStatus, status_page
from llmmon.incidents.store import Listing, Store
from tests.incidents.fixtures import (JOB, ONSET, frame, ranks_document, stacks_document,
                                      summary_document, incident_id, write_incident)

HOSTILE = "<script>alert(1)</script>"


def text_of(page: str) -> str:
    """The page's text without tags, entities decoded: roughly what a reader sees."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def rendered(root: Path, **files: object) -> str:
    directory = write_incident(root, files=files or None)
    return incident_page(Incident.read(Store(str(root)), directory.name))


def test_the_page_says_who_when_and_where(tmp_path: Path) -> None:
    page = rendered(tmp_path)
    seen = " ".join(text_of(page).split())
    assert "<title>team-a.llama: incident 20261130T005320Z-team-a.llama-3f2a9c on node-a" in page
    assert "Culprit: rank 3 — it never enqueued the collective the other ranks wait in" in seen
    assert "onset 2026-11-30 00:53:20 UTC" in seen and "complete 23.0 s after onset" in seen
    assert "declared 2026-11-30 00:53:35 UTC" in seen
    assert "Stalled groups: default_pg (world), no progress for 17.2 s" in seen
    # Stacks: the culprit's group first and marked, then ranks 0-2 once.
    culprit = seen.index("rank 3 — culprit in load_next_batch (data.py:41)")
    waiting = seen.index("ranks 0–2 in all_reduce #42")
    assert culprit < waiting
    assert seen.count("all_reduce (torch/distributed/distributed_c10d.py:2440)") == 1
    assert "<div class='group culprit'><h3>rank 3 — culprit" in page
    # The ranks table marks the culprit's row.
    assert re.search(r"<tr class='hl'><td>3</td><td>llama-worker-3</td><td>S \(sleeping\)</td>"
                     r"<td>load_next_batch \(data.py:41\)</td><td>35 s</td>", page)
    # GPUs and ports: what changed most is listed and highlighted.
    assert "GPU 0 llmmon_gpu_utilization_ratio: 0.97 → 0" in seen
    assert "rdma mlx5_0 1 ib0 llmmon_rdma_port_transmit_bytes_total: 4.1e+11 → 2e+06" in seen
    assert page.count("<tr class='hl'><td>GPU ") == 4  # utilization on each of the 4 GPUs
    assert "nfs: server storage-1 not responding" in seen
    assert ("<a href='/api/v1/incidents/20261130T005320Z-team-a.llama-3f2a9c/files/fr/"
            "rank_3.json'>") in page
    assert "llmmon incident team-a.llama --prometheus URL" in seen
    timeline = seen[seen.index("Timeline"):seen.index("Ranks")]
    assert re.search(r"\+0\.0 s onset.*\+15\.0 s declared.*\+15\.0 s Flight Recorder dumps "
                     r"requested \(rank 0: collected.*\+23\.0 s completed", timeline)


def test_ranks_without_a_stack_are_named_once_and_not_blamed(tmp_path: Path) -> None:
    stacks = stacks_document()
    for rank in ("2", "3"):
        stacks["ranks"][rank].update(frames=[], source="none")
    page = rendered(tmp_path, **{"stacks.json": stacks})
    seen = " ".join(text_of(page).split())
    assert "Stacks ranks 0–1 in all_reduce #42 (group 0, world) wait" in seen
    assert "no stack captured of ranks 2–3 GPUs" in seen
    assert "group culprit" not in page


def test_rank_exits_are_on_the_timeline(tmp_path: Path) -> None:
    ranks = ranks_document()
    ranks["end"] = {"ended": True, "first": 3, "summary": "rank 3 exited first", "ranks": [
        {"rank": 3, "how": "exception", "code": 1, "error": "RuntimeError: CUDA error",
         "earliest": ONSET + 2, "latest": ONSET + 2.5},
        {"rank": 0, "how": "vanished", "code": -15, "error": "", "earliest": ONSET + 4,
         "latest": ONSET + 5}]}
    seen = " ".join(text_of(rendered(tmp_path, **{"ranks.json": ranks})).split())
    assert re.search(r"\+2\.5 s rank 3 exited: exception, code 1: RuntimeError: CUDA error .*"
                     r"\+5\.0 s rank 0 exited: vanished, code -15", seen)


def test_anybodys_text_is_escaped_everywhere(tmp_path: Path) -> None:
    job = f"team{HOSTILE}"
    incident = incident_id(job)
    summary = summary_document(incident, job)
    summary.update(node=HOSTILE, verdict=HOSTILE, trigger=HOSTILE,
                   culprit={"ranks": [3], "cause": HOSTILE, "text": HOSTILE},
                   stalled_groups=[{"pg": HOSTILE, "pg_desc": HOSTILE, "dimension": HOSTILE}],
                   dumps={"3": HOSTILE}, left_out=[HOSTILE], errors=[HOSTILE])
    ranks = ranks_document(job)
    ranks["ranks"][3].update(pod=HOSTILE, doing={"where": HOSTILE, "state": HOSTILE})
    stacks = stacks_document()
    stacks["ranks"]["3"]["frames"] = [frame(HOSTILE, HOSTILE, 1)]
    stacks["ranks"]["3"]["where"] = HOSTILE
    gpus = {"gpus": [{"gpu": HOSTILE, "uuid": HOSTILE, "name": HOSTILE,
                      "values": {HOSTILE: {"before": 1.0, "during": 9.0}},
                      "xids": [{"xid": HOSTILE, "count": HOSTILE}]}]}
    network = {"ports": [{"kind": HOSTILE, "device": HOSTILE, "counters": {
        HOSTILE: {"before": HOSTILE, "during": 1.0}}}]}
    write_incident(tmp_path, job_id=job, files={
        "summary.json": summary, "ranks.json": ranks, "stacks.json": stacks, "gpus.json": gpus,
        "network.json": network,
        "kmsg.txt": f"[1.0] {HOSTILE}\n[2.0] <img src=x onerror=alert(2)>\n".encode()})
    # A file name that is not the format's is shown, not linked.
    path = tmp_path / incident / "summary.json"
    data = json.loads(path.read_text())
    data["files"]["x'><script>1</script>"] = 1
    path.write_text(json.dumps(data))
    store = Store(str(tmp_path))
    pages = [incident_page(Incident.read(store, incident)), list_page(store.listing(), job),
             status_page(NodeStatus("1", "/metrics", [], Answer({"jobs": [ranks]}),
                                    Answer(missing=True), Answer({"source": HOSTILE}),
                                    store.listing()))]
    for page in pages:
        assert "<script" not in page.lower() and "<img" not in page.lower()
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in pages[0]
    assert "Culprit: rank 3" in text_of(pages[0])


def test_a_lone_surrogate_is_written_as_an_escape(tmp_path: Path) -> None:
    summary = summary_document(incident_id(), JOB)
    raw = json.dumps(summary).replace('"node-a"', '"node-\\ud800"')
    page = rendered(tmp_path, **{"summary.json": raw.encode()})
    page.encode("utf-8")  # HTMLResponse encodes it: it must not raise
    assert "node-\\ud800" in page


def test_a_bad_file_costs_its_own_section_only(tmp_path: Path) -> None:
    ranks = {"ranks": "x", "end": {"ranks": [{"rank": 3, "latest": 10 ** 400}]}}
    page = rendered(tmp_path, **{
        "ranks.json": ranks, "stacks.json": b"{not json", "gpus.json": {"gpus": "x"},
        "network.json": None, "kmsg.txt": b"[1.0] caf\xe9 \xff\n",
        "summary.json": {**summary_document(incident_id()), "dumps": [1], "files": [],
                         "stalled_groups": "nope", "declared": "soon"}})
    seen = " ".join(text_of(page).split())
    assert "Culprit: rank 3" in seen
    assert "stacks.json is not JSON" in seen
    assert "network.json is not in this incident" in seen
    assert "no rank in ranks.json" in seen
    assert "caf\ufffd \ufffd" in seen  # undecodable bytes shown as replacement characters
    assert "Timeline could not be shown: OverflowError" in seen  # a time past any float
    assert "declared — " in seen and "no values" in seen


def test_a_file_too_large_for_a_page_is_linked_not_parsed(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(incidentpage, "JSON_LIMIT", 1000)  # ranks.json has a few KiB
    monkeypatch.setattr(incidentpage, "KMSG_TAIL", 80)  # the fixture's last line has 68 bytes
    seen = " ".join(text_of(rendered(tmp_path)).split())
    assert re.search(r"Ranks ranks.json has \d+ bytes, over 1000 Stacks", seen)
    assert "Kernel log [812349.871002] nfs: server storage-1 not responding, still trying " \
        "Files" in seen


def test_the_list_links_each_incident_and_says_which_could_not_be_read(tmp_path: Path) -> None:
    first = write_incident(tmp_path).name
    write_incident(tmp_path, onset=ONSET + 60, suffix="0000bb", files={"summary.json": b"[]"})
    page = list_page(Store(str(tmp_path)).listing())
    assert f"<a class='nowrap' href='/incidents/{first}'>2026-11-30 00:53:43 UTC</a>" in page
    assert "20261130T005420Z-team-a.llama-0000bb: summary.json is not a JSON object" in page
    assert "no incident recorded here" in list_page(Listing([], []))


def status(ranks: Answer, diagnosis: Answer, listing: Listing | None = None,
           gpus: Answer = Answer(missing=True), ports: Answer = Answer(missing=True)) -> str:
    collectors = [{"name": "ranks", "status": "ok", "message": "", "series": 12}]
    return " ".join(text_of(status_page(NodeStatus("9.9", "/metrics", collectors, ranks,
                                                   diagnosis, gpus, listing, ports))).split())


EXPOSITION = """# HELP llmmon_rdma_port_up 1 while the port is ACTIVE.
# TYPE llmmon_rdma_port_up gauge
llmmon_rdma_port_up{device="mlx5_0",port="1"} 1.0
llmmon_rdma_port_up{device="mlx5_1",port="1"} 0.0
llmmon_rdma_port_rate_bytes_per_second{device="mlx5_0",port="1"} 5e+10
llmmon_rdma_port_rate_bytes_per_second{device="mlx5_1",port="1"} 5e+10
llmmon_rdma_transmit_bytes_total{device="mlx5_0",port="1"} 12345.0
llmmon_netdev_up{netdev="eth0"} 1.0
llmmon_netdev_speed_bytes_per_second{netdev="eth0"} 3.125e+09
llmmon_netdev_up{netdev="<b>x"} 0.0
"""


def test_the_status_page_shows_each_port_up_or_down_with_its_rate() -> None:
    seen = status(Answer({"jobs": []}), Answer(missing=True), ports=Answer(EXPOSITION))
    assert "kind port state rate netdev <b>x down — netdev eth0 up 25 Gb/s " \
        "rdma mlx5_0/1 up 400 Gb/s rdma mlx5_1/1 down 400 Gb/s" in seen
    nothing = status(Answer({"jobs": []}), Answer(missing=True), ports=Answer("# nothing\n"))
    assert "no RDMA port or network interface reported" in nothing
    assert "has not rendered its metrics yet" in status(Answer({"jobs": []}),
                                                         Answer(missing=True))


def test_the_status_page_shows_the_ranks_verdicts_and_incidents(tmp_path: Path) -> None:
    write_incident(tmp_path)
    report = {"verdict": "suspect", "branches": [
        {"title": "Training ranks", "checks": [
            {"title": "A group stalled", "verdict": "suspect", "summary": "group 0 stalled"},
            {"title": "Reporter", "verdict": "ok", "summary": "fine"}]}]}
    gpus = {"source": "NVML 13.615 (replay)", "xid_watched": [], "gpus": [
        {"index": 0, "uuid": "GPU-0", "up": True, "unsupported": []},
        {"index": 1, "uuid": "GPU-1", "up": False, "unsupported": ["fan_speed", "ecc"]}]}
    seen = status(Answer({"jobs": [ranks_document()]}), Answer(report),
                  Store(str(tmp_path)).listing(), Answer(gpus))
    assert "job team-a.llama ranks 0–3 here stalled" in seen
    assert "rank 3 (world group 0 {0-3}) is in load_next_batch" in seen
    assert "Stalled groups: job team-a.llama, group 0 (default_pg): ranks 0–2 wait" in seen
    assert "3 llama-worker-3 up S (sleeping) load_next_batch (data.py:41) 35 s" in seen
    assert "Node verdict: suspect (1 ok, 1 suspect)" in seen
    assert "Training ranks: A group stalled — group 0 stalled" in seen
    assert "2026-11-30 00:53:43 UTC team-a.llama node-a stalled job team-a.llama: rank 3" in seen
    assert "ranks ok 12" in seen
    assert "NVML 13.615 (replay) gpu uuid state NVML calls not supported 0 GPU-0 up — " \
        "1 GPU-1 down fan_speed, ecc" in seen


def test_the_status_page_renders_while_the_collector_process_is_down() -> None:
    down = str(RouteError(503, "the collector process is not running"))
    seen = status(Answer(error=f"{down} (503)"), Answer(error="boom"), None)
    assert "Ranks not available now: the collector process is not running (503)" in seen
    assert "Diagnosis not available now: boom" in seen
    assert "this server keeps no incident directory" in seen
    seen = status(Answer(missing=True), Answer({"jobs": "garbage"}), Listing([], []))
    assert "the ranks collector is not enabled on this daemon" in seen
    assert "the gpu collector is not enabled on this daemon" in seen
    assert "no incident recorded here" in seen
