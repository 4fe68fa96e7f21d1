"""Flags, the YAML file, their precedence and the errors a typo gets."""

from __future__ import annotations

import functools
import os
import re
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
                            timeout=180)
    assert result.returncode == 2
    assert "--collector.disk.timeout: duration must be positive" in result.stderr
    result = subprocess.run([sys.executable, "-m", "llmmon", "serve",
                             "--web.listen-address=nowhere"], capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 2 and "listen address 'nowhere'" in result.stderr


def test_help_documents_every_flag() -> None:
    result = subprocess.run([sys.executable, "-m", "llmmon", "serve", "--help"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0
    flags = [global_flag(o) for o in GLOBAL_OPTIONS] + ["--config.file",
                                                         "--collector.disable-defaults"]
    for cls in discover():
        flags += [collector_flag(cls, o) for o in collector_options(cls)]
        flags.append(f"--no-collector.{cls.name}")
    missing = [flag for flag in flags if flag not in result.stdout]
    assert not missing


@functools.cache
def _help(command: str) -> dict[str, tuple[str, str]]:
    """`llmmon COMMAND --help` as run by a user: each flag's metavar (empty for a switch) and
    its help text. A wide terminal keeps every help text on one line. Read once per command;
    callers do not change it."""
    result = subprocess.run([sys.executable, "-m", "llmmon", command, "--help"],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "COLUMNS": "1000"})
    assert result.returncode == 0, result.stderr
    entries: dict[str, tuple[str, str]] = {}
    flag = None
    for line in result.stdout.splitlines():
        match = re.match(r"  (--[\w.-]+)(?: ([A-Z_]+))?(?:  +(.*))?$", line)
        if match:
            flag = match.group(1)
            entries[flag] = (match.group(2) or "", match.group(3) or "")
        elif flag and line.startswith(" " * 20) and not entries[flag][1]:
            entries[flag] = (entries[flag][0], line.strip())
    return entries


# How --help spells each type's default: one spelling per type, the one the flag accepts.
DEFAULT_SHAPES = {"duration": r"\d+(ms|s|m|h)", "bool": r"on|off", "int": r"\d+",
                  "float": r"\d+(\.\d+)?", "list": r"[^ ,]+(,[^ ,]+)*"}


def test_help_names_each_value_and_spells_defaults_one_way() -> None:
    entries = _help("serve")
    options = [(global_flag(o), o) for o in GLOBAL_OPTIONS]
    options += [(collector_flag(cls, o), o) for cls in discover() for o in collector_options(cls)]
    for flag, option in options:
        metavar, text = entries[flag]
        if option.key == "enabled":
            assert metavar == "", flag
        else:
            assert metavar not in ("", "VALUE") and metavar == option.placeholder, flag
        default = re.search(r"\(default: ([^;]*?)(?:; (.+ to .+))?\)$", text)
        assert default, f"{flag}: no default in {text!r}"
        shape = DEFAULT_SHAPES.get("bool" if option.key == "enabled" else option.type)
        if shape:
            assert re.fullmatch(shape, default.group(1)), (flag, default.group(1))
        assert (default.group(2) or "") == option.range, (flag, text)
    assert "VALUE" not in str(entries)
    # The spellings people see, and type back into a flag.
    assert entries["--collector.disk.interval"] == (
        "DURATION", "How often the disk collector runs. (default: 5s; 100ms to 24h)")
    assert entries["--sampler.max-staleness"][1].endswith("(default: 1m; 1s to 24h)")
    assert entries["--collector.gpu.processes"][0] == "BOOL"
    assert entries["--collector.gpu.processes"][1].endswith("(default: on)")
    assert entries["--collector.nic.all-interfaces"][1].endswith("(default: off)")
    assert entries["--collector.gpu.power-sample-rate"][1].endswith("(default: 20; 1.0 to 200.0)")
    assert entries["--web.listen-address"][0] == "ADDRESS"
    assert entries["--fake-nvml"][1].endswith('(default: "")')


EMPTY = '""'


def test_help_defaults_are_accepted_back() -> None:
    """What --help prints as a default, given as the flag's value, gives the same settings."""
    entries = _help("serve")
    argv = []
    for flag, (metavar, text) in entries.items():
        default = re.search(r"\(default: ([^;]*?)(?:; (.+ to .+))?\)$", text)
        if metavar and default:
            value = default.group(1)
            argv.append(f"{flag}={'' if value == EMPTY else value}")
    assert len(argv) > 40
    assert settings_for(*argv) == settings_for()


def test_capture_takes_no_web_flags() -> None:
    entries = _help("capture")
    assert not [flag for flag in entries if flag.startswith("--web.")]
    assert {"--path.sysfs", "--fake-nvml", "--collector.gpu", "--spool.dir"} <= set(entries)
    result = subprocess.run([sys.executable, "-m", "llmmon", "capture",
                             "--web.listen-address=:9999"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "unrecognized arguments: --web.listen-address" \
        in result.stderr
