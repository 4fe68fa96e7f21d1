"""Flags, the YAML file, their precedence and the errors a typo gets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmmon.cli import build_parser
from llmmon.collectors import discover
from llmmon.config import GLOBAL_OPTIONS, ConfigError, build_settings, collector_flag, \
    collector_options, global_flag


def settings_for(*argv: str):
    args = build_parser().parse_args(["serve", *argv])
    return build_settings(args, discover())


def test_defaults() -> None:
    settings = settings_for()
    assert settings["web.listen_address"] == ":9476"
    assert settings["path.procfs"] == "/proc"
    assert settings.collectors["disk"] == {
        "enabled": True, "interval": 5.0, "timeout": 3.0,
        "device_exclude": r"^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$",
        "extended": False}


def test_yaml_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "llmmon.yaml"
    config.write_text("web:\n  listen_address: 127.0.0.1:9999\npath:\n  procfs: /host/proc\n"
                      "collectors:\n  disk:\n    interval: 10s\n    device_exclude: '^loop'\n")
    settings = settings_for(f"--config.file={config}", "--collector.disk.interval=250ms",
                            "--path.procfs=/other")
    assert settings["web.listen_address"] == "127.0.0.1:9999"
    assert settings["path.procfs"] == "/other"
    assert settings.collectors["disk"]["interval"] == 0.25
    assert settings.collectors["disk"]["device_exclude"] == "^loop"


def test_enable_and_disable_flags(tmp_path: Path) -> None:
    assert settings_for("--no-collector.disk").collectors["disk"]["enabled"] is False
    disabled = settings_for("--collector.disable-defaults")
    assert not any(c["enabled"] for c in disabled.collectors.values())
    assert settings_for("--collector.disable-defaults", "--collector.disk") \
        .collectors["disk"]["enabled"] is True
    config = tmp_path / "c.yaml"
    config.write_text("collectors:\n  disk:\n    enabled: false\n")
    assert settings_for(f"--config.file={config}", "--collector.disk") \
        .collectors["disk"]["enabled"] is True


@pytest.mark.parametrize("content, message", [
    ("webb:\n  x: 1\n", "unknown section 'webb'"),
    ("web:\n  listen: 1\n", "unknown key(s) in web: listen"),
    ("collectors:\n  diks: {}\n", "unknown collector 'diks'"),
    ("collectors:\n  disk:\n    intervall: 5s\n", "unknown key(s) for collector disk: intervall"),
    ("collectors:\n  disk:\n    interval: soon\n", "collectors.disk.interval: not a duration"),
    ("collectors:\n  disk:\n    device_exclude: '('\n", "invalid regular expression"),
    ("- a\n- b\n", "expected a mapping at the top level"),
    ("web: [\n", "invalid YAML"),
])
def test_config_file_errors(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    with pytest.raises(ConfigError) as error:
        settings_for(f"--config.file={config}")
    assert message in str(error.value)


def test_bad_flag_exits_2_with_a_clear_message() -> None:
    result = subprocess.run([sys.executable, "-m", "llmmon", "serve",
                             "--collector.disk.timeout=0s"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2
    assert "--collector.disk.timeout: duration must be positive" in result.stderr
    result = subprocess.run([sys.executable, "-m", "llmmon", "serve",
                             "--web.listen-address=nowhere"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2 and "listen address 'nowhere'" in result.stderr


def test_help_documents_every_flag() -> None:
    result = subprocess.run([sys.executable, "-m", "llmmon", "serve", "--help"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    flags = [global_flag(o) for o in GLOBAL_OPTIONS] + ["--config.file",
                                                         "--collector.disable-defaults"]
    for cls in discover():
        flags += [collector_flag(cls, o) for o in collector_options(cls)]
        flags.append(f"--no-collector.{cls.name}")
    missing = [flag for flag in flags if flag not in result.stdout]
    assert not missing
