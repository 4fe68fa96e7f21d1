"""Bare-metal and Slurm nodes: the hardened systemd unit (systemd-analyze verify and its
offline security review), its file system view against the ranks collector's paths, the config
through the exporter's parser, and the Slurm job id hand-off. The shared directories
themselves: test_shared_dirs.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.deploy_helpers import ROOT, require
from llmmon.cli import build_parser
from llmmon.collectors import discover
from llmmon.config import build_settings

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


def test_zero_touch_drop_in_verifies_and_adds_exactly_one_named_capability(tmp_path):
    drop_in = (SYSTEMD / "zero-touch.conf").read_text()
    out = verify(tmp_path, unit(drop_in))
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert service_settings(drop_in) == {"CapabilityBoundingSet": ["CAP_SYS_PTRACE"],
                                         "AmbientCapabilities": ["CAP_SYS_PTRACE"]}


def test_kernel_log_drop_in_verifies_and_only_shows_the_kernel_log_to_one_capability(tmp_path):
    drop_in = (SYSTEMD / "kernel-log.conf").read_text()
    out = verify(tmp_path, unit(drop_in))
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert service_settings(drop_in) == {"ProtectKernelLogs": ["no"],
                                         "CapabilityBoundingSet": ["CAP_SYSLOG"],
                                         "AmbientCapabilities": ["CAP_SYSLOG"]}
    # the path it opens is the collector's default, so the drop-in needs no config change
    settings = build_settings(build_parser().parse_args(["serve"]), discover())
    assert settings.collectors["gpu"]["kmsg_path"] == "/dev/kmsg"


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
    # the places it writes: dumps (moved into sets) and incidents
    assert s["ReadWritePaths"] == ["/var/lib/llmmon/fr", "/var/lib/llmmon/incidents"]
    assert s["ExecStart"] == [f"{INSTALLED} serve --config.file=/etc/llmmon/llmmon.yml"]


def test_open_file_limit_leaves_room_for_the_default_connection_cap():
    from llmmon.config import GLOBAL_OPTIONS
    from llmmon.serve.httpserver import FD_RESERVE, connection_cap

    limit = int(service_settings(unit())["LimitNOFILE"][0])
    default = next(o.default for o in GLOBAL_OPTIONS if o.key == "web.max_connections")
    assert connection_cap(default, limit) == default and limit - default > FD_RESERVE


def test_offline_security_review_rates_it_ok(tmp_path):
    path = tmp_path / "llmmon.service"
    path.write_text(unit())
    out = subprocess.run([require("systemd-analyze"), "security", "--offline=true", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    score = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", out.stdout).group(1))
    assert score <= 2.5, out.stdout  # systemd's scale: 0 safest, 10 unsafe; "OK" below 3


def test_unit_lets_the_ranks_collector_read_the_spool_open_pipes_and_keep_dumps():
    """Its paths as the exporter resolves them from llmmon.yml: spool and dump pipes under the
    read-only /run/llmmon (FIFOs open for writing there), dumps in the one writable path, and
    the same directories `llmmon launch` points torch at and tmpfiles makes."""
    args = build_parser().parse_args(["serve", f"--config.file={SYSTEMD / 'llmmon.yml'}"])
    settings = build_settings(args, discover())
    ranks = settings.collectors["ranks"]
    s = service_settings(unit())
    (read_only,), (dumps, incidents) = s["ReadOnlyPaths"], s["ReadWritePaths"]
    assert Path(ranks["spool_dir"]).parent == Path(ranks["pipe_dir"]).parent == Path(read_only)
    assert ranks["fr_dir"] == dumps
    assert settings.collectors["incidents"]["dir"] == incidents
    env = launch_env()
    assert env["LLMMON_SPOOL"] == ranks["spool_dir"]
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == f"{ranks['pipe_dir']}/4242/rank_"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == f"{ranks['fr_dir']}/4242/rank_"
    made = {line.split()[1] for line in (SYSTEMD / "llmmon.tmpfiles.conf").read_text()
            .splitlines() if line.startswith("d ")}
    assert {ranks["spool_dir"], ranks["pipe_dir"], ranks["fr_dir"], incidents} <= made


def launch_env() -> dict[str, str]:
    """The environment `llmmon launch` gives torch in Slurm job 4242: the prolog's exports and
    what the launcher adds (--print-env prints only the variables it adds)."""
    prolog = subprocess.run(["sh", str(SLURM / "task-prolog.sh")],
                            env={"SLURM_JOB_ID": "4242", "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=30, check=True).stdout
    env = {"PATH": "/usr/bin:/bin", **exports(prolog)}
    out = subprocess.run([sys.executable, "-m", "llmmon", "launch", "--print-env"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return {**env, **dict(line.split("=", 1) for line in out.stdout.splitlines())}


def exports(text: str) -> dict[str, str]:
    return dict(line.removeprefix("export ").split("=", 1) for line in text.splitlines()
                if line)


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
    assert exports(out.stdout) == {"LLMMON_JOB": "4242", "LLMMON_SPOOL": "/run/llmmon/ranks"}
    assert "/run/llmmon/ranks" in (SYSTEMD / "llmmon.tmpfiles.conf").read_text()
    outside = subprocess.run(["sh", prolog], env={"PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=30)
    assert outside.returncode == 0 and outside.stdout == ""  # not in a Slurm job: no-op
