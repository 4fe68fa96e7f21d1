"""A live Alertmanager on 127.0.0.1 with the shipped routes and inhibitions."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import requests
import yaml

from tests.alerts.alert_helpers import ALERTMANAGER_CONFIG
from tests.helpers import stop_process, wait_for


class Alertmanager:
    """prometheus-alertmanager with our routes and inhibitions, receivers reduced to names."""

    def __init__(self, workdir: Path) -> None:
        config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
        config["receivers"] = [{"name": receiver["name"]} for receiver in config["receivers"]]
        config.pop("templates")
        config_path = workdir / "alertmanager.yaml"
        config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "alertmanager.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            ["prometheus-alertmanager", f"--config.file={config_path}",
             f"--storage.path={workdir / 'data'}", "--web.listen-address=127.0.0.1:0",
             "--cluster.listen-address="],
            stdout=self._log, stderr=subprocess.STDOUT)
        self.url = ""

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Port 0 lets the kernel pick a free port; the log says which one."""
        def listening() -> re.Match | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"alertmanager exited:\n{self.log_path.read_text()}")
            return re.search(r'msg="Listening on" address=(\S+)', self.log_path.read_text())
        address = wait_for(listening, timeout, "alertmanager to listen", interval=0.05,
                           context=self.log_path.read_text)
        self.url = f"http://{address.group(1)}/api/v2"

    def post(self, alerts: list[dict]) -> None:
        response = requests.post(f"{self.url}/alerts", json=alerts, timeout=5)
        assert response.status_code == 200, response.text

    def alerts(self) -> list[dict]:
        return requests.get(f"{self.url}/alerts", timeout=5).json()

    def groups(self) -> list[dict]:
        return requests.get(f"{self.url}/alerts/groups", timeout=5).json()

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    manager = Alertmanager(tmp_path)
    try:
        manager.wait_ready()
        yield manager
    finally:
        manager.stop()
