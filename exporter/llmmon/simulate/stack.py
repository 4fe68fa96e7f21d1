"""A local Prometheus and Alertmanager wired to the shipped rules and routing.

Used by `llmmon demo` and by the end-to-end tests, so the demo a user runs is the stack the
tests prove.  What is changed from the shipped files, and nothing else:
- rules: optionally every `for:` shortened through `python -m alerts.render --for-override`
  (the alerts' own tested transform; the expressions stay the shipped ones);
- routing: the route tree and inhibit rules are the shipped ones with only `group_wait` and
  `group_interval` shortened; each receiver keeps its name but delivers to a local webhook
  (`<url>/<receiver>`) instead of PagerDuty or Slack, whose secrets a laptop does not have.
Both run from this checkout's alerts/ (and dashboards/ for Grafana), on 127.0.0.1.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from llmmon.simulate.exporters import free_port, stop_process

CHECKOUT = Path(__file__).resolve().parents[3]
ALERTS = CHECKOUT / "alerts"
DASHBOARDS = CHECKOUT / "dashboards"
START_TIMEOUT = 30.0


class StackError(RuntimeError):
    """A binary or a file of the checkout is missing, or a server did not start."""


def find_binary(*names: str) -> str | None:
    """The first of `names` on PATH (Debian calls Alertmanager prometheus-alertmanager)."""
    return next((path for path in map(shutil.which, names) if path), None)


def rules_dir(work: Path, for_override: str | None,
              thresholds: Mapping[str, object] | None = None) -> Path:
    """The shipped rule files, or a render of them with every `for:` replaced and
    `thresholds` (alerts/config.yaml names) set."""
    shipped = ALERTS / "rules"
    if not shipped.is_dir():
        raise StackError(f"{shipped} not found: run from an llmmon checkout")
    if for_override is None and not thresholds:
        return shipped
    out = work / "rules"
    args = ["--for-override", for_override] if for_override is not None else []
    for name, value in (thresholds or {}).items():
        args += ["--set", f"{name}={value}"]
    result = subprocess.run([sys.executable, "-m", "alerts.render", "--out", str(out), *args],
                            cwd=CHECKOUT, capture_output=True, text=True, timeout=60,
                            check=False)
    if result.returncode != 0:
        raise StackError(f"alerts.render {' '.join(args)}: {result.stderr.strip()}")
    return out


def prometheus_config(targets_file: Path, rules: Path, alertmanager: str | None,
                      interval: str) -> dict[str, Any]:
    """Scrape the simulated nodes (job `llmmon`, as the rules expect) and load the rules."""
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval,
                   "evaluation_interval": interval},
        "rule_files": [str(rules / "*.yaml")],
        "scrape_configs": [{"job_name": "llmmon", "file_sd_configs": [
            {"files": [str(targets_file)], "refresh_interval": "5s"}]}],
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [
            {"targets": [alertmanager]}]}]}
    return config


def _retime(route: dict[str, Any], group_wait: str | None, group_interval: str | None) -> None:
    for key, value in (("group_wait", group_wait), ("group_interval", group_interval)):
        if key in route and value is not None:
            route[key] = value
    for child in route.get("routes", []):
        _retime(child, group_wait, group_interval)


def alertmanager_config(webhook: str, group_wait: str | None = None,
                        group_interval: str | None = None) -> dict[str, Any]:
    """The shipped routing, each receiver delivering to `<webhook>/<receiver name>`; a
    `group_wait` or `group_interval` given replaces the shipped one on every route."""
    path = ALERTS / "alertmanager.yaml"
    if not path.is_file():
        raise StackError(f"{path} not found: run from an llmmon checkout")
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    route = copy.deepcopy(config["route"])
    _retime(route, group_wait, group_interval)
    config["route"] = route
    config["templates"] = [str(ALERTS / name) for name in config.get("templates", [])]
    config["receivers"] = [{"name": receiver["name"], "webhook_configs": [
        {"url": f"{webhook}/{receiver['name']}", "send_resolved": True}]}
        for receiver in config["receivers"]]
    return config


@dataclass
class Notification:
    receiver: str
    payload: dict[str, Any]  # Alertmanager's webhook body: status, groupLabels, alerts, ...


@dataclass
class WebhookReceiver:
    """An HTTP server on 127.0.0.1 that keeps every notification Alertmanager sends it."""

    on_notify: Callable[[Notification], None] | None = None
    notifications: list[Notification] = field(default_factory=list)

    def __post_init__(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                note = Notification(self.path.strip("/"), json.loads(body or b"{}"))
                with receiver._lock:
                    receiver.notifications.append(note)
                if receiver.on_notify:
                    receiver.on_notify(note)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="webhook")
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def snapshot(self) -> list[Notification]:
        with self._lock:
            return list(self.notifications)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class ServiceProcess:
    """A Prometheus or Alertmanager process, stopped by PID."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        stop_process(self.process)


def _launch(name: str, binary: str, work: Path, config: dict[str, Any],
            flags: list[str]) -> ServiceProcess:
    """Write `config`, start `binary` on a free 127.0.0.1 port and wait until it is ready."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"{name}.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    port = free_port()
    log = work / f"{name}.log"
    with open(log, "ab") as handle:
        process = subprocess.Popen(
            [binary, f"--config.file={path}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn", *flags], stdout=handle, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    server = ServiceProcess(name, f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StackError(f"{name} exited with {process.returncode}: "
                             f"{log.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(server.url + "/-/ready", timeout=1):
                return server
        except OSError:
            time.sleep(0.2)
    server.stop()
    raise StackError(f"{name} not ready after {START_TIMEOUT:.0f}s; see {log}")


def start_prometheus(binary: str, work: Path, config: dict[str, Any]) -> ServiceProcess:
    return _launch("prometheus", binary, work, config,
                   [f"--storage.tsdb.path={work / 'data'}"])


def start_alertmanager(binary: str, work: Path, config: dict[str, Any]) -> ServiceProcess:
    """HA gossip off (`--cluster.listen-address=`): one instance, no peers to wait for."""
    return _launch("alertmanager", binary, work, config,
                   [f"--storage.path={work / 'data'}", "--cluster.listen-address="])
