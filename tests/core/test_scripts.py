"""scripts/install.sh and .ci/run, run for real with PYTHON pointing at a recording stand-in
for the interpreter: pip installs and the pytest run are logged (and pytest writes a junit
report of the requested outcome); anything else runs the real python3."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

STAND_IN = """#!/bin/sh
case "$1 $2" in
  "-m pip") echo "$*" >> "$LOG"; exit 0 ;;
  "-m pytest")
    echo "$*" >> "$LOG"
    for arg in "$@"; do
      case "$arg" in --junitxml=*) report=${arg#--junitxml=} ;; esac
    done
    echo "$report" > "$REPORT_AT"
    [ "$RC" = 5 ] || printf '%s' '<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1"/></testsuites>' > "$report"
    exit "$RC" ;;
esac
exec python3 "$@"
"""
# What install.sh --test would otherwise apt-get install; present, the script installs nothing.
DEBIAN_BINARIES = ("promtool", "prometheus-alertmanager", "openssl", "systemd-analyze", "ip",
                   "sysctl", "chromium")


@pytest.fixture
def python(tmp_path: Path) -> dict[str, str]:
    missing = [b for b in DEBIAN_BINARIES if not shutil.which(b)]
    assert not missing, f"not installed: {missing} (scripts/install.sh --test installs them)"
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_")}
    return {**env, "PYTHON": str(stand_in), "LOG": str(tmp_path / "log"),
            "REPORT_AT": str(tmp_path / "report-at"), "RC": "0"}


def _run(command: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, list[str]]:
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    log = Path(env["LOG"])
    return result, log.read_text().splitlines() if log.exists() else []


def test_install_takes_torch_from_the_given_spec_and_index(python: dict[str, str]) -> None:
    env = {**python, "TORCH_SPEC": "torch==2.13.0+cpu",
           "TORCH_INDEX_URL": "https://download.pytorch.org/whl/cpu"}
    result, pips = _run(["bash", "scripts/install.sh", "--test"], env)
    assert result.returncode == 0, result.stderr
    assert pips[0].endswith("--index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu")
    assert pips[1].endswith("-e .[test]") and len(pips) == 2


def test_install_pins_torch_by_default_and_skips_it_when_told(python: dict[str, str]) -> None:
    result, pips = _run(["bash", "scripts/install.sh", "--test"], python)
    assert result.returncode == 0, result.stderr
    assert pips[0].endswith("--no-input torch==2.13.0")
    Path(python["LOG"]).unlink()
    result, pips = _run(["bash", "scripts/install.sh", "--test"], {**python, "TORCH_SPEC": ""})
    assert result.returncode == 0 and len(pips) == 1 and pips[0].endswith("-e .[test]")


def test_install_help_is_honest_about_torch() -> None:
    result = subprocess.run(["bash", "scripts/install.sh", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    for needle in ("CUDA build", "TORCH_SPEC", "TORCH_INDEX_URL", "iproute2", "procps", "root"):
        assert needle in result.stdout, needle
    assert "set -euo" not in result.stdout


def test_ci_summarises_the_report_and_removes_it(python: dict[str, str]) -> None:
    result, calls = _run([".ci/run"], {**python, "RC": "1"})
    assert result.returncode == 1
    assert result.stdout.strip().endswith("2 passed, 1 failed, 1 skipped")
    assert calls[-1].startswith("-m pytest -q -p no:cacheprovider --junitxml=")
    report = Path(Path(python["REPORT_AT"]).read_text().strip())
    assert not report.exists() and not report.parent.exists()


def test_ci_calls_no_tests_a_failure(python: dict[str, str]) -> None:
    result, _ = _run([".ci/run"], {**python, "RC": "5"})
    assert result.returncode == 5
    assert "no test report was written (pytest exit code 5)" in result.stdout
    assert "collected no tests: that is a failure" in result.stderr
