"""A torchrun job with nothing of llmmon in it: the daemon at its defaults finds its ranks in
procfs, reads their stacks with py-spy from outside, and names the rank that hangs, in
/api/v1/ranks, the exposition and `llmmon diagnose --ranks`, blaming nobody else.

The daemon and the job share a PID namespace of their own (bench/faults/pidns.py), as a node's
processes do: the daemon sees that node only.  The job (tests/ranks/trainer.py, --reporter
off) runs a world group and a pair group {0, 1}; rank 1's data loader never returns from
step 300 on.  Its ranks carry NCCL settings and an NCCL_DEBUG_FILE, which holds a real NCCL
2.19 log (gloo on CPUs writes none): the nccl collector reads both from outside.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
import json
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.faults.pidns import PidNamespace
from tests.conftest import ROOT
from tests.helpers import free_port, stop_process, wait_for

TRAINER = ROOT / "tests" / "ranks" / "trainer.py"
NCCL_LOG = ROOT / "tests" / "fixtures" / "nccl" / "logs" / "nccl-2.19.3-roce-ro.log"
NCCL_SETTINGS = {"NCCL_IB_HCA": "=mlx5_10:1,mlx5_11:1", "NCCL_IB_GID_INDEX": "3",
                 "NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "INFO"}


def plain_env() -> dict[str, str]:
    """The job's environment: nothing of llmmon (no reporter, no Flight Recorder settings)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LLMMON_", "TORCH", "PYTHONPATH"))}
    return {**env, "OMP_NUM_THREADS": "1"}


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response) if "/api/v1/" in url else response.read().decode()


