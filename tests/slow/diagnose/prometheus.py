"""A Debian Prometheus 2.42 on 127.0.0.1 scraping given exporters with the shipped rules."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from tests.conftest import ROOT
from tests.helpers import free_port, stop_process

BINARY = shutil.which("prometheus") or "/usr/bin/prometheus"
CLUSTER = "test"


def config(targets: dict[str, str], rules: Path = ROOT / "alerts" / "rules") -> dict[str, Any]:
    """1 s scrapes and rule evaluations; `node` and `cluster` by relabelling, as deploy/ does.
    `rules`: the shipped rule files, or a render of them."""
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in sorted(rules.glob("*.yaml"))],
        "scrape_configs": [{
            "job_name": "llmmon",
            "static_configs": [{"targets": [address], "labels": {"__node_name": node}}
                               for node, address in targets.items()],
            "relabel_configs": [
                {"source_labels": ["__node_name"], "target_label": "node"},
                {"target_label": "cluster", "replacement": CLUSTER},
            ],
        }],
    }


class Prometheus:
    def __init__(self, workdir: Path, targets: dict[str, str],
                 rules: Path = ROOT / "alerts" / "rules") -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config(targets, rules)), encoding="utf-8")
        self.log_path = workdir / "prometheus.log"
        self.url = f"http://127.0.0.1:{free_port()}"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [BINARY, f"--config.file={path}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}",
                 "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = requests.get(f"{self.url}/api/v1/query", params={"query": expr},
                              timeout=10).json()
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def wait(self, expr: str, timeout: float = 60.0) -> None:
        """Until `expr` returns a series (Prometheus ready, scraped, rules evaluated)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log_path.read_text()
            with contextlib.suppress(requests.RequestException, AssertionError):
                if self.query(expr):
                    return
            time.sleep(0.5)
        raise AssertionError(f"no data for {expr} after {timeout}s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        stop_process(self.process)
