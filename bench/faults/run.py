"""Fault-injection benchmark: which rank hung or slowed, why, and how fast each source said so.

    PYTHONPATH=exporter:reporter python -m bench.faults.run    # every class, 30-minute healthy run
    PYTHONPATH=exporter:reporter python -m bench.faults.run --classes loader,sigstop --healthy 120
    PYTHONPATH=exporter:reporter python -m bench.faults.run --classes mesh  # the mesh jobs' classes

Runs real torchrun/gloo jobs under `llmmon launch` over two simulated nodes (bench/faults/
cluster.py), injects one fault per job after a healthy warm-up (bench/faults/trainer.py) and
watches the daemons' /api/v1/ranks, `llmmon diagnose` and Alertmanager's notifications
(bench/faults/watch.py).  Prints a table per class, writes bench/results/faults.json and, with
--write-result, the dated result docs/benchmarks/<date>-faults.md (bench/common.py).  Latencies
count from the fault's onset.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench.common import write_result
from bench.faults import watch
from bench.faults.classes import MESH, FaultClass, Sighting, classes
from bench.faults.cluster import CHECKOUT, NODES, Cluster, Job, pythonpath, remove_namespaces

POLL = 3.0  # seconds between looks at the API and the pages
DIAGNOSE_EVERY = 2  # polls between diagnose runs (each costs a few requests per node)
START_TIMEOUT = 600.0  # a loaded 2-core machine takes minutes to start four torch ranks
ONSET_TIMEOUT = 60.0
RESULTS = CHECKOUT / "bench" / "results" / "faults.json"
SOURCES = ("api", "diagnose", "page")


@dataclass
class Run:
    """One class's job and what was seen of it."""

    fault: FaultClass
    job: Job
    phase: str = "starting"  # starting, warm, injected, done
    started: float = field(default_factory=time.time)
    warm_since: float | None = None
    onset: float | None = None
    go_at: float | None = None
    error: str = ""
    sources: dict[str, Sighting] = field(
        default_factory=lambda: {k: Sighting() for k in SOURCES})
    pages: int = 0
    tickets: list[str] = field(default_factory=list)
    job_ended_at: float | None = None
    shaped: str = ""  # the qdisc that degraded the link, for the network class
    incidents: dict[str, dict[str, Any]] = field(default_factory=dict)  # node -> its first

    def observe_incidents(self, found: dict[str, list[dict[str, Any]]]) -> None:
        """Each node's first incident of this job since the onset, and what it cost."""
        for node, summaries in found.items():
            for summary in summaries:
                if node in self.incidents or summary.get("job_id") != self.job.monitored_id \
                        or self.onset is None or summary.get("completed", 0) < self.started:
                    continue
                self.incidents[node] = {
                    "complete_after_s": round(summary["completed"] - self.onset, 1),
                    "declared_after_s": round(summary["declared"] - self.onset, 1),
                    "bytes": summary.get("bytes"), "trigger": summary.get("trigger"),
                    "culprit": summary.get("culprit", {}).get("ranks"),
                    "cause": summary.get("culprit", {}).get("cause"),
                    "dumps": summary.get("dumps"), "capture": summary.get("capture"),
                    "id": summary.get("id")}

    def incident_nodes(self) -> list[str]:
        """The nodes that keep an incident of the fault: every node of a hung job; of a job
        that ended, the culprit's (rank 3: node-b), whose rank ended abnormally (the others'
        were torn down, as a preemption would be)."""
        if not self.fault.pages:
            return [NODES[-1]]
        return [name for name, count in zip(NODES, self.fault.nproc) if count]

    def up_ranks(self, ranks: dict[str, dict[str, Any]]) -> int:
        """Ranks that report and (with a warm-up) have stepped: the warm-up counts from the first
        steps; a class without one is watched from the first report (slow-start's long step 0).
        Without the reporter the daemons know no steps: the ranks' own count says."""
        stepped = self.job.steps()
        return sum(1 for rank in job_ranks(ranks, self.job.monitored_id)
                   if rank.get("up") and (rank.get("steps") or stepped.get(rank["rank"])
                                          or not self.fault.warmup))

    def finished(self, now: float, needed: tuple[str, ...]) -> bool:
        """The window is over, or every `needed` source named the culprit and the cause."""
        if self.onset is None:
            return False
        if now - self.onset >= self.fault.window:
            return True
        if self.fault.incident and not set(self.incident_nodes()) <= set(self.incidents):
            return False
        return not self.fault.must_not_page and all(
            self.sources[k].named_at is not None and self.sources[k].cause_at is not None
            for k in needed)

    def result(self) -> dict[str, Any]:
        seen = self.sources
        named = [s for s in seen.values() if s.named_at is not None]
        wrong = set().union(*(s.blamed_wrong for s in seen.values()))
        false_pages = self.pages if self.fault.must_not_page else (
            self.pages if wrong & seen["page"].blamed_wrong else 0)
        return {
            "class": self.fault.name,
            "notes": self.fault.notes + (f" (used: {self.shaped})" if self.shaped else ""),
            "job_id": self.job.job_id, "monitored_id": self.job.monitored_id,
            "culprit": self.fault.culprit,
            "must_not_page": self.fault.must_not_page, "window_s": self.fault.window,
            "error": self.error,
            "detected": None if self.fault.must_not_page else bool(named),
            "culprit_right": None if self.fault.must_not_page else bool(named) and not wrong,
            "cause_right": None if self.fault.must_not_page else any(
                s.cause_at is not None for s in seen.values()),
            "false_pages": false_pages, "blamed_wrong": sorted(wrong),
            "tickets": sorted(set(self.tickets)),
            "job_ended_after_s": None if self.job_ended_at is None or self.onset is None
            else round(self.job_ended_at - self.onset, 1),
            "sources": {k: s.as_json() for k, s in seen.items()},
            "incidents": self.incidents,
            "incident_every_node_s": max(
                (i["complete_after_s"] for i in self.incidents.values()), default=None)
            if set(self.incident_nodes()) <= set(self.incidents) else None,
        }


