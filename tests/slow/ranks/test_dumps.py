"""A dump request brings the stack of a rank that still makes progress: a real two-rank gloo
job under `llmmon launch`'s environment."""

from __future__ import annotations

from pathlib import Path

from llmmon.commands.launch import environment
from llmmon.ranks.dumps import request
from tests.helpers import wait_for
from tests.ranks.jobs import Job, base_env, job_doc, make_collector, reporting


def test_a_dump_request_brings_the_stack_of_a_rank_that_still_makes_progress(
        tmp_path: Path) -> None:
    """A rank whose peers on another node wait still completes its own collectives, so its
    reporter takes no stack by itself; the daemon's dump request asks for it."""
    spool, fr_dir, pipe_dir = tmp_path / "spool", tmp_path / "fr", tmp_path / "pipe"
    spool.mkdir()
    env = environment(base_env(), "busy", str(spool), str(fr_dir), str(pipe_dir), 2000,
                      timing=False, dump_on_timeout=False)
    env["PYTHONPATH"] = base_env()["PYTHONPATH"]
    for directory in (fr_dir / "busy", pipe_dir / "busy"):
        directory.mkdir(parents=True)
    collector = make_collector(spool, tmp_path, auto_dump="false")
    args = ["--steps", "100000", "--compute", "0.01", "--hold", "300", "--timeout", "300"]
    with Job(tmp_path, 2, args, env):
        wait_for(reporting(collector, 2), 240, "two ranks making progress")

        def rank0() -> dict:
            doc = job_doc(collector)
            assert doc is not None
            return next(r for r in doc["ranks"] if r["rank"] == 0)
        wait_for(lambda: rank0()["stack"] is None or None, 60, "a tick without a stack")
        assert request(str(pipe_dir), "busy", [0]) == {0: "requested"}
        # The reporter writes the state, then the dump, in the tick that read the request: the
        # state seen as the dump appears (a tick lasts a second) is that tick's.
        wait_for(lambda: list((fr_dir / "busy").glob("*")) or None, 60, "rank 0's dump",
                 interval=0.02)
        stack = rank0()["stack"]
    assert stack and any(frame["file"].endswith("trainer.py") and frame["function"] == "main"
                         for frame in stack), stack
