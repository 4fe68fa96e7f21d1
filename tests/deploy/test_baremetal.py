"""Bare-metal and Slurm nodes: the hardened systemd unit (systemd-analyze verify and its
offline security review), the user and spool made by the real systemd-sysusers and
systemd-tmpfiles, the config through the exporter's parser, and the Slurm job id hand-off."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from deploy_helpers import ROOT, require
from exporter.cli import build_parser
from exporter.collectors import discover
from exporter.config import build_settings

SYSTEMD = ROOT / "deploy" / "systemd"
SLURM = ROOT / "deploy" / "slurm"
INSTALLED = "/opt/llmmon/bin/llmmon"


def unit(extra: str = "") -> str:
    return (SYSTEMD / "llmmon.service").read_text() + extra


def service_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif line and not line.startswith("#") and section == "[Service]":
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def verify(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    """systemd-analyze verify checks that ExecStart exists: point it (only it) at the llmmon
    this checkout installed instead of the /opt/llmmon one the unit names."""
    assert INSTALLED in text
    path = tmp_path / "llmmon.service"
    path.write_text(text.replace(INSTALLED, require("llmmon")))
    return subprocess.run([require("systemd-analyze"), "verify", str(path)],
                          capture_output=True, text=True, timeout=120)


def test_unit_verifies_cleanly(tmp_path):
    out = verify(tmp_path, unit())
    assert out.returncode == 0 and out.stderr == "" and out.stdout == "", out.stderr


def test_nfs_drop_in_verifies_and_adds_exactly_one_named_capability(tmp_path):
    drop_in = (SYSTEMD / "nfs-stats.conf").read_text()
    out = verify(tmp_path, unit(drop_in))  # a repeated [Service] section, as a drop-in reads
    assert out.returncode == 0 and out.stderr == "", out.stderr
    added = service_settings(drop_in)
    assert added == {"CapabilityBoundingSet": ["CAP_DAC_READ_SEARCH"],
                     "AmbientCapabilities": ["CAP_DAC_READ_SEARCH"]}


def test_hardening_settings():
    s = service_settings(unit())
    assert s["User"] == ["llmmon"] and s["Group"] == ["llmmon"]
    assert s["CapabilityBoundingSet"] == [""] and s["AmbientCapabilities"] == [""]
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "ProtectKernelTunables",
                "ProtectKernelModules", "ProtectControlGroups", "RestrictSUIDSGID",
                "RestrictNamespaces", "LockPersonality"):
        assert s[key] == ["yes"], key
    assert s["ProtectSystem"] == ["strict"]
    assert s["ReadOnlyPaths"] == ["/run/llmmon"]
    assert s["ExecStart"] == [f"{INSTALLED} serve --config.file=/etc/llmmon/llmmon.yml"]


def test_offline_security_review_rates_it_ok(tmp_path):
    path = tmp_path / "llmmon.service"
    path.write_text(unit())
    out = subprocess.run([require("systemd-analyze"), "security", "--offline=true", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    score = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", out.stdout).group(1))
    assert score <= 2.5, out.stdout  # systemd's scale: 0 safest, 10 unsafe; "OK" below 3


def test_sysusers_and_tmpfiles_create_user_and_spool(tmp_path):
    root = tmp_path / "root"
    for tool, folder, name in (("systemd-sysusers", "sysusers.d", "llmmon.sysusers.conf"),
                               ("systemd-tmpfiles", "tmpfiles.d", "llmmon.tmpfiles.conf")):
        (root / "etc" / folder).mkdir(parents=True)
        shutil.copy(SYSTEMD / name, root / "etc" / folder / "llmmon.conf")
        args = ["--create"] if tool == "systemd-tmpfiles" else []
        out = subprocess.run([require(tool), *args, f"--root={root}"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
    user = [line for line in (root / "etc" / "passwd").read_text().splitlines()
            if line.startswith("llmmon:")]
    assert len(user) == 1 and user[0].endswith(":/usr/sbin/nologin")
    spool = os.stat(root / "run" / "llmmon" / "ranks")
    assert stat.S_IMODE(spool.st_mode) == 0o1777 and spool.st_uid == 0


def test_config_is_accepted_by_the_exporter():
    args = build_parser().parse_args(["serve", f"--config.file={SYSTEMD / 'llmmon.yml'}"])
    settings = build_settings(args, discover())
    assert settings["web.listen_address"] == ":9476"
    assert "config_file: /etc/llmmon/web-config.yml" in (SYSTEMD / "llmmon.yml").read_text()


@pytest.mark.parametrize("script", ["task-prolog.sh", "train.sbatch"])
def test_slurm_scripts_parse(script):
    out = subprocess.run(["bash", "-n", str(SLURM / script)], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr


def test_task_prolog_hands_the_slurm_job_id_to_the_reporter():
    prolog = str(SLURM / "task-prolog.sh")
    out = subprocess.run(["sh", prolog], env={"SLURM_JOB_ID": "4242", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    exports = dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.split("\n")
                   if line)
    assert exports == {"LLMMON_JOB": "4242", "LLMMON_SPOOL": "/run/llmmon/ranks"}
    assert "/run/llmmon/ranks" in (SYSTEMD / "llmmon.tmpfiles.conf").read_text()
    outside = subprocess.run(["sh", prolog], env={"PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=30)
    assert outside.returncode == 0 and outside.stdout == ""  # not in a Slurm job: no-op
