"""The renderer: committed output is current, overrides work, bad sources are refused clearly."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from alerts import render

PROMTOOL_TESTS = Path(__file__).parent / "promtool"


def test_committed_rules_and_doc_match_a_fresh_render(rendered: render.Rendered) -> None:
    assert render.stale(render.render_files(rendered)) == [], "run python -m alerts.render"
    assert render.main(["--check"]) == 0


def test_a_changed_rule_file_is_stale(rendered: render.Rendered, tmp_path: Path) -> None:
    shutil.copytree(render.RULES_DIR, tmp_path, dirs_exist_ok=True)
    (tmp_path / "alerts.yaml").write_text("groups: []\n")
    assert render.stale(render.render_files(rendered, tmp_path, None)) == [tmp_path / "alerts.yaml"]


def _rules(rendered: render.Rendered) -> list[dict]:
    return [rule for group in rendered.files["alerts.yaml"]["groups"] for rule in group["rules"]]


def _alerts(rendered: render.Rendered) -> list[dict]:
    return [rule for rule in _rules(rendered) if "alert" in rule]


def _without_intervals(files: dict) -> dict:
    return {name: {"groups": [{k: v for k, v in group.items() if k != "interval"}
                              for group in content["groups"]]} for name, content in files.items()}


def test_for_override_replaces_every_for_and_drops_group_intervals(
        rendered: render.Rendered) -> None:
    fast = render.render(render.load_thresholds(), for_override="5s")
    assert any("interval" in g for g in rendered.files["recording.yaml"]["groups"])
    assert not [g for f in fast.files.values() for g in f["groups"] if "interval" in g]
    assert fast.files["recording.yaml"] == _without_intervals(rendered.files)["recording.yaml"]
    pairs = list(zip(_alerts(rendered), _alerts(fast), strict=True))
    assert sum("for" in slow for slow, _ in pairs) >= 20
    for slow, quick in pairs:
        assert {k: v for k, v in quick.items() if k != "for"} == {k: v for k, v in slow.items() if k != "for"}
        assert quick.get("for") == ("5s" if "for" in slow else None)


def test_for_override_rules_page_a_hang_within_seconds(tmp_path: Path) -> None:
    """The gloo hang case, evaluated every 5 s: 1m for: pages at 9m05s, 5s for: at 8m10s."""
    assert render.main(["--out", str(tmp_path), "--for-override", "5s"]) == 0
    assert subprocess.run(["promtool", "check", "rules", *map(str, tmp_path.glob("*.yaml"))],
                          capture_output=True).returncode == 0
    suite = yaml.safe_load((PROMTOOL_TESTS / "training.yaml").read_text())
    hang = suite["tests"][0]
    fired = hang["alert_rule_test"][-1]["exp_alerts"]
    description = fired[0]["exp_annotations"]["description"]
    fired[0]["exp_annotations"]["description"] = description.replace("nothing for 5m 0s", "nothing for 3m 10s")
    hang["alert_rule_test"] = [
        {"eval_time": "8m5s", "alertname": "LLMTrainingHang"},
        {"eval_time": "8m10s", "alertname": "LLMTrainingHang", "exp_alerts": fired},
    ]
    for rule_files, fires in (([tmp_path / "recording.yaml", tmp_path / "alerts.yaml"], True),
                              ([render.RULES_DIR / "recording.yaml", render.RULES_DIR / "alerts.yaml"], False)):
        case = tmp_path / "case.yaml"
        case.write_text(yaml.safe_dump({**suite, "rule_files": [str(p) for p in rule_files],
                                        "evaluation_interval": "5s", "tests": [hang]}))
        result = subprocess.run(["promtool", "test", "rules", str(case)], capture_output=True, text=True)
        assert (result.returncode == 0) is fires, result.stdout + result.stderr


def test_set_overrides_a_threshold() -> None:
    rules = _rules(render.render(render.load_thresholds(overrides={"hang_window_seconds": 20})))
    hang = [rule["expr"] for rule in rules if rule.get("alert") == "LLMTrainingHang"]
    gate = [rule["expr"] for rule in rules
            if rule.get("record") == "job_id_pg:llmmon_nccl_stalled_seconds:over_threshold"]
    assert len(hang) == 7 and len(gate) == 1 and not any("180" in expr for expr in hang + gate)
    # the gate of every rule but no_rank_enqueues' (a working rank holds that one off for good)
    assert "> 20)" in gate[0]
    assert sum("stalled_seconds:over_threshold" in expr for expr in hang) == 4
    # a busy rank behind pages once its group has progressed nothing for the window
    assert sum("< 20)" in expr for expr in hang) == 1


def test_a_group_interval_is_listed_for_every_rule_of_its_group(rendered: render.Rendered) -> None:
    """docs/alerts.md says which rules a threshold governs: a group's interval governs them all,
    not only the rule rendered last before the header."""
    governed: dict[str, set[str]] = {}
    for source in render.SOURCE_DIR.glob("*.yaml"):
        for group in yaml.safe_load(source.read_text())["groups"]:
            if str(group.get("interval", "")).startswith("${"):
                names = {rule.get("alert") or rule["record"] for rule in group["rules"]}
                governed.setdefault(group["interval"][2:-1], set()).update(names)
    assert set(governed) == {"nccl_recording_interval", "trend_rules_interval"}
    for threshold, names in governed.items():
        listed = {info.name for info in rendered.rules if threshold in info.uses}
        assert listed == names, threshold


@pytest.mark.parametrize("argv, message", [
    (["--for-override", "5s"], "--out"),
    (["--out", "x", "--for-override", "five"], "not a Prometheus duration"),
    (["--out", "x", "--set", "no_such_threshold=1"], "no such threshold"),
    (["--out", "x", "--set", "mfu_low"], "expected name=value"),
    (["--check", "--out", "x"], "takes no --out"),
])
def test_bad_arguments_are_refused(argv: list[str], message: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert render.main(argv) == 2
    assert message in capsys.readouterr().err


def _sources(tmp_path: Path, alerts_text: str) -> Path:
    for other in ("recording.yaml", "health.yaml"):
        shutil.copy(render.SOURCE_DIR / other, tmp_path / other)
    (tmp_path / "alerts.yaml").write_text(alerts_text)
    return tmp_path


def test_unknown_placeholder_is_named(tmp_path: Path) -> None:
    text = (render.SOURCE_DIR / "alerts.yaml").read_text().replace("${mfu_low}", "${mfu_lowest}", 1)
    with pytest.raises(render.RenderError, match=r"alerts.yaml: unknown placeholder \$\{mfu_lowest\}"):
        render.render(render.load_thresholds(), source_dir=_sources(tmp_path, text))


def test_unused_threshold_is_named(tmp_path: Path) -> None:
    text = (render.SOURCE_DIR / "alerts.yaml").read_text().replace("${disk_min_reads_per_second}", "10")
    with pytest.raises(render.RenderError, match="used by no rule: \\['disk_min_reads_per_second'\\]"):
        render.render(render.load_thresholds(), source_dir=_sources(tmp_path, text))


def test_threshold_without_reason_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("mfu_low:\n  value: 0.3\n")
    with pytest.raises(render.RenderError, match="mfu_low needs exactly `value` and `why`"):
        render.load_thresholds(config)
