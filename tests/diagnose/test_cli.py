"""`llmmon diagnose` as a user runs it: a real `llmmon serve` over fixture copies, the CLI in
its own process, text and JSON, branch selection, exit status, and unreadable evidence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import requests

from llmmon.diagnose.schema import ADAPTER
from tests.conftest import ROOT
from tests.diagnose.node import Node, check, touch_tree
from tests.helpers import free_port


def diagnose(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmmon", "diagnose", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def _serve(serve, tmp_path: Path):
    fixtures = Node(tmp_path / "node")
    touch_tree(fixtures.spool)
    return serve(*fixtures.args())


def test_json_report_from_a_running_exporter(serve, tmp_path: Path) -> None:
    server = _serve(serve, tmp_path)
    server.wait_collected()
    done = diagnose("--url", server.url, "--interval", "1", "--json")
    assert done.returncode == 1, done.stderr  # suspect
    report = json.loads(done.stdout)
    assert ADAPTER.validate_python(report).as_json() == report
    served = requests.get(f"{server.url}/api/v1/diagnose", timeout=10).status_code == 200
    assert report["source"]["kind"] == ("daemon" if served else "scrape")
    assert check(report, "hang.progress")["verdict"] == "suspect"
    assert check(report, "thermal.clock_events")["verdict"] == "suspect"


def test_text_report_of_selected_branches(serve, tmp_path: Path) -> None:
    server = _serve(serve, tmp_path)
    server.wait_collected()
    done = diagnose("--url", server.url, "--scrape", "--interval", "1", "--thermal",
                    "--precision")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith("SUSPECT: thermal.clock_events, thermal.power_peers")
    assert lines[1].startswith(f"source: scrape {server.url}/metrics (node, 2 observations")
    assert [line.split(" [")[0] for line in lines if line[:1].isdigit()] == \
        ["1. Precision", "5. Thermal throttling"]
    assert "runbook: https://github.com/llmmon/llmmon/blob/main/docs/runbooks.md" \
        "#gputhermalthrottle" in [line.strip() for line in lines]


def test_healthy_branch_exits_zero(serve, tmp_path: Path) -> None:
    server = _serve(serve, tmp_path)
    server.wait_collected()
    done = diagnose("--url", server.url, "--scrape", "--interval", "1", "--precision")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "llmmon diagnose" in done.stdout and ": ok" in done.stdout.splitlines()[0]


def test_unreadable_evidence_exits_two(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    for args, message in (
            (("--url", closed, "--interval", "0.1"), closed),
            (("--prometheus", closed), closed),
            (("--url", closed, "--alerts-config", str(tmp_path / "absent.yaml")),
             "absent.yaml: No such file")):
        done = diagnose(*args)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.startswith("llmmon diagnose: ") and message in done.stderr
