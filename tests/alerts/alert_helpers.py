"""Helpers for the alert tests: the promtool cases as data, and a live Alertmanager on 127.0.0.1."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import requests
import yaml

from alerts import render

ALERTMANAGER_CONFIG = render.ALERTS_DIR / "alertmanager.yaml"
PROMTOOL_TESTS = sorted((Path(__file__).parent / "promtool").glob("*.yaml"))


def promtool_cases() -> list[tuple[dict, dict]]:
    """(alert_rule_test, expected alert or {} for a must-not-fire case) over every suite."""
    cases = []
    for suite in PROMTOOL_TESTS:
        for test in yaml.safe_load(suite.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.extend((case, alert) for alert in case.get("exp_alerts") or [{}])
    return cases


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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            match = re.search(r'msg="Listening on" address=(\S+)', self.log_path.read_text())
            if match:
                self.url = f"http://{match.group(1)}/api/v2"
                return
            time.sleep(0.05)
        raise AssertionError(f"alertmanager did not start:\n{self.log_path.read_text()}")

    def post(self, alerts: list[dict]) -> None:
        response = requests.post(f"{self.url}/alerts", json=alerts, timeout=5)
        assert response.status_code == 200, response.text

    def alerts(self) -> list[dict]:
        return requests.get(f"{self.url}/alerts", timeout=5).json()

    def groups(self) -> list[dict]:
        return requests.get(f"{self.url}/alerts/groups", timeout=5).json()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()
