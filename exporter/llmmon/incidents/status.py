"""The node's status page (`/`): its ranks and their verdicts, the diagnosis, its GPUs and
ports, the recent incidents and the collectors, on one page that reloads itself.

It lives beside the incident pages because it shows them and shares their look. The live parts
come from the collector process, which may be down or slow: each arrives as an `Answer` that
holds its document or why there is none, and the page renders whatever it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from llmmon.incidents.html import (as_dict, as_list, esc, incidents_table, number, page,
                                   ranks_words, section, table)
from llmmon.incidents.store import Listing

REFRESH = 30  # seconds between reloads
RECENT = 10  # incidents listed


@dataclass(frozen=True)
class Answer:
    """A route's document, or why there is none (`missing`: this daemon has no such route)."""

    document: Any = None
    error: str = ""
    missing: bool = False


@dataclass(frozen=True)
class NodeStatus:
    version: str
    telemetry_path: str
    collectors: list[dict[str, Any]]
    ranks: Answer
    diagnosis: Answer
    gpus: Answer
    incidents: Listing | None  # None: this server keeps no incident directory
    ports: Answer = Answer(missing=True)  # the last exposition's text, as /metrics serves it


def status_page(status: NodeStatus) -> str:
    path = esc(status.telemetry_path)
    links = (f"<p><a href='{path}'>Metrics</a> · <a href='/incidents'>Incidents</a> · "
             "<a href='/api/v1/ranks'>Ranks (JSON)</a> · <a href='/api/v1/collectors'>"
             "Collectors (JSON)</a> · <a href='/api/v1/diagnose'>Diagnosis (JSON)</a> · "
             "<a href='/healthz'>Health</a></p>")
    body = (f"<h1>llmmon exporter {esc(status.version)}</h1>{links}"
            + section("Ranks", lambda: _ranks(status.ranks), "ranks")
            + section("Diagnosis", lambda: _diagnosis(status.diagnosis), "diagnosis")
            + section("GPUs", lambda: _gpus(status.gpus), "gpus")
            + section("Ports", lambda: _ports(status.ports), "ports")
            + section("Recent incidents", lambda: _incidents(status), "incidents")
            + section("Collectors", lambda: _collectors(status.collectors), "collectors"))
    return page("llmmon exporter", body, refresh=REFRESH)


def _unavailable(answer: Answer, what: str) -> str | None:
    if answer.missing:
        return f"<p class='muted'>{esc(what)}</p>"
    if answer.error:
        return f"<p class='bad'>not available now: {esc(answer.error)}</p>"
    return None


def _ranks(answer: Answer) -> str:
    gone = _unavailable(answer, "the ranks collector is not enabled on this daemon")
    if gone is not None:
        return gone
    jobs = as_list(as_dict(answer.document).get("jobs"))
    if not jobs:
        return "<p>no training rank on this node</p>"
    return "".join(_job(job) for job in map(as_dict, jobs))


def _job(job: dict[str, Any]) -> str:
    verdict = as_dict(job.get("verdict"))
    stalled = [g for g in map(as_dict, as_list(job.get("groups"))) if g.get("stalled")]
    said = verdict.get("summary") or as_dict(job.get("end")).get("summary")
    groups = "".join(f"<li>{esc(g.get('summary') or g.get('pg', '?'))}</li>" for g in stalled)
    ranks = [r.get("rank") for r in map(as_dict, as_list(job.get("ranks")))
             if isinstance(r.get("rank"), int)]
    return (f"<h3>job {esc(job.get('job_id', '?'))}"
            + (f" <span class='muted'>{esc(ranks_words(ranks))} here</span>" if ranks else "")
            + (" <span class='suspect'>stalled</span>" if verdict.get("stalled") else "")
            + "</h3>"
            + (f"<div class='culprit'><p>{esc(said)}</p></div>" if said else "")
            + (f"<p>Stalled groups:</p><ul>{groups}</ul>" if groups else "")
            + _rank_table(job, verdict))


def _rank_table(job: dict[str, Any], verdict: dict[str, Any]) -> str:
    """One row a rank: its pod, whether it reports, its process and where it is; the roots of
    a stalled job highlighted."""
    rows, classes = [], []
    roots = as_list(verdict.get("roots")) if verdict.get("stalled") else []
    for rank in map(as_dict, as_list(job.get("ranks"))):
        doing, exit_ = as_dict(rank.get("doing")), as_dict(rank.get("exit"))
        idle = doing.get("cpu_idle_seconds")
        state = ("ended: " + str(exit_.get("how", "")) if exit_ else
                 "up" if rank.get("up") else "silent")
        rows.append([esc(rank.get("rank", "?")), esc(rank.get("pod") or "—"), esc(state),
                     esc(doing.get("state") or "—"), esc(doing.get("where") or "—"),
                     "—" if idle is None else f"{number(idle)} s"])
        classes.append("hl" if rank.get("rank") in roots else "")
    return table(["rank", "pod", "reporter", "process", "where", "no CPU for"], rows, classes)


