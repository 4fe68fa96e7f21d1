"""`llmmon diagnose`: verdicts with their evidence, one branch of the triage tree at a time.

By default it walks the whole decision tree (docs/design.md#the-decision-tree; llmmon.diagnose:
this node's daemon, or the cluster with `--prometheus`; `--precision` ... `--network` restrict it).  Each
`Probe` here adds its own flags, gathers its own evidence and returns findings; `--<branch>`
prints those instead of the tree.  Exit status: 0 when nothing is critical or suspect, 1 when
something is, 2 when the evidence could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from llmmon.commands import incident
from llmmon.ranks import dumps, stall
from llmmon.diagnose import command as tree
from llmmon.ranks.ingest import SpoolIngest
from llmmon.ranks.ledger import Ledger
from llmmon.ranks.liveness import PidWatch
from llmmon.sources.fs import RootedFS
from llmmon_reporter.layout import DEFAULT_PIPE_DIR
from llmmon.sources.spool import SpoolSource

SEVERITIES = ("ok", "info", "warning", "critical")


class EvidenceError(Exception):
    """The evidence a branch needs could not be read (daemon down, spool missing, ...)."""


@dataclass(frozen=True)
class Finding:
    branch: str
    severity: str  # one of SEVERITIES
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)


class Probe(Protocol):
    name: str
    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> list[Finding]: ...


def fetch_json(base_url: str, path: str, timeout: float = 5.0) -> Any:
    try:
        with urllib.request.urlopen(base_url + path, timeout=timeout) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:  # a daemon answered, with an error
        raise EvidenceError(f"{base_url}{path}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EvidenceError(tree.no_daemon(base_url, exc)) from None
    except ValueError as exc:
        raise EvidenceError(f"{base_url}{path}: not JSON: {exc}") from None


class RanksProbe:
    """Distributed hang: which group is stuck, in which collective, and which rank is behind."""

    name = "ranks"
    help = "Training ranks: hung groups, the rank behind, stale or disabled reporters."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("ranks")
        group.add_argument("--spool.dir", dest="spool_dir", metavar="DIR",
                           help="Read the rank spool directly instead of asking a daemon.")
        group.add_argument("--stale-after", type=float, default=30.0, metavar="SECONDS",
                           help="With --spool.dir: a rank silent this long is down.")
        group.add_argument("--stall-after", type=float, default=180.0, metavar="SECONDS",
                           help="With --spool.dir: a group stuck this long is stalled whatever "
                           "its pace (the ceiling of the learned threshold).")
        group.add_argument("--stall-floor", type=float, default=10.0, metavar="SECONDS",
                           help="With --spool.dir: the learned threshold's floor.")
        group.add_argument("--path.procfs", dest="procfs", default="/proc", metavar="DIR",
                           help="With --spool.dir: procfs, to see the ranks' processes.")
        group.add_argument("--dump", action="store_true",
                           help="Request a Flight Recorder dump from every rank of each job "
                           "with a stalled group (through the dump pipe; run on the node).")
        group.add_argument("--pipe-dir", default=DEFAULT_PIPE_DIR,
                           help="Dump pipe directory for --dump (default: %(default)s).")

    def evidence(self, args: argparse.Namespace) -> dict[str, Any]:
        if args.spool_dir:
            source = SpoolSource(args.spool_dir, 16 << 20, 4096, 4096)
            if not source.exists():
                raise EvidenceError(f"spool directory {args.spool_dir} does not exist")
            ledger = Ledger(max_ranks=4096, max_ranks_per_job=4096)
            now = time.time()
            SpoolIngest(source, ledger, args.stale_after, float("inf"), 1 << 40).run(now)
            watch = PidWatch(RootedFS(args.procfs))
            watch.follow({(t.state.identity.job_id, t.state.identity.rank, t.pid):
                          t.state.identity.start_ticks for t in ledger.tracks.values()})
            watch.poll(now)
            return stall.evidence(ledger, now, args.stale_after, args.stall_after, watch,
                                 args.stall_floor)
        return fetch_json(args.url.rstrip("/"), "/api/v1/ranks")

    def run(self, args: argparse.Namespace) -> list[Finding]:
        evidence = self.evidence(args)
        findings: list[Finding] = []
        if not evidence.get("jobs"):
            return [Finding(self.name, "info", "no training ranks report on this node")]
        for job in evidence["jobs"]:
            end = job.get("end")
            ended = {e["rank"] for e in end["ranks"]} if end else set()
            if end:  # a rank named first took the job down: worth a look, not a hang
                findings.append(Finding(self.name, "warning" if end["first"] else "info",
                                        end["summary"], end))
            for rank in job["ranks"]:
                if rank["reporter"]["disabled"]:
                    findings.append(Finding(
                        self.name, "warning",
                        f"job {job['job_id']}, rank {rank['rank']}: reporter disabled itself: "
                        f"{rank['reporter']['disabled_reason']}", {"rank": rank}))
                elif not rank["up"] and rank["rank"] not in ended:
                    frozen = ": its process is stopped (state T: SIGSTOP or a debugger)" \
                        if rank["doing"]["stopped"] else ""
                    findings.append(Finding(
                        self.name, "warning",
                        f"job {job['job_id']}, rank {rank['rank']} (pid {rank['pid']}) stopped "
                        f"reporting {rank['report_age_seconds']:.0f} s ago{frozen}",
                        {"rank": rank}))
            verdict = job.get("verdict")  # one per job, however many groups it has
            if verdict is not None and verdict["stalled"]:
                findings.append(Finding(self.name, "critical", verdict["summary"], verdict))
            for group in job["groups"]:
                stalled = group["stalled"] and verdict is None  # a daemon without the verdict
                severity = "critical" if stalled else "ok" if group["op"] is None \
                    and not group["stalled"] else "info"
                findings.append(Finding(self.name, severity, group["summary"], group))
            slow = job.get("slowdown")
            if slow:  # a warning with its cause (TCP loss), else shown for what it is
                findings.append(Finding(self.name, "warning" if slow["cause"] else "info",
                                        slow["summary"], slow))
            if args.dump and job["stalled_groups"]:
                ranks = [r["rank"] for r in job["ranks"]]
                results = dumps.request(args.pipe_dir, job["job_id"], ranks)
                findings.append(Finding(self.name, "info",
                                        f"job {job['job_id']}: Flight Recorder dump requested: "
                                        f"{results}", {"dump": results}))
        return findings


BRANCHES: tuple[Probe, ...] = (RanksProbe(),)


def render(findings: list[Finding]) -> str:
    marks = {"ok": "ok  ", "info": "info", "warning": "WARN", "critical": "CRIT"}
    return "".join(f"[{marks[f.severity]}] {f.branch}: {f.summary}\n" for f in findings)


def run(args: argparse.Namespace) -> int:
    if args.incident:  # an incident is critical: 1 with its report, 2 without one
        if not args.prometheus and not args.node:
            args.node = [args.url]
        return 1 if incident.emit(args, args.incident, "diagnose") else 2
    selected = [b for b in BRANCHES if getattr(args, f"branch_{b.name}")]
    if not selected:
        return tree.run(args)
    findings: list[Finding] = []
    try:
        for branch in selected:
            findings.extend(branch.run(args))
    except EvidenceError as exc:
        print(f"llmmon diagnose: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump([asdict(f) for f in findings], sys.stdout, indent=1, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(findings))
    return 1 if any(f.severity == "critical" for f in findings) else 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "diagnose", help="Walk the triage tree and print each verdict with its evidence.",
        description="Walk the triage decision tree (precision, memory, input starvation, "
        "distributed hang, thermal throttling, network checklist) and print each verdict with "
        "its evidence and runbook. Instead of the tree: "
        + "; ".join(f"--{b.name}: {b.help}" for b in BRANCHES))
    parser.add_argument("--url", default="http://127.0.0.1:9476",
                        help="A running llmmon daemon (default: %(default)s).")
    parser.add_argument("--json", action="store_true",
                        help="Print the report (with --ranks: the findings) as JSON.")
    tree.add_arguments(parser)
    parser.add_argument("--incident", metavar="JOB",
                        help="Instead of the tree: the report merged from the incidents the "
                        "nodes of JOB kept (as `llmmon incident`): its nodes from --prometheus, "
                        "--node, or else the daemon at --url.")
    incident.add_node_arguments(parser)
    for branch in BRANCHES:
        parser.add_argument(f"--{branch.name}", dest=f"branch_{branch.name}",
                            action="store_true", help=branch.help)
        branch.add_arguments(parser)
    parser.set_defaults(func=run)
