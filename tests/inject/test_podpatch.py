"""The patch logic without a server: it agrees with `llmmon launch`, and the copy the init
container makes starts the reporter from a bare interpreter's path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmmon.commands.launch import environment
from llmmon.inject.owner import job_owner
from llmmon.inject.podpatch import Settings, container_env, opted_in, pod_patch
from tests.conftest import ROOT
from tests.inject.webhook import IMAGE, OWNERS

SETTINGS = Settings(image=IMAGE)
LAUNCH_ONLY = {"PYTHONPATH"}  # the one value that differs: the boot dir's location


def test_the_injected_environment_is_what_launch_sets_for_the_same_job():
    pod, job = OWNERS["volcano"]
    injected = {e["name"]: e.get("value") for e in
                container_env(pod["spec"]["containers"][0], job_owner("team-a", pod["metadata"]),
                              SETTINGS)}
    launched = environment({}, job, SETTINGS.spool, SETTINGS.fr_dir, SETTINGS.pipe_dir,
                           SETTINGS.fr_buffer, timing=False, dump_on_timeout=True)
    assert {k: v for k, v in injected.items() if k in launched and k not in LAUNCH_ONLY} == \
        {k: v for k, v in launched.items() if k not in LAUNCH_ONLY}
    assert set(injected) - set(launched) == {"POD_NAME", "POD_NAMESPACE", "NODE_NAME"}


@pytest.mark.parametrize("label, namespace_opted_in, expected", [
    ("true", False, True), ("True", False, True), (None, False, False), ("false", True, False),
    (None, True, True), ("yes", False, False), ("", True, True),
])
def test_opt_in_and_opt_out(label, namespace_opted_in, expected):
    labels = {} if label is None else {"llmmon.io/inject": label}
    assert opted_in(labels, namespace_opted_in) is expected


def test_job_ids_survive_the_spools_sanitiser_unchanged():
    from llmmon_reporter.layout import safe_job

    for pod, job in OWNERS.values():
        assert job_owner("team-a", pod["metadata"]).job_id == job == safe_job(job)


def test_a_pod_with_null_lists_and_annotations_is_patched(tmp_path):
    pod, _ = OWNERS["job"]
    pod = json.loads(json.dumps(pod))
    pod["metadata"]["annotations"] = None
    pod["spec"]["volumes"] = None
    ops = pod_patch(pod, "team-a", SETTINGS)
    assert {"op": "add", "path": "/metadata/annotations",
            "value": {"llmmon.io/injected": "team-a.bert"}} in ops
    assert any(op["path"] == "/spec/volumes" and len(op["value"]) == 4 for op in ops)


def test_the_init_containers_copy_starts_the_reporter_from_its_boot_dir(tmp_path: Path):
    """`llmmon copy-reporter` as the init container runs it; a fresh interpreter with only the
    boot dir on its path (none of this checkout) loads the reporter from the copy."""
    dest = tmp_path / "emptydir"
    dest.mkdir()
    job_dir = tmp_path / "fr" / "team-a.llama"
    for _ in range(2):  # an init container that runs again replaces its copy
        done = subprocess.run([sys.executable, "-m", "llmmon", "copy-reporter", str(dest),
                               f"--job-dir={job_dir}"],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    assert job_dir.stat().st_mode & 0o777 == 0o777  # as `llmmon launch` leaves it
    boot = dest / "llmmon_reporter" / "boot"
    assert (boot / "sitecustomize.py").is_file()
    assert not list(dest.rglob("__pycache__")) and not list(dest.glob(".*"))
    modes = {oct(p.stat().st_mode & 0o777) for p in dest.rglob("*")}
    assert modes == {"0o644", "0o755"}
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(boot)}
    seen = subprocess.run([sys.executable, "-c", "import sys, json; m = sys.modules.get("
                           "'llmmon_reporter'); print(json.dumps(m and m.__file__))"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert seen.returncode == 0, seen.stderr
    assert json.loads(seen.stdout) == str(dest / "llmmon_reporter" / "__init__.py")


def test_copy_reporter_never_fails_the_pod(tmp_path: Path):
    """An init container that exits non-zero would stop the pod: problems are only logged."""
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    done = subprocess.run([sys.executable, "-m", "llmmon", "copy-reporter", str(blocked),
                           f"--job-dir={blocked}/job"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0
    assert "training runs without the reporter" in done.stderr
    assert "cannot prepare" in done.stderr


def test_nccl_log_goes_to_the_dump_directory_unless_the_container_may_set_nccl_debug():
    pod, job = OWNERS["volcano"]
    container = pod["spec"]["containers"][0]
    owner = job_owner("team-a", pod["metadata"])
    injected = {e["name"]: e.get("value") for e in container_env(container, owner, SETTINGS)}
    assert injected["NCCL_DEBUG"] == "INFO"
    assert injected["NCCL_DEBUG_FILE"] == f"{SETTINGS.fr_dir}/{job}/nccl.%h.%p.log"
    # envFrom (a ConfigMap) may set NCCL_DEBUG where the webhook cannot see it
    with_env_from = {**container, "envFrom": [{"configMapRef": {"name": "nccl"}}]}
    names = {e["name"] for e in container_env(with_env_from, owner, SETTINGS)}
    assert not names & {"NCCL_DEBUG", "NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS"}
    own = {**container, "env": [*(container.get("env") or []),
                                {"name": "NCCL_DEBUG", "value": "WARN"}]}
    env = {e["name"]: e.get("value") for e in container_env(own, owner, SETTINGS)}
    assert env["NCCL_DEBUG"] == "WARN" and "NCCL_DEBUG_FILE" not in env
    off = Settings(image=IMAGE, nccl_log=False)
    assert "NCCL_DEBUG" not in {e["name"] for e in container_env(container, owner, off)}
