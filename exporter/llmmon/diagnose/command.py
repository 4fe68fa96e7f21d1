"""`llmmon diagnose`'s decision tree: where the report comes from, and how it is printed.

Without `--prometheus` the report is this node's: the daemon's /api/v1/diagnose when it serves
one (its window already spans minutes), else two scrapes of its /metrics `--interval` seconds
apart evaluated here.  With `--prometheus URL` the same checks run over the cluster, on the
shipped recording rules that server evaluates.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import requests

from llmmon.diagnose import render
from llmmon.diagnose.branches import TREE
from llmmon.diagnose.model import worst
from llmmon.diagnose.prometheus import PrometheusView, add_client_arguments, client_session
from llmmon.diagnose.service import PATH
from llmmon.diagnose.thresholds import Thresholds, ThresholdsError
from llmmon.diagnose.tree import evaluate
from llmmon.diagnose.view import QueryError
from llmmon.diagnose.window import LocalView, Window


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The tree's options; `--url` and `--json` are the command's own."""
    group = parser.add_argument_group("decision tree")
    group.add_argument("--prometheus", metavar="URL",
                       help="Walk the tree over the cluster, from a Prometheus server that "
                       "scrapes the exporters and loads alerts/rules/.")
    group.add_argument("--interval", type=float, default=10.0, metavar="SECONDS",
                       help="Seconds between the two scrapes of /metrics when the daemon "
                       "serves no /api/v1/diagnose (default: %(default)s).")
    group.add_argument("--scrape", action="store_true",
                       help="Scrape /metrics twice and judge here, even if the daemon serves "
                       "/api/v1/diagnose.")
    group.add_argument("--alerts-config", metavar="PATH",
                       help="Thresholds from this alerts/config.yaml (default: the shipped "
                       "ones; a daemon's report uses the daemon's).")
    for spec in TREE:
        group.add_argument(f"--{spec.id}", dest=f"tree_{spec.id}", action="store_true",
                           help=f"Only this branch of the tree: {spec.question}")
    add_client_arguments(parser, "prometheus", "Prometheus")


def no_daemon(base_url: str, exc: BaseException) -> str:
    """One line for a daemon that cannot be reached, with the socket's reason, not the
    HTTP library's chain of wrappers."""
    todo, seen = [exc], set()
    while todo:
        error = todo.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, TimeoutError):
            return f"no llmmon daemon answers at {base_url} (timed out)"
        if isinstance(error, OSError) and error.strerror:
            return f"no llmmon daemon answers at {base_url} ({error.strerror.lower()})"
        todo.extend(e for e in (getattr(error, "reason", None), error.__cause__,
                                error.__context__, *error.args) if isinstance(e, BaseException))
    return f"no llmmon daemon answers at {base_url}"


def prometheus_session(args: argparse.Namespace) -> requests.Session:
    """The HTTP session for --prometheus, with its TLS and basic-auth options."""
    try:
        return client_session(args, "prometheus")
    except OSError as exc:
        raise QueryError(f"--prometheus: {exc}") from None


def _get(base_url: str, path: str) -> requests.Response:
    try:
        return requests.get(base_url + path, timeout=10)
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise QueryError(no_daemon(base_url, exc)) from None
    except requests.RequestException as exc:
        raise QueryError(f"{base_url}{path}: {exc}") from None


def _scrape(url: str, interval: float, thresholds: Thresholds) -> LocalView:
    window = Window(span=interval * 2 + 60)
    for number in range(2):
        if number:
            time.sleep(interval)
        response = _get(url, "/metrics")
        if response.status_code != 200:
            raise QueryError(f"{url}/metrics: HTTP {response.status_code}")
        window.add(response.text)
    return LocalView(window.observations(), "scrape", f"{url}/metrics", thresholds)


def report(args: argparse.Namespace) -> dict[str, Any]:
    """The report the arguments ask for, as JSON; QueryError when it cannot be had."""
    try:
        thresholds = (Thresholds.load(args.alerts_config) if args.alerts_config
                      else Thresholds())
    except ThresholdsError as exc:
        raise QueryError(str(exc)) from None
    branches = tuple(s for s in TREE if getattr(args, f"tree_{s.id}")) or TREE
    if args.prometheus:
        return evaluate(PrometheusView(args.prometheus, session=prometheus_session(args)),
                        thresholds, branches).as_json()
    url = args.url.rstrip("/")
    if not args.scrape and not args.alerts_config:
        response = _get(url, PATH)
        if response.status_code == 200:
            whole = response.json()
            keep = {s.id for s in branches}
            whole["branches"] = [b for b in whole["branches"] if b["id"] in keep]
            whole["suspects"] = [s for s in whole["suspects"] if s.split(".")[0] in keep]
            whole["verdict"] = worst([b["verdict"] for b in whole["branches"]])
            return whole
    return evaluate(_scrape(url, args.interval, thresholds), thresholds, branches).as_json()


def run(args: argparse.Namespace) -> int:
    """Print the report; 0 when nothing is suspect, 1 when something is, 2 without evidence."""
    try:
        result = report(args)
    except QueryError as exc:
        print(f"llmmon diagnose: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(result, sys.stdout, indent=1, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render.text(result))
    return 1 if result["verdict"] == "suspect" else 0