GO_AHEAD = 100  # steps past the count the API shows (it lags the ranks by a few seconds)


def trainer_args(fault: FaultClass, spare: float) -> list[str]:
    """The trainer's arguments for `fault`, running `spare` s past its window.  A class with
    no culprit still names one rank, the last: it writes the onset file when the fault that
    touches every rank (starved, loader-all) begins."""
    culprit = fault.world - 1 if fault.culprit is None else fault.culprit
    return ["--fault", fault.fault, "--culprit", str(culprit),
            "--duration", str(fault.warmup + fault.window + spare), *fault.trainer_args]


def _go(run: Run, now: float, ranks: dict[str, dict[str, Any]]) -> None:
    """Ask for the fault at a step every rank is yet to reach (written atomically)."""
    fault = run.fault
    if fault.qdiscs:
        run.shaped = run.job.degrade(fault.qdiscs)
        run.onset = now
    steps = [rank.get("steps") or 0 for rank in job_ranks(ranks, run.job.monitored_id)]
    steps += run.job.steps().values()
    temporary = run.job.ctl / ".go"
    temporary.write_text(str(max(steps, default=0) + GO_AHEAD))
    temporary.rename(run.job.ctl / "go")
    run.go_at = now


def _step(run: Run, now: float, ranks: dict[str, dict[str, Any]],
          diagnosed: dict[str, list[str]], notes: list[Any], needed: tuple[str, ...],
          incidents: dict[str, list[dict[str, Any]]]) -> None:
    fault = run.fault
    if run.phase == "starting":
        if run.up_ranks(ranks) >= fault.world:
            run.phase, run.warm_since = "warm", now
        elif now - run.started > START_TIMEOUT or run.job.ended():
            run.error, run.phase = "the job did not start", "done"
        return
    if run.phase == "warm" and now - (run.warm_since or now) >= fault.warmup:
        _go(run, now, ranks)
        run.phase = "injected"
    if run.phase != "injected":
        return
    if run.onset is None:
        culprit_onset = run.job.onset()
        no_onset_file = fault.fault in ("none", "fp16")
        if culprit_onset is not None or no_onset_file:
            run.onset = culprit_onset or run.go_at
        elif now - (run.go_at or now) > ONSET_TIMEOUT:
            run.error, run.phase = "the fault was never injected", "done"
        return
    if run.job_ended_at is None and run.job.ended():
        run.job_ended_at = now
    run.observe_incidents(incidents)
    t = round(now - run.onset, 1)
    world, job_id = fault.world, run.job.monitored_id
    text, blamed = watch.api(ranks, job_id, world)
    run.sources["api"].observe(t, text, blamed, fault, job_id)
    if diagnosed:
        text, blamed = watch.diagnose(diagnosed, job_id, world)
        run.sources["diagnose"].observe(t, text, blamed, fault, job_id)
    text, blamed, count = watch.pages(notes, job_id, ("pager",))
    run.pages = count
    tickets, ticket_blamed, _ = watch.pages(notes, job_id, ("tickets",))
    run.tickets = [line.split(":")[0] for line in tickets.splitlines()]
    # The notification column: pages, and tickets for the classes whose alert is a warning.
    run.sources["page"].observe(t, "\n".join(filter(None, (text, tickets))),
                                blamed | ticket_blamed, fault, job_id)
    if run.finished(now, (*needed, "page") if fault.needs_page else needed):
        run.phase = "done"


