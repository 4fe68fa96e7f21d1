"""The committed dashboards are exactly what the generator builds, and Grafana can load them."""

from __future__ import annotations

from pathlib import Path

import yaml

from dashboards.generator import OUTPUT, generate

ROOT = Path(__file__).resolve().parents[2]
PROVISIONING = ROOT / "dashboards" / "provisioning"


def test_committed_json_matches_the_generator() -> None:
    generated = generate()
    stale = [path.name for path, text in generated.items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    assert not stale, f"regenerate with `python -m dashboards.generator`: {stale}"
    extra = set(OUTPUT.glob("*.json")) - set(generated)
    assert not extra, f"dashboards not produced by the generator: {sorted(extra)}"


def test_generator_check_mode_reports_drift(tmp_path, monkeypatch) -> None:
    """`--check` must fail on a stale file; prove it on a copy, never on the tree."""
    from dashboards import generator
    from dashboards.generator import __main__ as cli

    for path, text in generate().items():
        (tmp_path / path.name).write_text(text, encoding="utf-8")
    monkeypatch.setattr(generator, "OUTPUT", tmp_path)
    monkeypatch.setattr("sys.argv", ["generator", "--check"])
    assert cli.main() == 0
    victim = tmp_path / "llmmon-node.json"
    victim.write_text(victim.read_text().replace('"Disk"', '"Disks"'), encoding="utf-8")
    assert cli.main() == 1
    assert victim.read_text(encoding="utf-8").count('"Disks"') == 1, "--check wrote a file"


def test_dashboard_provider() -> None:
    data = yaml.safe_load((PROVISIONING / "dashboards" / "llmmon.yaml").read_text())
    assert data["apiVersion"] == 1
    (provider,) = data["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    assert provider["allowUiUpdates"] is False, "dashboards are code: UI edits would be lost"


def test_datasource() -> None:
    data = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    assert data["apiVersion"] == 1
    (source,) = data["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy"
    assert source["url"].startswith("http") and source["jsonData"]["timeInterval"]
