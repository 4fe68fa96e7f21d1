"""`llmmon incident JOB`: one report from the incidents that every node of a job kept.

The job's nodes come from Prometheus (the `instance` of the daemons that export the job's
`llmmon_rank_info` or `llmmon_job_incident_info`), or are named with `--node`.  Each node's
newest incident of the job is fetched from its daemon and the incidents are merged
(`llmmon.incidents.merge`).  `llmmon diagnose --incident JOB` prints the same report.
Exit status: 0 with a report, 2 without one (no such job, no incident on any node, bad URL).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from llmmon.diagnose.command import no_daemon, prometheus_session
from llmmon.diagnose.prometheus import PrometheusView, add_client_arguments, client_session
from llmmon.diagnose.view import QueryError
from llmmon.incidents import fetch, layout
from llmmon.incidents.merge import Report, merge, terminal_safe
from llmmon.textsafe import json_ready

REPORT_JSON = "report.json"
REPORT_TEXT = "report.txt"
PROMETHEUS_PORT = 9090  # where --prometheus names a host alone


class IncidentError(Exception):
    """No report can be made; the message says why."""


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """How the daemons are reached: shared with `diagnose --incident`."""
    group = parser.add_argument_group("nodes (the incident report)")
    group.add_argument("--node", action="append", default=[], metavar="URL",
                       help="A node's llmmon daemon (host:port or URL); repeat for each node. "
                       "Without --prometheus, the only nodes asked; with it, added to those "
                       "Prometheus names.")
    group.add_argument("--scheme", choices=("http", "https"), default="http",
                       help="Scheme of the daemons Prometheus names by host:port "
                       "(default: %(default)s).")
    group.add_argument("--port", type=int, default=fetch.DEFAULT_PORT,
                       help="Port of the daemons named by host alone, as an `instance` "
                       "relabelled to the node's name is (default: %(default)s).")
    group.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                       help="Per request to a daemon or Prometheus (default: %(default)s).")
    group.add_argument("--out", type=Path, metavar="DIR",
                       help=f"Also write {REPORT_JSON}, {REPORT_TEXT} and every node's files "
                       "(DIR/<node>/...) there.")
    add_client_arguments(parser, "node", "the llmmon daemons")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "incident", help="Merge the incidents a job's nodes kept into one report.",
        description="Find the job's nodes through Prometheus (or --node), fetch each node's "
        "newest incident of the job from its llmmon daemon, and print one report: the "
        "culprit and its cause as the nodes agree (or not), the Flight Recorder dumps of "
        "every rank matched together, stacks grouped across nodes, the counters of a node "
        "that stand out, and a timeline. A node that cannot be reached is reported missing. "
        "Exit status: 0 with a report, 2 without one. See docs/incidents.md.")
    parser.add_argument("job", metavar="JOB", help="The job id (as in llmmon_rank_info).")
    parser.add_argument("--prometheus", metavar="URL",
                        help="Find the job's nodes from this Prometheus server (a URL, or "
                        "host[:port], port 9090 if none).")
    parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
    add_client_arguments(parser, "prometheus", "Prometheus")
    add_node_arguments(parser)
    parser.set_defaults(func=run)


def nodes(args: argparse.Namespace, job_id: str) -> list[str]:
    """The daemons' base URLs: Prometheus' for the job, then --node."""
    try:
        named = [fetch.base_url(n, args.scheme, args.port) for n in args.node]
    except fetch.BadURL as exc:
        raise IncidentError(f"--node {exc}") from None
    if not args.prometheus:
        if not named:
            raise IncidentError("name the nodes with --node URL, or find them with "
                                "--prometheus URL")
        return named
    try:
        view = PrometheusView(fetch.base_url(args.prometheus, port=PROMETHEUS_PORT),
                              timeout=args.timeout, session=prometheus_session(args))
        found = fetch.discover(lambda expr: [s.labels for s in view.query(expr)], job_id)
    except fetch.BadURL as exc:
        raise IncidentError(f"--prometheus {exc}") from None
    except QueryError as exc:
        raise IncidentError(str(exc)) from None
    if not found and not named:
        raise IncidentError(f"Prometheus at {args.prometheus} knows no job {job_id!r} "
                            f"(no {fetch.RANK_INFO} nor {fetch.INCIDENT_INFO} series with "
                            f"job_id={job_id!r})")
    try:
        return [fetch.base_url(i, args.scheme, args.port) for i in found] + named
    except fetch.BadURL as exc:
        raise IncidentError(f"Prometheus names a node {exc}") from None


def report(args: argparse.Namespace, job_id: str) -> tuple[Report, fetch.Fetched]:
    """The merged report of `job_id`; IncidentError when no node has one."""
    urls = nodes(args, job_id)
    try:
        session = client_session(args, "node")
    except OSError as exc:
        raise IncidentError(f"--node: {exc}") from None
    got = fetch.fetch(session, urls, job_id, args.timeout, no_daemon)
    if not got.incidents:
        raise IncidentError(f"no incident of job {job_id!r} on any of its {len(urls)} node(s):\n"
                            + "\n".join(f"  {m.reason}" for m in got.missing))
    return merge(job_id, got.incidents, got.missing), got


def write(out: Path, result: Report, got: fetch.Fetched) -> None:
    """The report and every node's files under `out` (names checked by the fetch)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_JSON).write_text(json.dumps(result.json(), indent=1, ensure_ascii=False))
    (out / REPORT_TEXT).write_text(result.text())
    names = {view.source: view.node for view in result.nodes}  # told apart where shared
    for incident in got.incidents:
        node = out / layout.slug(names[incident.source])
        node.mkdir(exist_ok=True)
        (node / layout.SUMMARY).write_text(json.dumps(json_ready(incident.summary), indent=1))
        for name, data in incident.files.items():
            if layout.allowed(name):
                path = node / name
                path.parent.mkdir(exist_ok=True)
                path.write_bytes(data)


def emit(args: argparse.Namespace, job_id: str, command: str) -> bool:
    """Print (and with --out write) the report; False, with the reason on stderr, if none."""
    try:
        result, got = report(args, job_id)
        if args.out:
            write(args.out, result, got)
    except IncidentError as exc:  # it quotes what nodes answered: shown, never acted on
        print(f"llmmon {command}: " + "\n".join(map(terminal_safe, str(exc).split("\n"))),
              file=sys.stderr)
        return False
    except OSError as exc:
        print(f"llmmon {command}: --out: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return False
    if args.json:
        json.dump(result.json(), sys.stdout, indent=1, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(result.text())
    return True


def run(args: argparse.Namespace) -> int:
    return 0 if emit(args, args.job, "incident") else 2