def merged_report(cluster: Cluster, run: Run) -> dict[str, Any] | None:
    """`llmmon incident` over the job's nodes (found through Prometheus, as an SRE would), and
    whether it names the culprit and the cause the page names."""
    if not run.incidents:
        return None
    where = (["--prometheus", cluster.prometheus] if cluster.alerting
             else [arg for n in cluster.nodes for arg in ("--node", n.url)])
    done = subprocess.run([sys.executable, "-m", "llmmon", "incident", run.job.monitored_id,
                           *where, "--json"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": pythonpath()})
    try:
        report = json.loads(done.stdout)
    except ValueError:
        return {"error": (done.stderr or done.stdout)[-300:]}
    culprit = report.get("culprit") or {}
    fault, named = run.fault, set(culprit.get("ranks") or [])
    right = fault.culprit is not None and fault.culprit in named \
        and named <= {fault.culprit, *fault.also}
    said = " ".join([culprit.get("text") or "", *(f.get("text", "") for f in
                                                   (report.get("fr") or {}).get("findings", []))])
    # the page's verdict; a job's end pages nobody, so there the API's
    said_by = run.sources["page" if fault.pages else "api"]
    return {"ranks": sorted(named), "cause": culprit.get("cause"), "agreed": culprit.get("agreed"),
            "nodes": [n.get("node") for n in report.get("nodes", [])],
            "culprit_right": right, "cause_right": bool(fault.cause_re.search(said)),
            "same_as_page": right and said_by.named_at is not None
            and said_by.cause_at is not None and bool(fault.cause_re.search(said)),
            "text": (culprit.get("text") or "")[:300]}


def job_ranks(ranks: dict[str, dict[str, Any]], job_id: str) -> list[dict[str, Any]]:
    """The job's ranks in the daemons' /api/v1/ranks answers."""
    return [rank for answer in ranks.values() for job in answer.get("jobs", [])
            if job.get("job_id") == job_id for rank in job.get("ranks", [])]


def bench(selected: list[FaultClass], parallel: int, work: Path,
          needed: tuple[str, ...] = SOURCES, names: tuple[str, ...] = NODES,
          alerting: bool = True, prefix: str = "faults", poll: float = POLL,
          done: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
          reporter: bool = True) -> list[dict[str, Any]]:
    """Run `selected`: background classes all at once, the others `parallel` at a time; a
    class ends when its window does, or once every `needed` source named culprit and cause.
    One of `names` is one local node, and without `alerting` no Prometheus or Alertmanager
    runs (the H200 variant).  Without `reporter` the jobs are plain torchrun from a venv that
    holds torch only.  `done(result, ranks)` reports each class as it ends (default: its
    table row)."""
    results: list[dict[str, Any]] = []
    queue = sorted(selected, key=lambda c: not c.background)
    active: list[Run] = []
    index = 0
    with Cluster(work, names=names, alerting=alerting, reporter=reporter) as cluster:
        print(f"daemons {[n.url for n in cluster.nodes]}, prometheus "
              f"{cluster.prometheus if cluster.alerting else '-'}", flush=True)
        polls = 0
        try:
            while queue or active:
                while queue and (queue[0].background or
                                 sum(not r.fault.background for r in active) < parallel):
                    fault = queue.pop(0)
                    index += 1
                    job = Job(cluster, f"{prefix}-{index}-{fault.name}", index, fault.nproc,
                              trainer_args(fault, 600))
                    run = Run(fault, job)
                    try:
                        job.__enter__()
                    except Exception as exc:  # noqa: BLE001 (one class failing ends only it)
                        run.error, run.phase = f"start: {exc}", "done"
                    active.append(run)
                    print(f"started {job.job_id}", flush=True)
                now = time.time()
                ranks = cluster.ranks()
                diagnosed = ({n.name: watch.diagnose_text(n.url) for n in cluster.nodes}
                             if polls % DIAGNOSE_EVERY == 0 else {})
                notes = cluster.receiver.snapshot() if cluster.receiver else []
                incidents = cluster.incidents()
                for run in list(active):
                    try:
                        _step(run, now, ranks, diagnosed, notes, needed, incidents)
                    except Exception as exc:  # noqa: BLE001 (one class failing ends only it)
                        run.error, run.phase = f"{type(exc).__name__}: {exc}"[:300], "done"
                    if run.phase == "done":
                        run.job.__exit__()
                        active.remove(run)
                        results.append(run.result())
                        kept = {i["id"] for found in cluster.incidents().values()
                                for i in found}
                        results[-1]["withdrawn"] = sorted(
                            node for node, i in run.incidents.items() if i["id"] not in kept)
                        if run.fault.incident:
                            try:
                                results[-1]["merged"] = merged_report(cluster, run)
                            except (OSError, subprocess.SubprocessError) as exc:
                                results[-1]["merged"] = {"error": str(exc)[:300]}
                        if done is None:
                            print(row(results[-1]), flush=True)
                        else:
                            done(results[-1], ranks)
                polls += 1
                time.sleep(max(0.0, poll - (time.time() - now)))
        except KeyboardInterrupt:  # stop, clean up, and still report what was measured
            print("interrupted", flush=True)
        finally:
            for run in active:
                run.job.__exit__()
                run.error = run.error or "interrupted"
                results.append(run.result())
            if not cluster.local:
                remove_namespaces()
    return results


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _yn(value: bool | None) -> str:
    return "n/a" if value is None else "y" if value else "**n**"


HEADER = ("| class | detected | culprit right | cause right | API s (named/cause) | "
          "diagnose s | page s | page names pod + node | ranks wrongly blamed | false pages | "
          "tickets |\n|---|---|---|---|---|---|---|---|---|---|---|")


UNPAGED = {c.name for c in classes(0.0) if not c.pages}  # a job's end: nobody is paged


def names_where(r: dict[str, Any]) -> bool | None:
    """Whether the notification that named the culprit also names its pod and node (node-b)."""
    page = r["sources"]["page"]
    if r["culprit"] is None or r["class"] in UNPAGED:
        return None
    culprit_node = NODES[-1]  # the culprit, rank 3, is node-b's
    return page["named_at"] is not None and f"{r['job_id']}-{culprit_node}" in page["said"] \
        and f"node {culprit_node}" in page["said"]


def row(r: dict[str, Any]) -> str:
    src = r["sources"]
    cells = [f"{_s(src[k]['named_at'])}/{_s(src[k]['cause_at'])}" for k in SOURCES]
    name = r["class"] + (f" ({r['error']})" if r["error"] else "")
    return (f"| {name} | {_yn(r['detected'])} | {_yn(r['culprit_right'])} | "
            f"{_yn(r['cause_right'])} | {' | '.join(cells)} | {_yn(names_where(r))} | "
            f"{', '.join(f'rank {n}' for n in r['blamed_wrong']) or '–'} | {r['false_pages']} | "
            f"{', '.join(r['tickets']) or '–'} |")


def said(results: list[dict[str, Any]]) -> str:
    """What each source first said, per class (first lines only)."""
    out = []
    for r in results:
        out.append(f"**{r['class']}** ({r['notes']}; job ended "
                   f"{_s(r['job_ended_after_s'])} s after onset)")
        for key, source in r["sources"].items():
            lines = source["said"].splitlines()[:3] or ["(nothing)"]
            out.append(f"- {key}: " + " / ".join(f"`{line[:220]}`" for line in lines))
        out.append("")
    return "\n".join(out)


def measured(metas: list[dict[str, Any]]) -> str:
    """How each run of the table was made; a class of a later run replaces the earlier one's."""
    runs = [f"{m['finished']} on {m['machine']}, `--parallel {m['parallel']}`"
            + (f", healthy run {m['healthy_s']:.0f} s" if "healthy" in m["classes"] else "")
            + f", classes `{','.join(m['classes'])}`"
            + (f", jobs: {m['mode']}" if m.get("mode", "reporter") != "reporter" else "")
            + (f", warm-up {m['warmup_s']:.0f} s" if m.get("warmup_s") is not None else "")
            for m in metas]
    if len(runs) == 1:
        return f"Measured {runs[0]}."
    return ("Measured " + "; then ".join(runs)
            + ". A class of a later run replaces the earlier run's row.")


INCIDENT_HEADER = ("| class | incident on every node, s after onset | per node: trigger, complete s, "
                   "KB, culprit, capture CPU s | `llmmon incident`: culprit | same culprit and "
                   "cause as the page (the API's, for a job's end) | false incidents |"
                   "\n|---|---|---|---|---|---|")


def incident_row(r: dict[str, Any]) -> str:
    """The class's incidents: when every node of the job had one, and each node's."""
    nodes = "; ".join(
        f"{node}: {i['trigger']}, {i['complete_after_s']:.0f} s, {(i['bytes'] or 0) / 1e3:.0f} KB, "
        f"{', '.join(map(str, i['culprit'] or [])) or '–'} ({i['cause'] or '–'}), "
        f"{(i.get('capture') or {}).get('cpu_seconds', 0):.3f}"
        for node, i in sorted(r.get("incidents", {}).items())) or "–"
    withdrawn = len(r.get("withdrawn", []))  # waiting incidents whose job completed again
    false = len(r.get("incidents", {})) - withdrawn if r["must_not_page"] else 0
    merged = r.get("merged") or {}
    said = merged.get("error") or (
        f"{', '.join(map(str, merged['ranks'])) or '–'} ({merged.get('cause') or '–'})"
        if merged else "–")
    same = _yn(merged.get("same_as_page")) if "same_as_page" in merged else "–"
    return (f"| {r['class']} | {_s(r.get('incident_every_node_s'))} | {nodes} | {said} | "
            f"{same} | {false}" + (f" ({withdrawn} withdrawn)" if withdrawn else "") + " |")


def write_doc(results: list[dict[str, Any]], metas: list[dict[str, Any]]) -> Path:
    """docs/benchmarks/<date>-faults.md: how the runs were made, the table, what each source
    said first.  The columns are explained in docs/faults.md."""
    table = "\n".join([HEADER, *map(row, results)])
    kept = "\n".join([INCIDENT_HEADER, *map(incident_row, results)])
    body = (f"{measured(metas)} Columns and method: [faults.md](../faults.md).\n\n{table}\n\n"
            f"Incidents each node kept ([incidents.md](../incidents.md)):\n\n{kept}\n\n"
            f"What each source said first:\n\n{said(results)}\n")
    command = " ".join(["PYTHONPATH=exporter:reporter python -m bench.faults.run", *sys.argv[1:]])
    path = write_result("faults", body, title="Fault localisation benchmark", command=command)
    print(f"wrote {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", default="",
                        help=f"comma-separated class names, `{MESH}` for every {MESH}-... class "
                        "(default all)")
    parser.add_argument("--healthy", type=float, default=1800.0,
                        help="seconds of the healthy run (default %(default)s)")
    parser.add_argument("--parallel", type=int, default=3,
                        help="fault jobs at once besides the background ones")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--write-result", "--docs", dest="docs", action="store_true",
                        help="write the dated result docs/benchmarks/<date>-faults.md")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--warmup", type=float, default=None, metavar="SECONDS",
                        help="healthy seconds before each fault, for every class that has a "
                        "warm-up (default: each class's own, 30-45 s)")
    parser.add_argument("--no-reporter", dest="reporter", action="store_false",
                        help="plain torchrun jobs from a venv that holds torch only (nothing "
                        "of llmmon in them): the daemons find the ranks themselves")
    parser.add_argument("--render", type=Path, nargs="+", metavar="JSON",
                        help="run nothing: print (and with --write-result write) the table of "
                        "results files; a class in a later file replaces the earlier one")
    args = parser.parse_args(argv)
    every = classes(args.healthy)
    known = {c.name: c for c in every}
    if args.render:
        merged: dict[str, dict[str, Any]] = {}
        metas = []
        for path in args.render:
            try:
                saved = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                parser.error(f"--render {path}: {e}")
            metas.append(saved["meta"])
            if not saved["meta"].get("cause_without_job_id"):
                saved["results"] = [recheck_cause(r, known) for r in saved["results"]]
            merged.update((r["class"], r) for r in saved["results"])
        order = [c.name for c in classes(0)]
        report(sorted(merged.values(), key=lambda r: order.index(r["class"])), metas, args.docs)
        return 0
    wanted = [c for c in args.classes.split(",") if c]
    unknown = set(wanted) - {c.name for c in every} - {MESH}
    if unknown:
        parser.error(f"unknown classes {sorted(unknown)}; known: {[c.name for c in every]}")
    selected = [c for c in every if not wanted or c.name in wanted
                or (MESH in wanted and c.name.startswith(f"{MESH}-"))]
    if args.warmup is not None:
        selected = [dataclasses.replace(c, warmup=args.warmup) if c.warmup else c
                    for c in selected]
    if os.geteuid() != 0:
        parser.error("needs root: the nodes' ranks run in network namespaces")
    # `kill` stops it as Ctrl-C does: every daemon, job and namespace it started goes with it
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix="llmmon-faults-", dir=shm))
    started = time.time()
    try:
        results = bench(selected, args.parallel, work, reporter=args.reporter,
                        prefix="faults" if args.reporter else "plain")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    order = [c.name for c in every]
    results.sort(key=lambda r: order.index(r["class"]))
    meta = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
            "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
            "healthy_s": args.healthy, "parallel": args.parallel,
            "classes": [c.name for c in selected], "nodes": list(NODES),
            "warmup_s": args.warmup,
            "mode": "reporter" if args.reporter else "plain torchrun, no reporter",
            "cause_without_job_id": True}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    report(results, [meta], args.docs)
    return 0


