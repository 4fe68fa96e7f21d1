"""The incident routes of the app, per the contract: JSON, files, pages, the redirect to the
newest incident, and the status each failure answers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
from fastapi.testclient import TestClient

from llmmon.collector import RouteError
from llmmon.cli import build_parser
from llmmon.collectors import discover
from llmmon.config import build_settings
from llmmon.incidents import layout
from llmmon.incidents.store import Store
from llmmon.sampler import Sampler
from llmmon.serve.app import create_app
from llmmon.serve.routes import Routes
from llmmon.serve.startup import incident_store
from tests.incidents.fixtures import JOB, ONSET, ranks_document, write_incident


def client(root: Path | None, **get: Callable[[], Any]) -> TestClient:
    store = None if root is None else Store(str(root))
    return TestClient(create_app(Sampler([], "test"), Routes(get=dict(get)), incidents=store))


@pytest.fixture
def incidents(tmp_path: Path) -> tuple[TestClient, list[str]]:
    names = [write_incident(tmp_path).name,
             write_incident(tmp_path, onset=ONSET + 60, suffix="00000a").name,
             write_incident(tmp_path, job_id="team-b", onset=ONSET + 120).name]
    return client(tmp_path), names


def test_the_list_and_the_summaries(incidents: tuple[TestClient, list[str]]) -> None:
    http, (old, new, other) = incidents
    everything = http.get("/api/v1/incidents").json()
    assert [s["id"] for s in everything["incidents"]] == [other, new, old]
    assert everything["unreadable"] == []
    of_job = http.get("/api/v1/incidents", params={"job_id": JOB}).json()["incidents"]
    assert [s["id"] for s in of_job] == [new, old]
    summary = http.get(f"/api/v1/incidents/{old}")
    assert summary.status_code == 200 and summary.json()["culprit"]["ranks"] == [3]
    for unknown in ("20200101T000000Z-x-000000", "not-an-id"):
        answer = http.get(f"/api/v1/incidents/{unknown}")
        assert answer.status_code == 404 and "incident" in answer.json()["error"]


def test_files_are_served_as_they_are(tmp_path: Path,
                                      incidents: tuple[TestClient, list[str]]) -> None:
    http, (old, _, _) = incidents
    base = f"/api/v1/incidents/{old}/files"
    fr = http.get(f"{base}/fr/rank_3.json")
    assert fr.status_code == 200 and fr.headers["content-type"] == "application/json"
    assert fr.content == (tmp_path / old / "fr" / "rank_3.json").read_bytes()
    assert fr.headers["x-content-type-options"] == "nosniff"
    kmsg = http.get(f"{base}/kmsg.txt")
    assert kmsg.headers["content-type"] == "text/plain; charset=utf-8"
    assert kmsg.text.startswith("[812345.120001] nfs:")
    (tmp_path / old / "fr" / "rank_2").write_bytes(b"\x80\x04pickle")
    pickled = http.get(f"{base}/fr/rank_2")
    assert pickled.headers["content-type"] == "application/octet-stream"
    assert pickled.content == b"\x80\x04pickle"
    for bad in ("notes.txt", "fr/rank_x.json", "..%2Fsummary.json", ".llmmon-incident"):
        answer = http.get(f"{base}/{bad}")
        assert answer.status_code == 400, bad
        assert "is not a file an incident holds" in answer.json()["error"]
    assert http.get(f"{base}/fr/rank_9.json").status_code == 404
    assert http.get("/api/v1/incidents/20200101T000000Z-x-000000/files/kmsg.txt"
                    ).status_code == 404
    (tmp_path / old / "env.json").unlink()
    (tmp_path / old / "env.json").symlink_to("/etc/passwd")
    linked = http.get(f"{base}/env.json")
    assert linked.status_code == 422 and "env.json" in linked.json()["error"]
    assert "root:" not in linked.text


def test_pages_and_the_newest_incident_of_a_job(tmp_path: Path,
                                                incidents: tuple[TestClient, list[str]]) -> None:
    http, (old, new, other) = incidents
    page = http.get(f"/incidents/{old}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert "Culprit: rank 3" in page.text
    listed = http.get("/incidents", params={"job_id": "team-b"}).text
    assert f"href='/incidents/{other}'" in listed and old not in listed
    latest = http.get("/incidents/latest", params={"job_id": JOB}, follow_redirects=False)
    assert latest.status_code == 302 and latest.headers["location"] == f"/incidents/{new}"
    newest = http.get("/incidents/latest", follow_redirects=False)
    assert newest.headers["location"] == f"/incidents/{other}"
    none = http.get("/incidents/latest", params={"job_id": "nope"}, follow_redirects=False)
    assert none.status_code == 404 and "no incident of job nope here" in none.text
    unknown = http.get("/incidents/20200101T000000Z-x-000000")
    assert unknown.status_code == 404 and "<h1>Not shown</h1>" in unknown.text
    (tmp_path / new / "summary.json").write_bytes(b"\xff garbage")
    broken = http.get(f"/incidents/{new}")
    assert broken.status_code == 422 and "summary.json is not JSON" in broken.text
    assert http.get(f"/api/v1/incidents/{new}").status_code == 422
    listing = http.get("/api/v1/incidents").json()
    assert [s["id"] for s in listing["incidents"]] == [other, old]
    assert listing["unreadable"][0].startswith(f"{new}: summary.json is not JSON")


def test_a_summary_json_cannot_encode_is_still_answered(tmp_path: Path) -> None:
    name = write_incident(tmp_path).name
    path = tmp_path / name / "summary.json"
    path.write_text(path.read_text().replace('"node-a"', '"node-\\udc80"')
                    .replace('"bytes": ', '"nan": NaN, "bytes": '))
    http = client(tmp_path)
    answer = http.get(f"/api/v1/incidents/{name}")
    assert answer.status_code == 200
    assert answer.json()["node"] == "node-\\x80" and answer.json()["nan"] is None
    assert http.get(f"/incidents/{name}").status_code == 200


def test_the_landing_page_is_the_node_status(tmp_path: Path) -> None:
    write_incident(tmp_path)
    http = client(tmp_path, ranks=lambda: {"jobs": [ranks_document()]},
                  diagnose=lambda: {"verdict": "ok", "branches": []},
                  gpu=lambda: {"source": "NVML", "gpus": [{"index": 0, "uuid": "GPU-0a"}]})
    landing = http.get("/")
    assert landing.status_code == 200 and "<h1>llmmon exporter" in landing.text
    assert "<td>GPU-0a</td>" in landing.text
    assert "rank 3 (world group 0 {0-3}) is in load_next_batch" in landing.text
    assert "<a class='nowrap' href='/incidents/20261130T005320Z-team-a.llama-3f2a9c'>" \
        in landing.text
    assert "<meta http-equiv='refresh' content='30'>" in landing.text


def test_the_landing_page_renders_when_the_collector_process_cannot_answer() -> None:
    def down() -> None:
        raise RouteError(503, "the collector process is not running")

    def broken() -> None:
        raise KeyError("oops")

    landing = client(None, ranks=down, diagnose=broken).get("/")
    assert landing.status_code == 200
    assert "not available now: the collector process is not running (503)" in landing.text
    assert "not available now: KeyError: &#x27;oops&#x27;" in landing.text
    assert "this server keeps no incident directory" in landing.text


def test_without_a_directory_there_are_no_incident_routes() -> None:
    http = client(None)
    assert http.get("/incidents").status_code == 404
    assert http.get("/api/v1/incidents").status_code == 404


def test_the_server_reads_the_incidents_collectors_directory_even_with_it_disabled() -> None:
    args = build_parser().parse_args(["serve", "--no-collector.incidents",
                                      "--collector.incidents.dir=/x"])
    assert incident_store(build_settings(args, discover())).root == "/x"
    default = build_settings(build_parser().parse_args(["serve"]), discover())
    assert incident_store(default).root == layout.DEFAULT_DIR


def test_a_listing_is_json_even_when_nothing_is_there(tmp_path: Path) -> None:
    answer = client(tmp_path / "missing").get("/api/v1/incidents")
    assert answer.json() == {"incidents": [], "unreadable": []}
    assert json.loads(client(tmp_path).get("/api/v1/incidents").text)["incidents"] == []
    assert not os.path.exists(tmp_path / "missing")  # reading creates nothing
