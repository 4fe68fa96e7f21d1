"""Incidents: once a job stalls or a rank of it ends abnormally, keep its evidence on the node.

Reads the ranks collector's verdict each run (the daemon's assembly hands it over: collectors
do not import each other) and the sampler's digests of the GPU and network collectors, and
has `llmmon.incidents.recorder` write one directory per incident. The server process serves
them from disk (/api/v1/incidents, /incidents), so they stay readable when the collector
process, Prometheus or Grafana are down.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable

from prometheus_client.core import Metric

from llmmon.collector import Collector, Context, Environment
from llmmon.incidents import layout
from llmmon.incidents.recorder import Limits, Recorder, Sources
from llmmon.metrics import Families, MetricSpec
from llmmon.options import Option
from llmmon.ranks import stall

WRITTEN = MetricSpec("llmmon_incidents_written_total", "counter",
                     "Incident directories written, by what opened them (stalled: a process "
                     "group or the job's stacks stalled; waiting: ranks here wait past the "
                     "job's learned threshold for a rank on another node; ended: a rank ended "
                     "abnormally).",
                     ("trigger",))
FAILED = MetricSpec("llmmon_incidents_failed_total", "counter",
                    "Incidents that could not be written (see the log: a full disk, no "
                    "permission on --collector.incidents.dir).")
WITHDRAWN = MetricSpec(
    "llmmon_incidents_withdrawn_total", "counter",
    "Waiting incidents removed because their job completed again: its ranks here only waited "
    "for a busy rank on another node (a checkpoint), which was no hang.")
KEPT = MetricSpec("llmmon_incidents_kept", "gauge", "Incident directories kept on this node.")
BYTES = MetricSpec("llmmon_incidents_bytes", "gauge", "Bytes of the incidents kept.")
JOB_INCIDENT = MetricSpec(
    "llmmon_job_incident_info", "info",
    "A job's newest incident kept on this node: the page's incident_url is "
    "<this node's exporter>/incidents/<incident>.", ("job_id", "incident"))


class IncidentsCollector(Collector):
    name = "incidents"
    description = ("Incident directories: a stalled or abnormally ended job's evidence (its "
                   "ranks, stacks, Flight Recorder dumps, GPU and network counters, kernel "
                   "log), written once per incident; at /api/v1/incidents and /incidents.")
    specs = (WRITTEN, FAILED, WITHDRAWN, KEPT, BYTES, JOB_INCIDENT)
    options = (
        Option("dir", "str", layout.DEFAULT_DIR,
               "Where incidents are written, one directory each (mode 0750: the daemon's "
               "user and group read them).", metavar="DIR"),
        Option("max_bytes", "int", 64 << 20,
               "Bytes one incident may hold; files beyond it are left out and listed in its "
               "summary (Flight Recorder dumps of the culprit first).", metavar="BYTES",
               minimum=1 << 20, maximum=1 << 34),
        Option("max_total_bytes", "int", 1 << 30,
               "Bytes all incidents may hold; the oldest are removed.", metavar="BYTES",
               minimum=1 << 20, maximum=1 << 40),
        Option("keep", "int", 32, "Incidents kept on the node; the oldest are removed.",
               minimum=1, maximum=10_000),
        Option("kmsg_path", "str", "/dev/kmsg",
               "The kernel log an incident takes its lines from (CAP_SYSLOG).",
               metavar="PATH"),
        Option("node", "str", "",
               "The node's name in the incidents; empty: $NODE_NAME, else the host name.",
               metavar="NAME"),
    )
    interval = 2.0
    timeout = 1.5

    def __init__(self, env: Environment, config: dict[str, Any]) -> None:
        super().__init__(env, config)
        self.recorder: Recorder | None = None
        self._evidence: Callable[[], stall.Evidence] | None = None
        self._digests: Callable[[], list[Any]] = list

    def attach(self, evidence: Callable[[], stall.Evidence], fr_dir: str, pipe_dir: str,
               digests: Callable[[], list[Any]]) -> None:
        """Follow the ranks collector's verdicts, its dump pipes and dump directory, and the
        sampler's digests (the GPU and network series)."""
        config = self.config
        node = config["node"] or os.environ.get("NODE_NAME") or os.uname().nodename
        self.recorder = Recorder(
            config["dir"], Limits(config["max_bytes"], config["max_total_bytes"],
                                  config["keep"]),
            Sources(self.env.procfs, fr_dir, pipe_dir, config["kmsg_path"], node))
        self._evidence = evidence
        self._digests = digests
        self.recorder.prune()

    def collect(self, ctx: Context) -> Iterable[Metric]:
        families = Families()
        recorder = self.recorder
        if recorder is None or self._evidence is None:
            ctx.watching(0, "jobs (the ranks collector is disabled: nothing to judge)")
            return families
        recorder.ring.offer(time.time(), self._digests())
        evidence = self._evidence()
        recorder.observe(evidence)
        ctx.watching(len(evidence.jobs), "jobs")
        # Only what there is to count: a node that never kept an incident adds no series (the
        # budget node's 2,000 has no room for seven zeros); a counter appears at its first one.
        written = recorder.snapshot()
        for trigger, count in sorted(written.by_trigger.items()):
            if count:
                families.add(WRITTEN, [trigger], count)
        if written.failed:
            families.add(FAILED, [], written.failed)
        if written.withdrawn:
            families.add(WITHDRAWN, [], written.withdrawn)
        if written.kept:
            families.add(KEPT, [], written.kept)
            families.add(BYTES, [], written.bytes)
        for job_id, incident in sorted(written.newest.items()):
            families.add(JOB_INCIDENT, [job_id, incident], 1)
        return families

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.wait(5.0)