def recheck_cause(r: dict[str, Any], known: dict[str, FaultClass]) -> dict[str, Any]:
    """Results written before the cause was looked for without the job id (which holds the
    class's name and matched every cause): the cause again, in each source's first statement
    only; a cause said only later is lost (shown –)."""
    fault = known[r["class"]]
    for source in r["sources"].values():
        about = source["said"].replace(r["job_id"], "<job>")
        said_it = bool(about) and bool(fault.cause_re.search(about))
        source["cause_at"] = source["named_at"] if said_it and (
            fault.culprit is not None) else (source["cause_at"] if said_it else None)
        if fault.culprit is None:
            source["named_at"] = source["named_at"] if said_it else None
    if not r["must_not_page"]:
        r["detected"] = any(s["named_at"] is not None for s in r["sources"].values())
        r["culprit_right"] = r["detected"] and not r["blamed_wrong"]
        r["cause_right"] = any(s["cause_at"] is not None for s in r["sources"].values())
    return r


def report(results: list[dict[str, Any]], metas: list[dict[str, Any]], docs: bool) -> None:
    print("\n" + HEADER)
    for r in results:
        print(row(r))
    print("\n" + INCIDENT_HEADER)
    for r in results:
        print(incident_row(r))
    print("\n" + said(results))
    if docs:
        write_doc(results, metas)


if __name__ == "__main__":
    sys.exit(main())
