"""`llmmon incident` and `llmmon diagnose --incident` against real HTTP servers that serve
incident directories by the contract's routes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import requests

from llmmon.cli import main
from llmmon.incidents import fetch, layout
from tests.conftest import pythonpath
from tests.helpers import free_port
from tests.incidents.nodes import JOB, NodeServer, node_a, node_b, summary, write_incident


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[NodeServer, NodeServer]]:
    """Node a and node b of the job, each serving its incident."""
    roots = []
    for name, made in (("a", node_a()), ("b", node_b())):
        root = tmp_path / f"node-{name}"
        root.mkdir()
        write_incident(root, *made)
        roots.append(root)
    with NodeServer(roots[0]) as a, NodeServer(roots[1]) as b:
        yield a, b


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmmon", *args], capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": pythonpath(), "PATH": ""})


def test_the_report_of_two_nodes_names_the_culprit_and_the_unreachable_node(
        nodes: tuple[NodeServer, NodeServer]) -> None:
    a, b = nodes
    dead = f"127.0.0.1:{free_port()}"
    done = run_cli("incident", JOB, "--node", a.address, "--node", b.url, "--node", dead,
                   "--json", "--timeout", "5")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["culprit"]["ranks"] == [3] and report["culprit"]["named_by"] == ["node-b"]
    assert report["fr"]["ranks"] == [0, 1, 2, 3]
    assert [m["node"] for m in report["missing"]] == [f"http://{dead}"]
    assert "connection refused" in report["missing"][0]["reason"]
    text = run_cli("incident", JOB, "--node", a.address, "--node", b.address)
    assert "rank 3 never entered all_reduce #6 of group mesh_tp (ranks 2-3)" in text.stdout


def test_out_writes_the_report_and_every_node_s_files(
        nodes: tuple[NodeServer, NodeServer], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    a, b = nodes
    out = tmp_path / "out"
    assert main(["incident", JOB, "--node", a.address, "--node", b.address, "--out",
                 str(out)]) == 0
    assert json.loads((out / "report.json").read_text())["culprit"]["ranks"] == [3]
    assert (out / "report.txt").read_text() == capsys.readouterr().out
    assert sorted(str(p.relative_to(out)) for p in (out / "node-b").rglob("*")) == [
        "node-b/fr", "node-b/fr/rank_2.json", "node-b/fr/rank_3.json", "node-b/network.json",
        "node-b/ranks.json", "node-b/stacks.json", "node-b/summary.json"]
    assert (out / "node-b" / "fr" / "rank_3.json").read_bytes() == \
        (b.root / json.loads((out / "node-b" / "summary.json").read_text())["id"] / "fr" /
         "rank_3.json").read_bytes()


def test_diagnose_incident_prints_the_same_report(
        nodes: tuple[NodeServer, NodeServer], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = nodes
    assert main(["incident", JOB, "--node", a.address, "--node", b.address]) == 0
    expected = capsys.readouterr().out
    assert main(["diagnose", "--incident", JOB, "--node", a.address, "--node", b.address]) == 1
    assert capsys.readouterr().out == expected
    # without --node nor --prometheus: the daemon at --url alone
    assert main(["diagnose", "--incident", JOB, "--url", b.url, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["nodes"][0]["node"] == "node-b"


def test_the_newest_incident_of_the_job_is_taken(tmp_path: Path) -> None:
    root = tmp_path / "node"
    root.mkdir()
    doc, files = node_b()
    write_incident(root, doc, files)
    newer = {**doc, "id": doc["id"][:-6] + "aaaaaa", "completed": doc["completed"] + 60,
             "culprit": {"ranks": [2], "cause": "stack_root", "text": "newer"}}
    write_incident(root, newer, {})
    other = summary("node-b", [2, 3], [9], "stack_root", job_id="other",
                    id="20261207T130000Z-other-bbbbbb", completed=doc["completed"] + 120)
    write_incident(root, other, {})
    with NodeServer(root) as node:
        got = fetch.fetch_node(requests.Session(), node.url, JOB, 5)
    assert got.summary["culprit"]["text"] == "newer"


def test_no_incident_on_any_node_and_bad_addresses_are_clear_errors(
        nodes: tuple[NodeServer, NodeServer], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = nodes
    assert main(["incident", "nope", "--node", a.address, "--node", b.address]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmmon incident: no incident of job 'nope' on any of its 2 node(s)")
    assert f"{a.url}: no incident of job nope" in err
    for args, message in (
            (["--node", "ftp://host:1"], "--node 'ftp://host:1': not an http(s) address"),
            (["--node", "host:port"], "--node 'host:port': not a port"),
            (["--prometheus", "localhost:9090/x?y"], "--prometheus 'localhost:9090/x?y': not"),
            ([], "name the nodes with --node URL, or find them with --prometheus URL")):
        assert main(["incident", JOB, *args]) == 2
        assert message in capsys.readouterr().err


def test_basic_auth_and_a_node_that_refuses(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "node"
    root.mkdir()
    write_incident(root, *node_b())
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    with NodeServer(root, auth="llmmon:s3cret") as node:
        assert main(["incident", JOB, "--node", node.address]) == 2
        assert "HTTP 401" in capsys.readouterr().err
        assert main(["incident", JOB, "--node", node.address, "--node.basic-auth-user",
                     "llmmon", "--node.basic-auth-password-file", str(secret)]) == 0
    assert "culprit: rank 3" in capsys.readouterr().out
    assert main(["incident", JOB, "--node", "127.0.0.1:1", "--node.basic-auth-user", "x",
                 "--node.basic-auth-password-file", str(tmp_path / "none")]) == 2
    assert "--node: " in capsys.readouterr().err


def test_a_hostile_node_gets_none_of_its_odd_names_fetched_nor_its_huge_file_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "node"
    root.mkdir()
    doc, files = node_b()
    path = write_incident(root, doc, files)
    listed = json.loads((path / layout.SUMMARY).read_text())
    listed["files"].update({"../../etc/passwd": 10, "fr/rank_1.pickle": 3, "/etc/shadow": 1})
    (path / layout.SUMMARY).write_text(json.dumps(listed))
    monkeypatch.setattr(fetch, "MAX_FILE_BYTES", 4096)
    with NodeServer(root) as node:
        got = fetch.fetch_node(requests.Session(), node.url, JOB, 5)
        asked = list(node.requests)
    assert not any("etc" in p or "pickle" in p for p in asked), asked
    assert sorted(got.files) == ["network.json", "ranks.json", "stacks.json"]
    assert sum("not a file an incident holds" in e for e in got.errors) == 3
    assert sum("over 4096 bytes" in e for e in got.errors) == 2  # the two dumps


def test_node_addresses() -> None:
    assert fetch.base_url("node-a") == "http://node-a:9476"
    assert fetch.base_url("node-a", "https", 9100) == "https://node-a:9100"
    assert fetch.base_url("10.0.0.1:9000") == "http://10.0.0.1:9000"
    assert fetch.base_url("[fd00::1]") == "http://[fd00::1]:9476"
    assert fetch.base_url("http://node-a/") == "http://node-a"  # a URL is taken as written
    for bad in ("ftp://x", "user@node-a:1", "node-a:1/?q", "http://", "node-a:x"):
        with pytest.raises(fetch.BadURL):
            fetch.base_url(bad)


def test_a_listed_id_that_is_not_one_is_refused_before_any_file_is_asked(
        tmp_path: Path) -> None:
    root = tmp_path / "node"
    root.mkdir()
    doc, files = node_b()
    path = write_incident(root, doc, files)
    listed = json.loads((path / layout.SUMMARY).read_text())
    (path / layout.SUMMARY).write_text(json.dumps({**listed, "id": "../../admin"}))
    with NodeServer(root) as node:
        with pytest.raises(fetch.FetchError, match="an incident id that is not one"):
            fetch.fetch_node(requests.Session(), node.url, JOB, 5)
        assert node.requests == [f"/api/v1/incidents?job_id={JOB}"]
