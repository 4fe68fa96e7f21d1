"""Packaging: the wheels built from this tree ship every package under the folder that is its
import name, and the reporter ships once, in its own distribution, which the daemon's requires."""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import llmmon
import llmmon_reporter
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, zipfile.ZipFile]:
    """Both wheels, built as the Dockerfile builds them: from the files it copies only."""
    work = tmp_path_factory.mktemp("wheels")
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for folder in ("exporter", "reporter"):
        shutil.copytree(ROOT / folder, src / folder, ignore=ignore)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(work / "dist"), str(src),
                    str(src / "reporter")], check=True, capture_output=True, timeout=300)
    found = {path.name.split("-")[0]: zipfile.ZipFile(path)
             for path in (work / "dist").glob("*.whl")}
    assert set(found) == {"llmmon", "llmmon_reporter"}, found
    return found


def _metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    return email.parser.Parser().parsestr(wheel.read(name).decode())


def _packages(root: Path) -> set[str]:
    return {".".join(init.parent.relative_to(root).parts)
            for init in root.rglob("__init__.py") if "__pycache__" not in init.parts}


def test_every_package_folder_ships_under_its_import_name(wheels) -> None:
    daemon = _packages(ROOT / "exporter")
    assert "llmmon.serve" in daemon and "llmmon.diagnose.branches" in daemon
    shipped = {name.rsplit("/", 1)[0].replace("/", ".")
               for name in wheels["llmmon"].namelist() if name.endswith("/__init__.py")}
    assert shipped == daemon
    assert "llmmon/simulate/data/h200_nvml.json" in wheels["llmmon"].namelist()


def test_the_reporter_ships_once_with_its_start_up_hook(wheels) -> None:
    assert not [n for n in wheels["llmmon"].namelist() if n.startswith("llmmon_reporter/")]
    names = wheels["llmmon_reporter"].namelist()
    assert "llmmon_reporter/boot/sitecustomize.py" in names
    assert {n.split("/")[0] for n in names if not n.startswith("llmmon_reporter-")} == \
        {"llmmon_reporter"}


def test_the_daemon_requires_the_reporter_of_its_own_version(wheels) -> None:
    daemon, reporter = _metadata(wheels["llmmon"]), _metadata(wheels["llmmon_reporter"])
    assert daemon["Version"] == reporter["Version"] == llmmon.__version__ == \
        llmmon_reporter.__version__
    assert f"llmmon-reporter=={reporter['Version']}" in daemon.get_all("Requires-Dist")
    assert reporter.get_all("Requires-Dist") is None  # the trainer's environment stays its own
    assert tomllib.loads((ROOT / "reporter/pyproject.toml").read_text())["project"][
        "dependencies"] == []