def test_a_job_without_the_reporter_has_its_hung_rank_named(tmp_path: Path) -> None:
    port, out = free_port(), tmp_path / "out"
    out.mkdir()
    (tmp_path / "nccl").mkdir()
    (tmp_path / "nccl" / "nccl.node-a.log").write_bytes(NCCL_LOG.read_bytes())
    url = f"http://127.0.0.1:{port}"
    with PidNamespace() as ns, open(tmp_path / "serve.log", "wb") as serve_log, \
            open(tmp_path / "job.log", "wb") as job_log:
        serve = subprocess.Popen(ns.command([
            sys.executable, "-m", "llmmon", "serve", f"--web.listen-address=127.0.0.1:{port}",
            f"--spool.dir={tmp_path / 'spool'}", f"--collector.ranks.fr-dir={tmp_path / 'fr'}",
            f"--collector.ranks.pipe-dir={tmp_path / 'pipe'}",
            # the ceiling, should the job's still periods not be learned in time: its hang is
            # named either way, a minute sooner than at the shipped 180 s
            "--collector.ranks.stall-after=60s",
            f"--collector.incidents.dir={tmp_path / 'incidents'}"]),
            cwd=tmp_path, stdout=serve_log, stderr=subprocess.STDOUT)
        job = subprocess.Popen(ns.command([
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
            "--master-port", str(free_port()), str(TRAINER), "--out", str(out),
            "--reporter", "off", "--steps", "100000", "--compute", "0.02", "--hold", "600",
            "--timeout", "600", "--culprit", "1", "--stuck-at", "300"]),
            env={**plain_env(), **NCCL_SETTINGS,
                 "NCCL_DEBUG_FILE": str(tmp_path / "nccl" / "nccl.%h.log")},
            cwd=tmp_path, stdout=job_log, stderr=subprocess.STDOUT)
        seen: list[dict[str, Any]] = []
        try:
            def jobs() -> list[dict[str, Any]]:
                try:
                    return get(url + "/api/v1/ranks")["jobs"]
                except OSError:
                    return []

            def stalled() -> dict[str, Any] | None:
                found = [j for j in jobs() if len(j["ranks"]) == 3]
                seen.extend(found)
                return next((j for j in found if j["verdict"]["stalled"]), None)

            hung = wait_for(stalled, 400, "the job's hang named from its stacks",
                            interval=1.0, context=lambda: (seen[-1:], job.poll(), serve.poll()))
            # the daemon kept the hang as an incident, with the stacks it read from outside
            incident = wait_for(lambda: next(iter(get(url + "/api/v1/incidents")["incidents"]),
                                             None), 60, "the job's incident")
            kept = get(f"{url}/api/v1/incidents/{incident['id']}/files/stacks.json")
            exposition = get(url + "/metrics")
            diagnosed = subprocess.run(
                [sys.executable, "-m", "llmmon", "diagnose", "--ranks", "--url", url],
                cwd=ROOT, capture_output=True, text=True, timeout=120)
        finally:
            stop_process(job)
            stop_process(serve)
    ranks = {r["rank"]: r for r in hung["ranks"]}
    assert sorted(ranks) == [0, 1, 2]
    assert all(r["reporter"]["fr_api"].startswith("none: seen from outside") for r in
               ranks.values())
    assert all(r["groups"] == {} for r in ranks.values())  # nothing invented from outside
    # every verdict the daemon gave blamed rank 1 or nobody
    assert all(set(j["verdict"]["roots"]) <= {1} for j in seen), [
        j["verdict"] for j in seen if set(j["verdict"]["roots"]) - {1}]
    verdict = hung["verdict"]
    assert verdict["roots"] == [1], verdict
    assert "rank 1 (seen from outside, no reporter) is in load_next_batch (trainer.py:" \
        in verdict["summary"], verdict["summary"]
    assert "sleeping, no CPU for" in verdict["summary"]
    assert "ranks 0, 2 wait in all_reduce for rank 1" in verdict["summary"], verdict["summary"]
    stacks = hung["stacks"]
    assert stacks["stalled"] and stacks["unchanged_seconds"] >= stacks["threshold_seconds"]
    assert stacks["waits"] == {"0": "all_reduce", "2": "all_reduce"}
    job_id = hung["job_id"]
    assert f'llmmon_rank_stack_root{{job_id="{job_id}",rank="1"}} 1.0' in exposition
    assert exposition.count("llmmon_rank_stack_root{") == 1
    assert f'llmmon_rank_waiting{{job_id="{job_id}",rank="0"}} 1.0' in exposition
    assert exposition.count(f'llmmon_rank_info{{job_id="{job_id}",') == 3
    assert exposition.count('source="procfs"') == 3
    assert f'llmmon_rank_info{{job_id="{job_id}",local_rank="1"' in exposition
    # its NCCL settings from its environment and NCCL's choice from its log, from outside
    nccl = {family.name: [sample.labels for sample in family.samples]
            for family in text_string_to_metric_families(exposition)
            if family.name.startswith("llmmon_job_nccl_")}
    (settings,) = nccl["llmmon_job_nccl_settings_info"]
    assert settings["job_id"] == job_id
    assert (settings["ib_hca"], settings["ib_gid_index"], settings["socket_ifname"]) == \
        ("=mlx5_10:1,mlx5_11:1", "3", "lo")
    assert nccl["llmmon_job_nccl_transport_info"] == [{
        "job_id": job_id, "ranks": "0-2", "version": "2.19.3", "net": "IB", "gdr": "",
        "devices": "mlx5_10:1/RoCE,mlx5_11:1/RoCE", "paths": ""}]
    assert "llmmon_job_nccl_misconfigured" not in nccl  # one node, no GPUs: nothing to judge
    assert diagnosed.stdout.count("[CRIT]") == 1, diagnosed.stdout
    assert "rank 1" in diagnosed.stdout and "load_next_batch" in diagnosed.stdout
    assert incident["job_id"] == hung["job_id"] and incident["trigger"] == "stalled"
    assert incident["culprit"]["ranks"] == [1] and incident["culprit"]["cause"] == "stack_root"
    assert incident["dumps"] == {"0": "no pipe", "1": "no pipe", "2": "no pipe"}  # no reporter
    culprit = kept["ranks"]["1"]
    assert culprit["source"] == "py-spy" and culprit["state"] == "sleeping", culprit
    assert any(f["function"] == "load_next_batch" for f in culprit["frames"]), culprit
