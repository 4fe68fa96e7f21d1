"""What a rank is blocked in, read from its frames (llmmon_reporter.blocked), in real gloo jobs
whose Flight Recorder records no point-to-point op: a rank waits in `recv` (or a pipeline
schedule's wait) while its peer holds back until a thread of the waiting rank has seen it (or,
through the reporter's state file, the daemon's /api/v1/ranks entry of it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterator

from tests.helpers import wait_for
from tests.ranks.jobs import base_env, job_doc, watched_collector

# One rank of a scenario.  watch(phase, op) starts a thread that reads blocked() of the main
# thread until it shows `op` (at most 60 s) and writes what it saw to <phase>.json; hold(phase)
# keeps the peer back until that file exists, so the rank is seen blocked, not merely slow.
JOB = r"""
import json, os, sys, threading, time
import torch, torch.distributed as dist
from llmmon_reporter import blocked

scenario, rank, world, tmp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
main = threading.main_thread().ident


def watch(phase, op):
    def look():
        deadline, seen = time.monotonic() + 60, []
        while op not in [s["op"] for s in seen] and time.monotonic() < deadline:
            time.sleep(0.02)
            seen = blocked.blocked(sys._current_frames().get(main), dist)
        with open(os.path.join(tmp, f"{phase}.tmp"), "w") as out:
            json.dump(seen, out)
        os.rename(os.path.join(tmp, f"{phase}.tmp"), os.path.join(tmp, f"{phase}.json"))
    threading.Thread(target=look, daemon=True).start()


def hold(phase):
    while not os.path.exists(os.path.join(tmp, f"{phase}.json")):
        time.sleep(0.02)


t = torch.zeros(4)
if scenario == "recv":
    if rank == 1:
        watch("recv", "recv")
        dist.recv(t, src=0)
        watch("all_reduce", "all_reduce")
        dist.all_reduce(t)
    else:
        hold("recv")
        dist.send(t, dst=1)
        hold("all_reduce")
        dist.all_reduce(t)
elif scenario == "groups":
    whole = dist.new_group([0, 1, 2, 3])  # named "1"
    odd = dist.new_group([1, 3])  # named "2"; its group rank 0 is global rank 1
    if rank == 3:
        watch("recv", "recv")
        dist.recv(t, group=odd, group_src=0)
    elif rank == 1:
        hold("recv")
        dist.send(t, group=odd, group_dst=1)
    elif rank == 2:  # the job's own frame waits on the works of batch_isend_irecv
        ops = [dist.P2POp(dist.irecv, t, group=whole, group_peer=0)]
        works = dist.batch_isend_irecv(ops)
        watch("batch", "recv")
        for work in works:
            work.wait()
    else:
        hold("batch")
        dist.send(t, group=whole, group_dst=2)
elif scenario == "pipeline":
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    x = torch.randn(4, 4)
    pipe = pipeline(model, mb_args=(x[:2],), split_spec={"1": SplitPoint.BEGINNING})
    schedule = ScheduleGPipe(pipe.build_stage(rank, torch.device("cpu")), n_microbatches=2)
    step = lambda: schedule.step(x) if rank == 0 else schedule.step()
    step()  # the first step also exchanges shapes (_warmup_p2p); the second is a plain one
    dist.barrier()
    if rank == 1:
        watch("stage", "recv")
    else:
        hold("stage")
    step()
elif scenario == "reported":  # the reporter writes it into the state file the daemon reads
    import llmmon_reporter
    llmmon_reporter.start()
    if rank == 1:
        dist.recv(t, src=0)
    else:
        hold("release")
        dist.send(t, dst=1)
dist.barrier()
dist.destroy_process_group()
"""


@contextmanager
def _job(tmp: Path, scenario: str, world: int, env: dict[str, str] | None = None
         ) -> Iterator[None]:
    """Every rank of `scenario` running for the block, then to a clean exit (killed if not)."""
    (tmp / "job.py").write_text(JOB)
    procs = []
    try:
        for rank in range(world):
            with open(tmp / f"rank_{rank}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, str(tmp / "job.py"), scenario, str(rank), str(world),
                     str(tmp)], env=env or base_env(), stdout=log, stderr=subprocess.STDOUT))
        yield
        codes = [proc.wait(timeout=180) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    logs = "\n".join((tmp / f"rank_{r}.log").read_text(errors="replace")[-2000:]
                     for r in range(world))
    assert codes == [0] * world, f"exit codes {codes}\n{logs}"


def _run(tmp: Path, scenario: str, world: int) -> dict[str, Any]:
    """Phase -> what blocked() showed, once every rank of `scenario` exited."""
    with _job(tmp, scenario, world):
        pass
    return {path.stem: json.loads(path.read_text()) for path in tmp.glob("*.json")}


def test_a_rank_in_recv_names_its_peer_and_one_in_all_reduce_its_group(tmp_path: Path) -> None:
    seen = _run(tmp_path, "recv", 2)
    assert seen["recv"] == [{"op": "recv", "peer": 0, "pg": "0"}]
    assert seen["all_reduce"] == [{"op": "all_reduce", "peer": None, "pg": "0"}]


def test_a_group_local_peer_is_named_by_its_global_rank(tmp_path: Path) -> None:
    seen = _run(tmp_path, "groups", 4)
    assert seen["recv"] == [{"op": "recv", "peer": 1, "pg": "2"}]
    assert seen["batch"] == [{"op": "recv", "peer": 0, "pg": "1"}]


def test_a_pipeline_stage_waits_on_the_stage_before_it(tmp_path: Path) -> None:
    seen = _run(tmp_path, "pipeline", 2)
    assert seen["stage"] == [{"op": "recv", "peer": 0, "pg": "0"}]


def test_the_daemon_shows_what_a_rank_is_blocked_in_from_its_state_file(tmp_path: Path) -> None:
    with watched_collector(tmp_path) as (spool, collector):
        env = {**base_env(), "LLMMON_SPOOL": str(spool), "LLMMON_JOB": "pp-job",
               "TORCH_FR_BUFFER_SIZE": "2000"}
        with _job(tmp_path, "reported", 2, env):
            def blocked() -> dict[int, Any] | None:
                job = job_doc(collector)
                ranks = {r["rank"]: r["blocked"] for r in (job or {}).get("ranks", [])}
                return ranks if 0 in ranks and ranks.get(1) else None

            ranks = wait_for(blocked, 120, "rank 1's blocked op in /api/v1/ranks")
            (tmp_path / "release.json").write_text("[]")
    assert ranks == {0: [], 1: [{"op": "recv", "peer": 0, "pg": "0"}]}
