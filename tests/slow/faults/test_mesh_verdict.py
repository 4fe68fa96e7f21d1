"""A pipeline stage that stops in its forward, on gloo, whose Flight Recorder records no send or
receive: the daemon's one verdict names that rank alone as the root, the stage before it as
waiting for it through its frames, and the other replica's ranks as waiting in the gradient
all-reduce. The bench's pp-forward class, with the ranks collector read directly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from bench.faults.cluster import TRAINER
from tests.conftest import ROOT
from tests.helpers import wait_for
from tests.ranks.jobs import base_env, by_rank, job_doc, make_collector, scrape
from tests.slow.faults.test_meshjob import stop_ranks, states

WARM_STEPS = 5


def test_a_stage_stuck_in_its_forward_is_the_one_root_of_a_pipeline_job(tmp_path: Path) -> None:
    ctl, spool = tmp_path / "ctl", tmp_path / "spool"
    ctl.mkdir()
    spool.mkdir()
    collector = make_collector(spool, tmp_path, stall_after="2s", auto_dump="false")
    command = [sys.executable, "-m", "llmmon", "launch", "--job", "pp", "--spool", str(spool),
               "--fr-dir", str(tmp_path / "fr"), "--pipe-dir", str(tmp_path / "pipe"), "--",
               sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "4", str(TRAINER), "--ctl", str(ctl), "--parallel", "pp",
               "--fault", "pp-forward", "--culprit", "3", "--step", "0.05"]
    with open(tmp_path / "job.log", "wb") as log:
        job = subprocess.Popen(command, env=base_env(OMP_NUM_THREADS="1"), cwd=ROOT,
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    seen: dict = {}
    try:
        def warm() -> int | None:
            assert job.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
            steps = [(s.get("step") or {}).get("steps", 0) for s in states(spool / "pp").values()]
            return max(steps) if len(steps) == 4 and min(steps) >= WARM_STEPS else None

        fastest = wait_for(warm, 180, "four ranks past the warm-up", interval=0.5)
        (ctl / "go").write_text(str(fastest + 3))
        wait_for(lambda: (ctl / "onset.3").exists(), 120, "rank 3 to stop in its forward")

        def one_root() -> dict | None:
            doc = job_doc(collector)
            seen["verdict"] = verdict = (doc or {}).get("verdict") or {}
            seen["groups"] = [g["summary"] for g in (doc or {}).get("groups", [])]
            blamed = {r for g in (doc or {}).get("groups", []) if g["stalled"]
                      for r in g["behind"] + g["stopped"] + g["quiet_ranks"]}
            frames = {w["rank"] for w in verdict.get("waits", []) if w["seen"] == "frames"}
            ok = verdict.get("stalled") and verdict["roots"] == [3] and blamed <= {3} \
                and 2 in frames
            return verdict if ok else None

        verdict = wait_for(one_root, 240, "one verdict: rank 3 the root, rank 2 waiting",
                           interval=0.5, context=lambda: seen)
        samples = scrape(collector)[0]  # while the job hangs: its end exports no waits
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
        stop_ranks(ctl)
    assert "stuck_in_stage_forward" in verdict["summary"], verdict
    waits = {w["rank"]: w for w in verdict["waits"]}
    assert set(waits) == {0, 1, 2}, verdict
    assert waits[2]["pg_desc"] == "mesh_pp" and waits[2]["on"] == [3], waits[2]
    assert waits[1]["pg_desc"] == "mesh_dp" and waits[1]["on"] == [3], waits[1]
    assert waits[0]["pg_desc"] == "mesh_dp" and waits[0]["on"] == [2], waits[0]
    assert by_rank(samples, "llmmon_rank_waiting") == {0: 1, 1: 1, 2: 1}
