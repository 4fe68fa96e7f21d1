"""deploy/prometheus: promtool accepts the shipped configs (and the rules they load); the
scrape job for Kubernetes has the daemonset's shape. tests/slow/deploy/ runs the remote-write
path with real stores."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.deploy.deploy_helpers import ROOT, require

PROMETHEUS = ROOT / "deploy" / "prometheus"


@pytest.mark.parametrize("name", ["prometheus.yml", "agent.yml"])
def test_promtool_accepts_the_config_and_its_rules(name):
    out = subprocess.run([require("promtool"), "check", "config", name], cwd=PROMETHEUS,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    if name == "prometheus.yml":  # the shipped rule files, loaded through the relative glob
        shipped = sorted((ROOT / "alerts" / "rules").glob("*.yaml"))
        assert shipped and f"SUCCESS: {len(shipped)} rule files found" in out.stdout


def test_targets_file_is_valid_file_sd():
    for path in (PROMETHEUS / "targets").glob("*.yml"):
        for group in yaml.safe_load(path.read_text()):
            assert set(group) == {"targets", "labels"}
            assert all(t.endswith(":9476") for t in group["targets"])
            assert group["labels"]["node"]


def test_kubernetes_scrape_job_matches_the_daemonset():
    """Debian's promtool has no Kubernetes discovery: check the job's shape instead."""
    (job,) = yaml.safe_load((PROMETHEUS / "kubernetes-scrape.yml").read_text())[
        "scrape_configs"]
    assert job["job_name"] == "llmmon"
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] == "pod" and sd["namespaces"]["names"] == ["llmmon"]
    assert {"source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": "metrics", "action": "keep"} in job["relabel_configs"]
    assert {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"} \
        in job["relabel_configs"]
