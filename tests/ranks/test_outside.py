"""Ranks without the reporter: found in a procfs tree, their py-spy stacks read, their job judged.

The procfs trees are written here the way the kernel lays them out; the stacks are py-spy's
real output for a gloo rank inside all_reduce and one sleeping in the job's own code
(tests/fixtures/pyspy, captured from a 2-rank torchrun job).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmmon.ranks import discover, stacks
from llmmon.ranks.discover import Follower, Scanner
from llmmon.ranks.stacks import History, RankStack, StackWatch
from llmmon.ranks.validate import Notes
from llmmon.sources import pyspy
from llmmon.sources.fs import RootedFS
from llmmon_reporter import identity

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pyspy"
TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none", "PATH": "/usr/bin"}


def fixture_frames(name: str, pid: int) -> tuple[pyspy.StackFrame, ...]:
    return pyspy.parse((FIXTURES / name).read_bytes(), pid)


# py-spy's output -------------------------------------------------------------------------

def test_a_gloo_rank_in_all_reduce_is_blocked_in_it():
    frames = fixture_frames("gloo-all-reduce.json", 45)
    assert frames[0].module == "torch.distributed.distributed_c10d"
    assert frames[0].function == "all_reduce"
    assert frames[-1].module == "job" and frames[-1].line == 12
    assert stacks.blocked_in(frames) == "all_reduce"


def test_a_rank_in_its_own_code_is_blocked_in_nothing():
    frames = fixture_frames("job-code-sleep.json", 46)
    assert [f.function for f in frames] == ["stuck_forever", "<module>"]
    assert stacks.blocked_in(frames) is None


@pytest.mark.parametrize("data, why", [
    (b"not json", "not JSON"),
    (b'{"a": 1}', "not a list of threads"),
    (b'[1, 2]', "not a list of threads"),
    (b'[{"thread_name": "worker", "os_thread_id": 7, "frames": []}]', "no main thread"),
    (b'[{"thread_name": "MainThread", "frames": "x"}]', "without frames"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
])
def test_bad_py_spy_output_is_a_clear_error(data: bytes, why: str):
    with pytest.raises(pyspy.StackError, match=why):
        pyspy.parse(data, 45)


def test_hostile_frames_are_bounded():
    raw = [{"thread_name": "MainThread", "frames": [
        {"name": "x" * 10_000, "filename": "/a/" + "b" * 10_000, "line": 1 << 40},
        {"name": None, "filename": None, "line": "12"}, "not a frame"] * 50}]
    frames = pyspy.parse(json.dumps(raw).encode(), 1)
    assert len(frames) <= pyspy.MAX_FRAMES
    assert len(frames[0].function) == 200 and len(frames[0].file) == 500
    assert frames[0].line == 0 and frames[1].line == 0 and frames[1].function == ""


@pytest.mark.parametrize("file, module", [
    ("/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py",
     "torch.distributed.distributed_c10d"),
    ("/venv/lib/python3.11/site-packages/torch/__init__.py", "torch"),
    ("/work/train/data.py", "data"),
    ("<string>", "<string>"),
    ("", ""),
])
def test_module_of_a_file(file: str, module: str):
    assert pyspy.module_of(file) == module


# what the stacks say about a job ----------------------------------------------------------

def frames_at(function: str, module: str, line: int = 1) -> tuple[pyspy.StackFrame, ...]:
    return (pyspy.StackFrame(f"/x/{module}.py", line, function, module),
            pyspy.StackFrame("/job/train.py", 70, "<module>", "train"))


COLLECTIVE = frames_at("all_reduce", "torch.distributed.distributed_c10d")
BROADCAST = frames_at("broadcast", "torch.distributed.distributed_c10d")
BACKWARD = frames_at("_engine_run_backward", "torch.autograd.graph")
LOADER = frames_at("load_next_batch", "data", 41)


def history(*samples: tuple[float, tuple[pyspy.StackFrame, ...]]) -> History:
    out = History()
    for at, frames in samples:
        out.add(at, frames)
    return out


def test_unchanged_counts_only_samples_close_together():
    # alike samples 10 s apart say nothing about the steps between them
    assert history((0, LOADER), (10, LOADER)).unchanged() == 0.0
    assert history((0, LOADER), (10, LOADER), (12, LOADER), (14, LOADER)).unchanged() == 4.0
    assert history((0, LOADER), (2, COLLECTIVE), (4, COLLECTIVE)).unchanged() == 2.0
    assert history((0, LOADER)).unchanged() == 0.0
    assert history((0, LOADER), (10, LOADER)).looks_still()


def still(rank: int, frames, start: float, end: float, stopped: bool = False,
          cpu_still: float | None = None) -> RankStack:
    """A rank sampled every 2 s from `start` to `end` with `frames`, its process without CPU
    over that time (unless `cpu_still` says otherwise)."""
    samples = [(t, frames) for t in range(int(start), int(end) + 1, 2)]
    return RankStack(rank, history(*samples), stopped,
                     end - start if cpu_still is None else cpu_still)


def watch() -> StackWatch:
    """A watch that has seen its job train (its threshold is its own, not the ceiling)."""
    judge = StackWatch(floor=10.0, factor=5.0, ceiling=180.0)
    judge.looped = True
    return judge


def test_the_rank_in_its_own_code_is_the_root_and_the_others_wait():
    verdict = watch().judge([still(0, COLLECTIVE, 0, 30), still(1, LOADER, 0, 30),
                             still(2, COLLECTIVE, 0, 30)])
    assert verdict.stalled and verdict.unchanged == 30
    assert verdict.roots == (1,)
    assert verdict.waits == {0: "all_reduce", 2: "all_reduce"}


def test_not_stalled_before_the_threshold():
    verdict = watch().judge([still(0, COLLECTIVE, 0, 8), still(1, LOADER, 0, 8)])
    assert not verdict.stalled and verdict.roots == () and verdict.suspect


def test_a_stopped_rank_is_a_root_even_inside_a_collective():
    verdict = watch().judge([still(0, COLLECTIVE, 0, 30), still(1, COLLECTIVE, 0, 30, True)])
    assert verdict.roots == (1,)


def test_every_rank_in_the_same_collective_is_a_symmetric_stall():
    verdict = watch().judge([still(0, COLLECTIVE, 0, 30), still(1, COLLECTIVE, 0, 30),
                             still(2, BACKWARD, 0, 30)])
    assert verdict.stalled and verdict.roots == () and verdict.symmetric == "all_reduce"


def test_the_rank_in_another_collective_is_the_odd_one():
    verdict = watch().judge([still(0, COLLECTIVE, 0, 30), still(1, BROADCAST, 0, 30),
                             still(2, COLLECTIVE, 0, 30), still(3, BACKWARD, 0, 30)])
    assert verdict.roots == (1,)  # the rank in backward may wait in either: never the odd one


def test_ranks_split_evenly_between_collectives_disagree():
    verdict = watch().judge([still(0, COLLECTIVE, 0, 30), still(1, BROADCAST, 0, 30)])
    assert verdict.stalled and verdict.roots == () and verdict.disagree


def test_the_threshold_is_learned_from_what_the_job_held_still_while_training():
    judge = watch()
    ranks = {0: History(), 1: History()}

    def at(t: float, frames: dict[int, tuple[pyspy.StackFrame, ...]]):  # type: ignore[no-untyped-def]
        for rank, history in ranks.items():
            history.add(t, frames[rank])
        return judge.judge([RankStack(r, h, False, 1000.0) for r, h in ranks.items()])

    # healthy: the stacks stay alike for 6 s at a time, then change
    t = 0.0
    for period in range(5):
        for _ in range(4):  # 0, 2, 4, 6 s alike
            at(t, {0: COLLECTIVE, 1: LOADER})
            t += 2
        at(t, {0: BACKWARD, 1: BACKWARD})
        t += 2
    assert judge.threshold() == 30.0  # 5 x 6 s
    start = t
    while t - start < 28:
        assert not at(t, {0: COLLECTIVE, 1: LOADER}).stalled
        t += 2
    assert at(t + 2, {0: COLLECTIVE, 1: LOADER}).stalled


def test_a_still_period_cut_by_a_late_sample_is_not_learned():
    """A sample too late (the daemon busy) cuts a still period without the job moving on."""
    judge = watch()
    history = History()
    for t in (0, 2, 4, 6, 8, 20, 22):  # 8 -> 20: too far apart; the stack never changed
        history.add(t, LOADER)
        judge.judge([RankStack(0, history, False, 1000.0)])
    assert not judge.episodes


def test_the_threshold_stays_within_floor_and_ceiling():
    judge = StackWatch(floor=10.0, factor=5.0, ceiling=60.0)
    judge.looped = True
    assert judge.threshold() == 10.0
    judge.episodes.append(100.0)
    assert judge.threshold() == 60.0


def test_one_long_still_period_is_not_the_threshold():
    """The rendezvous at start holds every rank still as long as the slowest takes to start."""
    judge = watch()
    judge.episodes.extend([13.0] + [2.0] * 9)
    assert judge.threshold() == 10.0  # 5 x the 90th percentile (2 s), at the floor
    judge.episodes.extend([4.0] * 10)
    assert judge.threshold() == 20.0


def test_a_hang_is_not_learned_as_healthy():
    judge = watch()
    judge.judge([still(0, LOADER, 0, 40)])
    judge.judge([still(0, COLLECTIVE, 42, 42)])  # it moved on after a stall
    assert judge.threshold() == 10.0


# discovery ------------------------------------------------------------------------------

def test_a_torchrun_worker_is_a_rank():
    assert discover.rank_of(TORCHRUN, lambda: False) == (1, 4)


@pytest.mark.parametrize("env", [
    {"RANK": "1", "WORLD_SIZE": "4"},  # no torchrun variable: some other framework's RANK
    {**TORCHRUN, "RANK": "4"},  # rank beyond the world
    {**TORCHRUN, "RANK": "-1"},
    {**TORCHRUN, "WORLD_SIZE": "9" * 30},
    {"PATH": "/bin"},
    {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"},  # no Slurm job
])
def test_not_a_rank(env):
    assert discover.rank_of(env, lambda: True) is None


def test_a_slurm_task_is_a_rank_only_with_torch_loaded():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "4242"}
    assert discover.rank_of(env, lambda: True) == (3, 8)
    assert discover.rank_of(env, lambda: False) is None


@pytest.mark.parametrize("env", [
    TORCHRUN,
    {**TORCHRUN, "TORCHELASTIC_RUN_ID": "j-77"},
    {**TORCHRUN, "LLMMON_JOB": "pretrain"},
    {"SLURM_JOB_ID": "4242", "RANK": "0"},
])
def test_the_job_is_the_one_the_reporter_would_name(env):
    """A rank seen from outside and through the reporter is one rank."""
    assert discover.job_of(env, 1) == identity.job_id(env)


def write_process(root: Path, pid: int, ppid: int, start: int, env: dict[str, str] | None,
                  cpu_ticks: int = 100, state: str = "S") -> None:
    proc = root / str(pid)
    (proc / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
    fields = [state, str(ppid)] + ["0"] * 9 + [str(cpu_ticks), "0"] + ["0"] * 6 + [str(start)]
    stat = f"{pid} (python) " + " ".join(fields + ["0"] * 30) + "\n"
    (proc / "stat").write_text(stat)
    (proc / "task" / str(pid) / "stat").write_text(stat)
    if env is not None:
        (proc / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))
    (proc / "io").write_text("rchar: 1\nwchar: 2\nread_bytes: 4096\nwrite_bytes: 8192\n")
    (proc / "status").write_text("Name:\tpython\nvoluntary_ctxt_switches:\t10\n"
                                 "nonvoluntary_ctxt_switches:\t3\n")
    (proc / "maps").write_text("7f00-7f01 r-xp 0 0:0 1 /usr/lib/libc.so\n")


def test_scan_finds_the_ranks_and_not_their_workers(tmp_path: Path):
    write_process(tmp_path, 10, 1, 500, {**TORCHRUN, "RANK": "0", "LOCAL_RANK": "0"})
    write_process(tmp_path, 11, 1, 501, TORCHRUN)
    write_process(tmp_path, 12, 11, 900, TORCHRUN)  # rank 1's DataLoader worker
    write_process(tmp_path, 13, 1, 502, {"PATH": "/bin"})  # not a rank
    write_process(tmp_path, 14, 1, 503, None)  # environ unreadable
    (tmp_path / "15").mkdir()  # a process gone mid-scan: no stat
    found = Scanner(RootedFS(str(tmp_path))).scan(0.0)
    assert [(f.pid, f.rank, f.world_size, f.local_rank) for f in found] == [(10, 0, 4, 0),
                                                                            (11, 1, 4, 1)]
    assert found[0].job_id == identity.rendezvous_job("10.0.0.1:29500")
    assert Scanner(RootedFS(str(tmp_path))).scan(0.0, skip=[10]) == found[1:]


def test_a_restarted_rank_is_its_newer_process(tmp_path: Path):
    write_process(tmp_path, 20, 1, 500, TORCHRUN)
    write_process(tmp_path, 30, 1, 800, TORCHRUN)
    assert [f.pid for f in Scanner(RootedFS(str(tmp_path))).scan(0.0)] == [30]


def test_a_process_read_before_its_exec_is_read_again(tmp_path: Path):
    """Between fork and exec a worker still has its launcher's environment and its start
    time does not change at exec: a process found not to be a rank is read again later."""
    scanner = Scanner(RootedFS(str(tmp_path)))
    write_process(tmp_path, 40, 1, 500, {"PATH": "/bin"})
    assert scanner.scan(0.0) == []
    write_process(tmp_path, 40, 1, 500, TORCHRUN)
    assert scanner.scan(5.0) == []
    assert [f.pid for f in scanner.scan(5.0 + discover.RECHECK)] == [40]


def test_a_hostile_environment_is_cleaned_like_a_spool_file(tmp_path: Path):
    env = {**TORCHRUN, "LLMMON_JOB": "../../etc\x00", "POD_NAME": 'p"o}d\n{x="1"',
           "POD_NAMESPACE": "NS with spaces"}
    write_process(tmp_path, 50, 1, 500, env)
    procfs = RootedFS(str(tmp_path))
    found = Scanner(procfs).scan(0.0)
    notes = Notes()
    ((_, state),) = Follower(procfs).states(found, 100.0, {}, notes)
    who = state.identity
    assert "/" not in who.job_id and "\n" not in who.pod and '"' not in who.pod
    assert " " not in who.namespace
    assert state.health.fr_api == discover.SEEN_FROM_OUTSIDE
    assert notes.sanitised


def test_activity_is_dated_when_procfs_shows_it_move(tmp_path: Path):
    write_process(tmp_path, 60, 1, 500, TORCHRUN, cpu_ticks=100)
    procfs = RootedFS(str(tmp_path))
    follower = Follower(procfs)
    found = Scanner(procfs).scan(0.0)
    follower.observe(found, 100.0)
    ((_, first),) = follower.states(found, 100.0, {}, Notes())
    follower.observe(found, 110.0)
    ((_, same),) = follower.states(found, 110.0, {}, Notes())
    write_process(tmp_path, 60, 1, 500, TORCHRUN, cpu_ticks=200)
    follower.observe(found, 120.0)
    ((_, moved),) = follower.states(found, 120.0, {}, Notes())
    assert first.activity and same.activity and moved.activity
    assert same.activity.cpu_active == 100.0  # no CPU since the first look
    assert moved.activity.cpu_active == 120.0
    assert moved.activity.written_bytes == 8192 and moved.activity.voluntary_switches == 10
    assert first.stack is None


def test_the_stack_shown_is_the_sample_given(tmp_path: Path):
    write_process(tmp_path, 70, 1, 500, TORCHRUN)
    procfs = RootedFS(str(tmp_path))
    found = Scanner(procfs).scan(0.0)
    ((_, state),) = Follower(procfs).states(found, 1.0, {70: LOADER}, Notes())
    assert state.stack is not None and state.stack[0].function == "load_next_batch"


def test_a_job_never_seen_to_move_waits_for_the_ceiling():
    """A job that starts with minutes of compilation holds its stacks still from the start."""
    judge = StackWatch(floor=10.0, factor=5.0, ceiling=180.0)
    assert not judge.judge([still(0, LOADER, 0, 170), still(1, COLLECTIVE, 0, 170)]).stalled
    assert judge.judge([still(0, LOADER, 0, 180), still(1, COLLECTIVE, 0, 180)]).stalled


def test_the_threshold_is_learned_once_a_rank_is_seen_in_its_training_loop():
    """Start-up (imports, the rendezvous) never comes back to a stack; a training step does."""
    judge = StackWatch(floor=10.0, factor=5.0, ceiling=180.0)
    rank = History()
    for t, frames in enumerate([LOADER, BACKWARD, COLLECTIVE, BROADCAST]):  # all different
        rank.add(t * 2, frames)
        judge.judge([RankStack(0, rank, False, 0.0)])
    assert not rank.looped and judge.threshold() == 180.0
    rank.add(8, BACKWARD)  # back at a stack it had, after others: a loop
    judge.judge([RankStack(0, rank, False, 0.0)])
    assert rank.looped and judge.threshold() == 10.0


def test_a_rank_that_works_at_one_line_is_not_still():
    """Its "compute" a sleep or a kernel launched from one line: the same stack at every
    sample, but its process uses CPU every step."""
    working = still(1, LOADER, 0, 30, cpu_still=0.3)
    verdict = watch().judge([still(0, COLLECTIVE, 0, 30), working])
    assert not verdict.stalled and verdict.unchanged == 0.3
    # a rank inside torch is judged by its stack alone: an NCCL wait spins a CPU
    spinning = still(0, COLLECTIVE, 0, 30, cpu_still=0.0)
    assert watch().judge([spinning, still(1, LOADER, 0, 30)]).roots == (1,)


def test_the_job_verdict_speaks_of_ranks_stuck_before_their_collective(tmp_path: Path):
    """Every rank here outside torch: the job's one verdict, in the words the reporter's
    quiet verdict uses, through the real ledger and judge."""
    from llmmon.ranks import stall
    from llmmon.ranks.ledger import Ledger

    write_process(tmp_path, 80, 1, 500, {**TORCHRUN, "RANK": "0", "LOCAL_RANK": "0"})
    write_process(tmp_path, 81, 1, 501, TORCHRUN)
    procfs = RootedFS(str(tmp_path))
    found = Scanner(procfs).scan(0.0)
    follower = Follower(procfs)
    follower.observe(found, 100.0)
    ledger = Ledger(64, 32, lambda pid, start: False)
    for rank, state in follower.states(found, 100.0, {80: LOADER, 81: LOADER}, Notes()):
        assert ledger.observe_state(state, 100.0, 100.0)
    seen = watch().judge([still(0, LOADER, 60, 100), still(1, LOADER, 60, 100)])
    limits = stall.StallThresholds(30.0, 180.0)
    (job,) = stall.judge(ledger, 100.0, limits, seen={found[0].job_id: seen}).jobs
    assert job.verdict.roots == (0, 1) and job.stacks is seen
    summary = job.verdict.summary()
    assert "every rank here is stuck before its next collective; rank 0 (seen from outside, " \
        "no reporter) is in load_next_batch (data.py:41)" in summary, summary


def test_an_exception_nobody_read_does_not_take_the_job_down():
    """Without the reporter, status 1 is an exception whose text nobody read: a peer's failure
    seen from this side as likely as the rank's own error.  A status the rank chose, or a
    violent signal, still names it."""
    from llmmon.ranks.ending import End, verdict

    alone = verdict("j", [0, 1], [End(0, 10.0, 14.0, "vanished", 1, "", unread=True)])
    assert alone is not None and alone["first"] == [], alone
    assert "cannot read without the reporter" in alone["summary"]
    torn = verdict("j", [0, 1], [End(0, 10.0, 14.0, "vanished", 1, "", unread=True),
                                 End(1, 10.5, 14.5, "vanished", -15, "", unread=True)])
    assert torn is not None and torn["first"] == [], torn
    for code in (3, -9):
        own = verdict("j", [2, 3], [End(3, 10.0, 11.0, "vanished", code, "", unread=True),
                                    End(2, 10.5, 12.0, "vanished", -15, "", unread=True)])
        assert own is not None and own["first"] == [3], own
    # with the reporter, a vanished status 1 (os._exit(1)) is the rank's own doing, as before
    mine = verdict("j", [0, 1], [End(0, 10.0, 11.0, "vanished", 1, ""),
                                 End(1, 12.0, 13.0, "vanished", -15, "")])
    assert mine is not None and mine["first"] == [0], mine


def test_a_rank_the_reporter_follows_is_left_to_it_with_its_workers(tmp_path: Path):
    """Its DataLoader workers inherit its environment: found from outside they would be the
    rank again (and cost a py-spy dump each)."""
    from llmmon.ranks.outside import OutsideRanks

    write_process(tmp_path, 10, 1, 500, {**TORCHRUN, "RANK": "0", "LOCAL_RANK": "0"})
    write_process(tmp_path, 11, 1, 501, TORCHRUN)  # rank 1, followed through its reporter
    write_process(tmp_path, 12, 11, 900, TORCHRUN)  # its DataLoader worker
    outside = OutsideRanks(RootedFS(str(tmp_path)), None, 10.0, 5.0, 180.0)
    job = discover.job_of(TORCHRUN, 1)
    run = outside.run(0.0, {(job, 1): 11}, None)
    assert [(found.rank, found.pid) for found, _ in run.states] == [(0, 10)]


def test_a_stopped_rank_hangs_its_job_at_the_floor_learned_or_not():
    """A rank in state T is no phase of training (a slow start is not stopped)."""
    judge = StackWatch(floor=10.0, factor=5.0, ceiling=180.0)  # nothing learned yet
    assert judge.threshold() == 180.0
    verdict = judge.judge([still(0, BACKWARD, 0, 12), still(1, LOADER, 0, 12, stopped=True)])
    assert verdict.stalled and verdict.roots == (1,)
    fresh = StackWatch(floor=10.0, factor=5.0, ceiling=180.0)
    assert not fresh.judge([still(0, BACKWARD, 0, 12), still(1, LOADER, 0, 12)]).stalled
