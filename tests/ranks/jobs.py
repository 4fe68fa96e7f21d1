"""Runs real multi-process gloo jobs (tests/ranks/trainer.py) and the ranks collector on them.

Every process started here is killed by PID when the job's context exits; every wait is
bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from prometheus_client.parser import text_string_to_metric_families

from llmmon.collector import Context, Environment
from llmmon.collectors.ranks import RanksCollector
from llmmon.config import collector_options
from llmmon.exposition import render
from llmmon.sources.fs import RootedFS
from tests.conftest import pythonpath
from tests.helpers import free_port, wait_for

TRAINER = Path(__file__).with_name("trainer.py")
FAST = {"LLMMON_STATUS_INTERVAL": "0.1", "LLMMON_INFLIGHT_INTERVAL": "0.3",
        "LLMMON_ENTRIES_INTERVAL": "0.3"}


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMON_", "TORCH_"))}
    env["PYTHONPATH"] = pythonpath()
    env.update(FAST)
    env.update(extra)
    return env


@dataclass
class Job:
    """`world` trainer processes; use as a context manager so they are always killed."""

    tmp: Path
    world: int
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    rank_env: dict[int, dict[str, str]] = field(default_factory=dict)  # a rank's own additions
    script: Path = TRAINER
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def out(self) -> Path:
        return self.tmp / "out"

    def __enter__(self) -> Job:
        self.out.mkdir(parents=True, exist_ok=True)
        port = free_port()
        for rank in range(self.world):
            log = open(self.tmp / f"rank_{rank}.log", "wb")
            self.procs.append(subprocess.Popen(
                [sys.executable, str(self.script), "--rank", str(rank), "--world", str(self.world),
                 "--port", str(port), "--out", str(self.out), *self.args],
                env={**self.env, **self.rank_env.get(rank, {})}, stdout=log,
                stderr=subprocess.STDOUT, cwd=self.tmp))
            log.close()
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait(timeout=30)

    def logs(self) -> str:
        return "\n".join((self.tmp / f"rank_{r}.log").read_text(errors="replace")[-3000:]
                         for r in range(self.world))

    def wait(self, timeout: float = 120.0) -> None:
        """All ranks exit 0 within `timeout`."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"job did not finish in {timeout} s\n{self.logs()}")
        codes = [p.returncode for p in self.procs]
        assert codes == [0] * self.world, f"exit codes {codes}\n{self.logs()}"

    def result(self, rank: int, timeout: float = 120.0) -> dict[str, Any]:
        path = self.out / f"rank_{rank}.json"
        try:
            wait_for(lambda: path.exists() or None, timeout, f"rank {rank} result")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None
        return json.loads(path.read_text())


def ranks_config(**overrides: Any) -> dict[str, Any]:
    """The ranks collector's configuration: option defaults, then `overrides` (parsed)."""
    options = {o.key: o for o in collector_options(RanksCollector)}
    config = {key: option.parse(option.default) for key, option in options.items()}
    config.update({key: options[key].parse(value) for key, value in overrides.items()})
    return config


def make_collector(spool: Path, tmp: Path, **overrides: Any) -> RanksCollector:
    """A ranks collector on `spool` and the real procfs.  It follows the spool's ranks only
    (`discover` off) unless told: every simulated node of these tests shares this machine's
    PID namespace, so a rank that plays one on another node (`--culprit-unwatched`) would be
    found here; discovery is tested in namespaces of its own (tests/slow/ranks/
    test_outside_job.py)."""
    overrides = {"fr_dir": str(tmp / "fr"), "pipe_dir": str(tmp / "pipe"), "discover": False,
                 **overrides}
    return RanksCollector(Environment(RootedFS("/sys"), RootedFS("/proc")),
                          ranks_config(spool_dir=str(spool), **overrides))


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(collector: RanksCollector, now: float | None = None) -> tuple[Samples, Context, str]:
    """One collector run through the real renderer and Prometheus' own text parser."""
    ctx = Context()
    families = collector.collect_at(ctx, time.time() if now is None else now)
    text = render(families)[0].decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, ctx, text


def series(samples: Samples, name: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return {key: value for (n, key), value in samples.items()
            if n == name and want <= set(key)}


def by_rank(samples: Samples, name: str, **labels: str) -> dict[int, float]:
    return {int(dict(key)["rank"]): value for key, value in series(samples, name,
                                                                   **labels).items()}


def job_doc(collector: RanksCollector, job_id: str | None = None) -> dict[str, Any] | None:
    """One collector run, then the job's document of the hang evidence (the only job, or
    `job_id`)."""
    scrape(collector)
    jobs = collector.evidence()["jobs"]
    return next((j for j in jobs if job_id is None or j["job_id"] == job_id), None)


def group_doc(collector: RanksCollector, job_id: str | None = None, pg: str = "0"
              ) -> dict[str, Any] | None:
    """One collector run, then group `pg` of the job's document (`job_doc`)."""
    job = job_doc(collector, job_id)
    return None if job is None else next((g for g in job["groups"] if g["pg"] == pg), None)


def looks(collector: RanksCollector, job: Job) -> str:
    """How the job last looked, for a timeout's message: each group's verdict, each rank's
    report age and reporter health, and the end of every rank's log."""
    scrape(collector)
    lines = []
    for doc in collector.evidence()["jobs"]:
        lines += [f"pg {g['pg']}: stalled={g['stalled']} waiting={g['waiting']} "
                  f"behind={g['behind']} stale={g['stale']} {g['summary']}"
                  for g in doc["groups"]]
        lines += [f"rank {r['rank']}: age={r['report_age_seconds']} s alive={r['alive']} "
                  f"reporter={r['reporter']} groups={r['groups']}" for r in doc["ranks"]]
    return "\n".join(lines or ["no job in the spool"]) + "\n" + job.logs()


def reporting(collector: RanksCollector, ranks: int, progressed: int = 20
              ) -> Callable[[], dict[str, Any] | None]:
    """A probe: every rank reports and group 0 has completed `progressed` collectives."""
    def probe() -> dict[str, Any] | None:
        job = job_doc(collector)
        if job is None or len(job["ranks"]) < ranks:
            return None
        done = [r["groups"].get("0", {}).get("completed", -1) for r in job["ranks"]]
        return job if min(done) >= progressed else None
    return probe


@contextmanager
def watched_collector(tmp: Path, **overrides: Any) -> Iterator[tuple[Path, RanksCollector]]:
    """A spool and a collector on it with its procfs watcher running (closed after)."""
    spool = tmp / "spool"
    spool.mkdir()
    collector = make_collector(spool, tmp, **overrides)
    collector.start()
    try:
        yield spool, collector
    finally:
        collector.close()
