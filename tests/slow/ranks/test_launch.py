"""`llmmon launch`: the environment it sets; a real torchrun job reporting with no code change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmmon.commands.launch import BOOT_DIR, environment, resolve_job
from llmmon_reporter.identity import rendezvous_job
from tests.conftest import ROOT, pythonpath
from tests.ranks.jobs import FAST, TRAINER, base_env


def env_for(**given: str) -> dict[str, str]:
    return environment(given, "job-1", "/spool", "/fr", "/pipe", 2000, timing=False,
                       dump_on_timeout=True)


def test_both_flight_recorder_names_dumps_and_pipes_are_exported() -> None:
    env = env_for(PYTHONPATH="/user/lib")
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == \
        "/fr/job-1/rank_"
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/pipe/job-1/rank_"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert "TORCH_NCCL_ENABLE_TIMING" not in env  # opt-in: it has a cost
    assert (env["LLMMON_JOB"], env["LLMMON_SPOOL"]) == ("job-1", "/spool")
    assert env["PYTHONPATH"].split(os.pathsep) == [BOOT_DIR, "/user/lib"]
    timed = environment({}, "j", "/s", "/f", "/p", 2000, timing=True, dump_on_timeout=False)
    assert (timed["TORCH_NCCL_ENABLE_TIMING"], timed["TORCH_NCCL_DUMP_ON_TIMEOUT"]) == ("1", "0")


def test_what_the_user_set_is_kept_and_mirrored_to_the_other_name() -> None:
    env = env_for(TORCH_NCCL_TRACE_BUFFER_SIZE="20000", TORCH_FR_DUMP_TEMP_FILE="/mine/fr_",
                  TORCH_NCCL_DUMP_ON_TIMEOUT="0")
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "20000"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/mine/fr_"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"


def test_nccl_log_is_pointed_at_the_dump_directory_only_where_nccl_would_print_nothing() -> None:
    env = env_for()
    assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"]) == ("INFO", "INIT,ENV")
    assert env["NCCL_DEBUG_FILE"] == "/fr/job-1/nccl.%h.%p.log"
    for own in ({"NCCL_DEBUG": "WARN"}, {"NCCL_DEBUG_FILE": "/mine/nccl.log"}):
        kept = env_for(**own)
        assert {k: kept.get(k) for k in own} == own
        other = ({"NCCL_DEBUG", "NCCL_DEBUG_FILE"} - set(own)).pop()
        assert other not in kept and "NCCL_DEBUG_SUBSYS" not in kept
    assert "NCCL_DEBUG" not in environment({}, "j", "/s", "/f", "/p", 2000, timing=False,
                                           dump_on_timeout=True, nccl_log=False)


@pytest.mark.parametrize("given, env, command, expected", [
    ("cli", {"LLMMON_JOB": "env"}, [], "cli"),
    (None, {"LLMMON_JOB": "env", "TORCHELASTIC_RUN_ID": "te"}, [], "env"),
    (None, {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "4242"}, [], "4242"),
    (None, {}, ["torchrun", "--rdzv-id=abc", "t.py"], "abc"),
    (None, {}, ["torchrun", "--rdzv_endpoint", "h:29500", "t.py"], rendezvous_job("h:29500")),
    (None, {}, ["torchrun", "--master-addr", "h", "--master-port", "1", "t.py"],
     rendezvous_job("h:1")),
])
def test_job_id_precedence(given: str | None, env: dict, command: list, expected: str) -> None:
    assert resolve_job(given, env, command) == expected


def python_threads(env: dict[str, str]) -> list[str]:
    code = "import threading, time; time.sleep(0.2); print([t.name for t in threading.enumerate()])"
    return eval(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                               text=True, timeout=60, check=True).stdout)


def test_sitecustomize_starts_the_reporter_only_in_ranks_and_chains_the_shadowed_one(
        tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        f"open({str(tmp_path / 'chained')!r}, 'a').write('x')\n")
    env = base_env(PYTHONPATH=os.pathsep.join([BOOT_DIR, str(other), pythonpath()]),
                   LLMMON_SPOOL=str(tmp_path))
    assert "llmmon-reporter" not in python_threads(env)  # torchrun's own process: no RANK
    assert "llmmon-reporter" in python_threads({**env, "RANK": "0"})
    assert "llmmon-reporter" not in python_threads({**env, "RANK": "0", "LLMMON_REPORTER": "0"})
    # a worker spawned by a reporting rank inherits the marker and stays quiet
    assert "llmmon-reporter" not in python_threads({**env, "RANK": "0",
                                                    "LLMMON_REPORTER_PID": "1"})
    assert (tmp_path / "chained").read_text() == "xxxx"


def test_a_torchrun_job_reports_with_no_code_change(tmp_path: Path) -> None:
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    out.mkdir()
    env = base_env()
    env.pop("PYTHONPATH")
    command = [sys.executable, "-m", "llmmon", "launch", "--job", "llama-70b", "--spool",
               str(spool), "--fr-dir", str(tmp_path / "fr"), "--pipe-dir", str(tmp_path / "pipe"),
               "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(TRAINER), "--reporter", "auto", "--out", str(out),
               "--steps", "10"]
    done = subprocess.run(command, env={**env, **FAST}, cwd=ROOT, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = [json.loads((out / f"rank_{r}.json").read_text()) for r in (0, 1)]
    for result in results:
        seen = result["env"]
        assert seen["LLMMON_JOB"] == "llama-70b" and seen["LLMMON_SPOOL"] == str(spool)
        assert seen["TORCH_FR_BUFFER_SIZE"] == seen["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
        assert seen["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == f"{tmp_path}/pipe/llama-70b/rank_"
        assert seen["LLMMON_REPORTER_PID"] == str(result["pid"])  # started in the rank itself
        assert result["health"]["running"] and result["health"]["errors_total"] == 0, result
    states = sorted(p.name for p in (spool / "llama-70b").glob("rank_*.json")
                    if not p.name.endswith(".entries.json"))
    assert states == [f"rank_{r['rank']}.{r['pid']}.json" for r in results]  # no agent file
    assert (tmp_path / "fr" / "llama-70b").is_dir() and (tmp_path / "pipe" / "llama-70b").is_dir()
