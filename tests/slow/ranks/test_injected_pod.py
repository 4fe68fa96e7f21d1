"""A pod the webhook patched runs a real 2-rank gloo torchrun job, with nothing of llmmon but
what the patch gave it, and its hang is named as under `llmmon launch`.

The pod's side: the real `llmmon webhook` (over TLS) patches a PyTorchJob's pod; its init
container's command fills the "emptyDir" (a temp dir); the trainer container's env is resolved
as the kubelet would (in order, `$(VAR)`, the downward API) and its hostPath mounts are temp
dirs at the same paths on "node" and in "pod" (the webhook's path flags point there). The
trainer runs in a venv that holds torch only. The node's side: a real `llmmon serve` on that
spool. The same trainer is then run under `llmmon launch`, and the two verdicts compared.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import requests

from bench.faults.torchvenv import torch_only_venv
from tests.conftest import ROOT, SOURCES
from tests.helpers import descendants, wait_for
from tests.inject.webhook import OWNERS, Webhook, kubelet_environment, make_tls
from tests.ranks.jobs import FAST, TRAINER

POD, JOB = OWNERS["pytorchjob"]  # pod llama-worker-0 of PyTorchJob llama in team-a
FIELDS = {"metadata.name": "llama-worker-0", "metadata.namespace": "team-a",
          "spec.nodeName": "gpu-node-1"}
# rank 1 stops in Python before step 10's collectives; rank 0 waits in its next all_reduce
HANG = ["--steps", "20", "--compute", "0.01", "--behaviour", "hang", "--culprit", "1",
        "--hold", "600", "--timeout", "600", "--reporter", "auto"]


def bare_env(**extra: str) -> dict[str, str]:
    """A node's process environment: nothing of this checkout, no PYTHONPATH."""
    keep = {k: v for k, v in os.environ.items()
            if k in ("PATH", "HOME", "LANG", "TMPDIR") or k.startswith("OPENBLAS_")}
    return {**keep, "OMP_NUM_THREADS": "1", **FAST, **extra}


def patched_pod(tmp_path: Path, node: dict[str, Path], emptydir: Path) -> dict[str, Any]:
    with Webhook(make_tls(tmp_path / "tls"), tmp_path / "webhook.log",
                 f"--reporter-dir={emptydir}", f"--spool={node['ranks']}",
                 f"--pipe-dir={node['frpipe']}", f"--fr-dir={node['fr']}") as webhook:
        return webhook.admit(POD)[1]


