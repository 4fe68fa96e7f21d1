"""deploy/compose, the laptop demo (no Docker engine here): every mount exists and lands where
its consumer looks, images are pinned, the exporter service is locked down, Prometheus's config
passes promtool with the shipped rules, and the demo node's config really serves 8 GPUs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from tests.deploy.deploy_helpers import ROOT, require, wait_for_port
from tests.helpers import free_port, stop_process

COMPOSE = ROOT / "deploy" / "compose"


def services() -> dict:
    return yaml.safe_load((COMPOSE / "compose.yaml").read_text())["services"]


def mounts(service: str) -> dict[str, Path]:
    """container path -> host path (resolved from the compose folder)."""
    out = {}
    for volume in services()[service].get("volumes", []):
        host, container, *_ = volume.split(":")
        out[container] = (COMPOSE / host).resolve()
    return out


def test_every_bind_mount_exists_and_images_are_pinned():
    for name, service in services().items():
        for host in mounts(name).values():
            assert host.exists(), f"{name}: {host} missing"
        if "image" in service and "build" not in service:
            assert re.search(r":v?\d+\.\d+\.\d+$", service["image"]), service["image"]
    assert (COMPOSE / services()["llmmon"]["build"]["context"] / "Dockerfile").exists()


def test_exporter_service_is_locked_down():
    llmmon = services()["llmmon"]
    uid, gid = llmmon["user"].split(":")
    assert int(uid) > 0 and int(gid) > 0
    assert llmmon["read_only"] is True
    assert llmmon["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in llmmon["security_opt"]
    assert all(v.endswith(":ro") for v in llmmon["volumes"])


def test_prometheus_config_passes_promtool_with_the_shipped_rules(tmp_path):
    rules_at = next(c for c, h in mounts("prometheus").items() if h.name == "rules")
    config_at = next(c for c, h in mounts("prometheus").items() if h.name == "prometheus.yml")
    assert Path(rules_at).parent == Path(config_at).parent  # rules/ sits beside the config
    (tmp_path / "prometheus.yml").write_text((COMPOSE / "prometheus.yml").read_text())
    os.symlink(ROOT / "alerts" / "rules", tmp_path / "rules")
    out = subprocess.run([require("promtool"), "check", "config", "prometheus.yml"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    config = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "llmmon"
    assert job["static_configs"][0]["targets"] == ["llmmon:9476"]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] \
        == ["alertmanager:9093"]


def test_grafana_and_alertmanager_find_their_files():
    grafana = mounts("grafana")
    provider_dir = next(c for c, h in grafana.items() if h.name == "dashboards"
                        and h.parent.name == "provisioning")
    (provider,) = yaml.safe_load((grafana[provider_dir] / "llmmon.yaml").read_text())[
        "providers"]
    assert grafana[provider["options"]["path"]] == ROOT / "dashboards"
    datasources_dir = next(c for c, h in grafana.items() if h.name == "datasources")
    (source,) = yaml.safe_load((grafana[datasources_dir] / "prometheus.yaml").read_text())[
        "datasources"]
    assert source["url"] == "http://prometheus:9090" and "prometheus" in services()
    alertmanager = mounts("alertmanager")
    config_at = services()["alertmanager"]["command"][0].split("=", 1)[1]
    config = yaml.safe_load(alertmanager[config_at].read_text())
    for template in config.get("templates", []):
        assert str(Path(config_at).parent / template) in alertmanager


def test_demo_node_serves_eight_replayed_gpus(tmp_path):
    """The demo's llmmon.yml through a real exporter, its /fixtures mount pointed at the repo."""
    fixtures = next(h for c, h in mounts("llmmon").items() if c == "/fixtures/nvml")
    config = (COMPOSE / "llmmon.yml").read_text().replace("/fixtures/nvml", str(fixtures))
    (tmp_path / "llmmon.yml").write_text(config)
    port, log = free_port(), tmp_path / "serve.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "llmmon", "serve", f"--config.file={tmp_path / 'llmmon.yml'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, process, log)
        deadline, gpus = time.monotonic() + 30, set()
        while time.monotonic() < deadline and len(gpus) < 8:
            body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            gpus = set(re.findall(r'^llmmon_gpu_info\{[^}]*gpu="(\d+)"', body, re.M))
            time.sleep(0.2)
        assert len(gpus) == 8, log.read_text()
    finally:
        stop_process(process)