def _diagnosis(answer: Answer) -> str:
    gone = _unavailable(answer, "this daemon serves no diagnosis")
    if gone is not None:
        return gone
    report = as_dict(answer.document)
    verdict = str(report.get("verdict", "unknown"))
    suspects = []
    counts: dict[str, int] = {}
    for branch in map(as_dict, as_list(report.get("branches"))):
        for check in map(as_dict, as_list(branch.get("checks"))):
            counts[str(check.get("verdict"))] = counts.get(str(check.get("verdict")), 0) + 1
            if check.get("verdict") == "suspect":
                suspects.append(f"<li><strong>{esc(branch.get('title', ''))}: "
                                f"{esc(check.get('title', ''))}</strong> — "
                                f"{esc(check.get('summary', ''))}</li>")
    tally = ", ".join(f"{n} {esc(v)}" for v, n in sorted(counts.items()))
    return (f"<p>Node verdict: <strong class='{esc(verdict)}'>{esc(verdict)}</strong>"
            f" <span class='muted'>({tally})</span></p>"
            + (f"<ul>{''.join(suspects)}</ul>" if suspects else ""))


def _gpus(answer: Answer) -> str:
    gone = _unavailable(answer, "the gpu collector is not enabled on this daemon")
    if gone is not None:
        return gone
    state = as_dict(answer.document)
    rows = [[esc(g.get("index", "?")), esc(g.get("uuid", "")), "up" if g.get("up") else
             "<span class='bad'>down</span>", esc(", ".join(map(str, as_list(g.get("unsupported"))))
                                                 or "—")]
            for g in map(as_dict, as_list(state.get("gpus")))]
    source = f"<p class='muted'>{esc(state.get('source', ''))}</p>"
    return source + (table(["gpu", "uuid", "state", "NVML calls not supported"], rows) if rows
                     else "<p>no GPU on this node</p>")


PORT_SERIES = ("llmmon_rdma_port_up", "llmmon_rdma_port_rate_bytes_per_second",
               "llmmon_netdev_up", "llmmon_netdev_speed_bytes_per_second")


def _ports(answer: Answer) -> str:
    """RDMA ports and network interfaces, up or down, with their rate, from the exposition the
    server already holds (no collector call)."""
    gone = _unavailable(answer, "the collector process has not rendered its metrics yet")
    if gone is not None:
        return gone
    found: dict[tuple[str, str, str], dict[str, float]] = {}
    lines = (line for line in str(answer.document).splitlines()
             if line.startswith(PORT_SERIES))
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            labels = sample.labels
            key = ("rdma", f"{labels.get('device', '')}/{labels.get('port', '')}",
                   labels.get("netdev", "")) if family.name.startswith("llmmon_rdma") \
                else ("netdev", labels.get("netdev", ""), labels.get("netdev", ""))
            found.setdefault(key, {})["up" if sample.name.endswith("_up") else "rate"] = \
                sample.value
    if not found:
        return "<p>no RDMA port or network interface reported</p>"
    rows = [[esc(kind), esc(name), "up" if values.get("up") == 1 else
             "<span class='bad'>down</span>",
             "—" if values.get("rate") is None else f"{values['rate'] * 8 / 1e9:g} Gb/s"]
            for (kind, name, _), values in sorted(found.items())]
    return table(["kind", "port", "state", "rate"], rows)


def _incidents(status: NodeStatus) -> str:
    if status.incidents is None:
        return "<p class='muted'>this server keeps no incident directory</p>"
    more = len(status.incidents.incidents) - RECENT
    return (incidents_table(status.incidents, RECENT)
            + (f"<p><a href='/incidents'>{more} more</a></p>" if more > 0 else ""))


def _collectors(states: list[dict[str, Any]]) -> str:
    if not states:
        return "<p class='muted'>the collector process has not reported yet</p>"
    rows = "".join(
        f"<tr><td>{esc(s['name'])}</td><td class='{esc(s['status'])}'>{esc(s['status'])}</td>"
        f"<td>{esc(s['message'] or '')}</td><td>{s['series']}</td></tr>" for s in states)
    return ("<div class='scroll'><table><tr><th>collector</th><th>status</th><th>detail</th>"
            f"<th>series</th></tr>{rows}</table></div>")