def run_init_container(pod: dict[str, Any]) -> None:
    """The image's entrypoint is `llmmon`: the init container runs it with its args."""
    (init,) = pod["spec"]["initContainers"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for mount in init["volumeMounts"]:  # the emptyDir, and the node's dump and pipe dirs
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            Path(mount["mountPath"]).mkdir(parents=True)
        else:
            assert volume["hostPath"]["path"] == mount["mountPath"]
    done = subprocess.run([sys.executable, "-m", "llmmon", *init["args"]], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def job_view(url: str, job: str, seen: dict[str, Any]) -> dict[str, Any] | None:
    """The job's document in the daemon's /api/v1/ranks once both ranks report and its
    verdict has settled on the hang: rank 1 the root, rank 0 waiting for it."""
    doc = requests.get(url + "/api/v1/ranks", timeout=5).json()
    seen["jobs"] = {j["job_id"]: j["verdict"] for j in doc["jobs"]}
    found = next((j for j in doc["jobs"] if j["job_id"] == job), None)
    verdict = found["verdict"] if found else {}
    if found and len(found["ranks"]) == 2 and verdict["stalled"] and verdict["roots"] == [1] \
            and any(w["rank"] == 0 and w["on"] == [1] for w in verdict["waits"]):
        return found
    return None


def hang(command: list[str], env: dict[str, str], cwd: Path, url: str, job: str
         ) -> dict[str, Any]:
    (cwd / "out").mkdir()  # where the trainer writes its results
    log_path = cwd / f"{job}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    seen: dict[str, Any] = {}
    try:
        def named() -> dict[str, Any] | None:
            assert process.poll() is None, log_path.read_text(errors="replace")[-3000:]
            return job_view(url, job, seen)
        return wait_for(named, 300, f"job {job}'s hang to be named", interval=0.5,
                        context=lambda: seen)
    finally:
        # torchrun's group, and the ranks wherever they are: torchrun may start them in
        # sessions of their own, which outlive a kill of its group (found holding for 600 s)
        ranks = [pid for pid, _ in descendants(process.pid)]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(30)


def shape(verdict: dict[str, Any]) -> tuple:
    return (verdict["roots"], verdict["cycle"],
            sorted((w["rank"], w["pg"], w["pg_desc"], str(w["op"]), tuple(w["on"]))
                   for w in verdict["waits"]))


def test_an_injected_pod_reports_and_its_hang_is_named_as_under_launch(tmp_path: Path, serve):
    node = {name: tmp_path / "node" / name for name in ("ranks", "frpipe", "fr")}
    for directory in node.values():
        directory.mkdir(parents=True)
    emptydir = tmp_path / "pod" / "llmmon-reporter"
    pod = patched_pod(tmp_path, node, emptydir)
    run_init_container(pod)
    (trainer,) = pod["spec"]["containers"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for mount in trainer["volumeMounts"]:  # every mount is there, at the path the env names
        volume = volumes[mount["name"]]
        where = volume["hostPath"]["path"] if "hostPath" in volume else str(emptydir)
        assert where == mount["mountPath"] and Path(where).is_dir(), (mount, volume)
    env = kubelet_environment(trainer, FIELDS)
    for directory in ("fr", "frpipe"):  # made by the init container, as launch makes them
        assert (node[directory] / JOB).stat().st_mode & 0o777 == 0o777
    assert env["LLMMON_JOB"] == JOB and env["LLMMON_SPOOL"] == str(node["ranks"])
    assert env["PYTHONPATH"] == str(emptydir / "llmmon_reporter" / "boot")
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == f"{node['frpipe']}/{JOB}/rank_"
    torch_only = torch_only_venv(tmp_path / "venv")
    server = serve("--collector.disable-defaults", "--collector.ranks",
                   f"--spool.dir={node['ranks']}", "--collector.ranks.interval=0.2s",
                   "--collector.ranks.stall-after=1s", f"--collector.ranks.fr-dir={node['fr']}",
                   f"--collector.ranks.pipe-dir={node['frpipe']}",
                   # the reporter's evidence alone: ranks found in procfs are another test's
                   "--collector.ranks.discover=false")
    torchrun = [str(torch_only), "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", str(TRAINER), "--out"]
    work = tmp_path / "injected"
    work.mkdir()
    injected = hang(torchrun + [str(work / "out"), *HANG], bare_env(**env), work, server.url,
                    JOB)

    assert {r["rank"]: (r["pod"], r["namespace"], r["world_size"]) for r in injected["ranks"]} \
        == {0: ("llama-worker-0", "team-a", 2), 1: ("llama-worker-0", "team-a", 2)}
    assert all(r["reporter"]["errors_total"] == 0 for r in injected["ranks"]), injected["ranks"]
    assert injected["verdict"]["roots"] == [1], injected["verdict"]
    assert injected["verdict"]["summary"].startswith(f"job {JOB}: rank 1 ("), injected["verdict"]
    assert "rank 0 waits in world all_reduce #21 (group 0) for rank 1" in \
        injected["verdict"]["summary"]

    # The same trainer under `llmmon launch` (run from this checkout, which it does not pass
    # on: the trainer's PYTHONPATH holds the boot dir alone).
    launcher = [sys.executable, "-c", f"import sys; sys.path[:0] = {SOURCES!r}; "
                "from llmmon.cli import main; sys.exit(main())"]
    work = tmp_path / "launched"
    work.mkdir()
    launched = hang(launcher + ["launch", "--job", "launched", "--spool", str(node["ranks"]),
                                "--fr-dir", str(node["fr"]), "--pipe-dir", str(node["frpipe"]),
                                "--", *torchrun, str(work / "out"), *HANG],
                    bare_env(), work, server.url, "launched")
    assert shape(injected["verdict"]) == shape(launched["verdict"]), (injected["verdict"],
                                                                      launched["verdict"])
    assert [g["behind"] for g in injected["groups"] if g["stalled"]] == \
        [g["behind"] for g in launched["groups"] if g["stalled"]]
