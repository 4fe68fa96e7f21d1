"""The fault benchmark's mesh jobs train: each starts healthy under `llmmon launch` (torchrun,
four gloo ranks, no daemon) and every rank reports steps, so that the bench's mesh classes
never find a job that no longer starts.  Where they stop under a fault is the bench's business
(bench/faults/classes.py notes it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.faults.cluster import TRAINER
from tests.conftest import ROOT
from tests.helpers import wait_for
from tests.ranks.jobs import base_env

STEPS = 5
GROUPS = {"fsdp-tp": {"mesh_dp", "mesh_tp"}, "hsdp": {"mesh_replicate", "mesh_shard"},
          "pp": {"mesh_dp", "mesh_pp"}, "ep": {"mesh_dp", "mesh_ep"}}


def states(spool: Path) -> dict[int, dict]:
    """Each rank's last status report (rank_<rank>.<pid>.json)."""
    found = {}
    for path in spool.glob("rank_*.json"):
        if not path.name.endswith(".entries.json"):
            try:
                found[int(path.name.split(".")[0].removeprefix("rank_"))] = \
                    json.loads(path.read_text())
            except ValueError:  # being replaced
                continue
    return found


def stop_ranks(ctl: Path) -> None:
    """Kill each rank by the PID it wrote, if that process is still one of this job's."""
    for path in ctl.glob("pid.*"):
        pid = int(path.read_text())
        try:
            if str(ctl).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except OSError:  # gone already
            continue


@pytest.mark.parametrize("parallel", sorted(GROUPS))
def test_a_mesh_job_trains_on_four_ranks(parallel: str, tmp_path: Path) -> None:
    ctl, spool = tmp_path / "ctl", tmp_path / "spool"
    ctl.mkdir()
    spool.mkdir()
    command = [sys.executable, "-m", "llmmon", "launch", "--job", "mesh", "--spool",
               str(spool), "--fr-dir", str(tmp_path / "fr"), "--pipe-dir", str(tmp_path / "pipe"),
               "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "4", str(TRAINER), "--ctl", str(ctl), "--parallel", parallel,
               "--step", "0.05"]
    with open(tmp_path / "job.log", "wb") as log:
        job = subprocess.Popen(command, env=base_env(OMP_NUM_THREADS="1"), cwd=ROOT,
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def trained() -> dict[int, dict] | None:
            assert job.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
            seen = states(spool / "mesh")
            done = len(seen) == 4 and all((s.get("step") or {}).get("steps", 0) >= STEPS
                                          for s in seen.values())
            return seen if done else None

        seen = wait_for(trained, 120, f"every rank of the {parallel} job past {STEPS} steps",
                        interval=0.5, context=lambda: (tmp_path / "job.log").read_text()[-2000:])
        for rank, state in seen.items():
            descs = {group["desc"] for group in state["pgs"].values()}
            assert GROUPS[parallel] <= descs, (rank, state["pgs"])
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
        stop_ranks(ctl)  # torchrun starts its ranks in sessions of their own
