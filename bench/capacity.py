"""Capacity, measured: Prometheus and VictoriaMetrics (vmagent + vmalert) against a fleet of N nodes.

For each N (`bench/fleet.py`: N simulated 8-GPU nodes in one process, 128-rank jobs) it runs,
one store at a time so that their memory does not add up on one machine:

- Prometheus (the shipped rules, 15 s scrape and evaluation, as deploy/prometheus/), then
- VictoriaMetrics single-node, fed by vmagent (15 s scrape, remote write), with vmalert
  evaluating the same rules against it (every 15 s, results written back through the
  remote-write queue that deploy/victoriametrics/compose.yaml configures; what it wrote,
  refused and dropped, and the rules failing at the end, are reported),

waits `--settle` seconds, then samples for `--measure` seconds: head (active) series, RSS,
bytes per series, samples per second ingested, every rule group's and every rule's evaluation
time (the median and the largest over the window) and iterations missed in the window (and
since the ruler started), the CPU cores each process (fleet, scraper, store, ruler) and the
whole machine used over the window, and the latency of every query of the wall and triage
dashboards (from dashboards/*.json at their default time range, step = range / 1000 points
rounded to at least the 15 s scrape interval, as Grafana computes it; `$__rate_interval` = 4
scrape intervals, every template variable = All).

Writes bench/results/capacity.json; `--write-result` writes the table and the extrapolation as
the dated result docs/benchmarks/<date>-capacity.md (bench/common.py).  Rules come from
alerts/rules/ unless
`--rules DIR` (e.g. an older render, for a before/after comparison); `--no-rules` runs
Prometheus without rule files and VictoriaMetrics without vmalert: what scraping and storing
alone cost, beside which the rules' share of the machine reads.

    python bench/capacity.py --nodes 125 250 500 1000 --write-result
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml
from prometheus_client.parser import text_string_to_metric_families

from common import free_port, stop, wait_http, write_result

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ("llmmon-cluster-wall.json", "llmmon-triage.json")
SCRAPE_S = 15
GRAFANA_POINTS = 1000
QUERY_TIMEOUT_S = 20.0  # a panel slower than this is broken anyway
QUERY_BUDGET_S = 120.0  # all dashboard queries of one run
BIN = {name: shutil.which(name) for name in
       ("prometheus", "victoria-metrics", "vmagent", "vmalert", "prometheus-alertmanager")}
GPUS = 8
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _get(url: str, timeout: float = 120.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _metrics(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A server's own /metrics."""
    return parse_metrics(_get(url + "/metrics").decode())


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """An exposition: sample name -> [(labels, value)]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def _one(metrics: dict, name: str, **labels: str) -> float:
    return sum(v for ls, v in metrics.get(name, []) if all(ls.get(k) == x for k, x in labels.items()))


class Processes:
    """Started processes, stopped in reverse order by PID."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.work / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=self.work)
        self.started.append((name, process))
        return process

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) each running process has used, by name, and the whole
        machine's busy seconds under "machine" (/proc/stat, every CPU summed)."""
        used = {name: _cpu_seconds(process.pid) for name, process in self.started
                if process.poll() is None}
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle, iowait; steal (the hypervisor's) counts as busy
        return {**used, "machine": (sum(fields[:8]) - idle) / CLOCK_TICKS}

    def stop(self) -> None:
        for _, process in reversed(self.started):
            stop(process)
        self.started = []


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (/proc/PID/stat fields 14 and 15, after the command name)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cores_used(before: dict[str, float], after: dict[str, float], seconds: float
               ) -> dict[str, float]:
    """Cores each process (and the machine) used between two `Processes.cpu_seconds` readings:
    on a saturated machine, what the store, the scraper and the rules got of it."""
    return {name: round((after[name] - before[name]) / seconds, 2) for name in after
            if name in before}


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def dashboard_queries() -> list[dict[str, Any]]:
    """Every query of the wall and triage dashboards, resolved as Grafana resolves them."""
    queries = []
    for name in DASHBOARDS:
        board = json.loads((ROOT / "dashboards" / name).read_text())
        span = _seconds(board["time"]["from"].removeprefix("now-"))
        step = max(SCRAPE_S, round(span / GRAFANA_POINTS / SCRAPE_S) * SCRAPE_S)
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                expr = re.sub(r'=~"\$[a-z_]+"', '=~".*"', target["expr"])
                expr = expr.replace("$__rate_interval", f"{4 * SCRAPE_S}s")
                expr = expr.replace("$__interval", f"{step}s").replace("$__range", f"{span}s")
                queries.append({"dashboard": name, "panel": panel.get("title", ""),
                                "expr": expr, "instant": bool(target.get("instant")),
                                "range_s": span, "step_s": step})
    return queries


def _seconds(text: str) -> int:
    return int(text[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[text[-1]]


def query_url(url: str, query: dict[str, Any], expr: str | None = None) -> str:
    """The API request for a dashboard query (or `expr` at its range and step), ending now."""
    now = time.time()
    if query["instant"]:
        params = {"query": expr or query["expr"], "time": f"{now:.3f}"}
        return f"{url}/api/v1/query?{urllib.parse.urlencode(params)}"
    params = {"query": expr or query["expr"], "start": f"{now - query['range_s']:.3f}",
              "end": f"{now:.3f}", "step": str(query["step_s"])}
    return f"{url}/api/v1/query_range?{urllib.parse.urlencode(params)}"


def time_queries(url: str, budget_s: float) -> list[dict[str, Any]]:
    """Each query once, until `budget_s` is spent; the rest are listed as not run."""
    results = []
    end = time.monotonic() + budget_s
    for query in dashboard_queries():
        if time.monotonic() > end:
            results.append({**query, "seconds": None, "error": "not run (query budget spent)",
                            "series": 0})
            continue
        started = time.perf_counter()
        try:
            body = json.loads(_get(query_url(url, query), QUERY_TIMEOUT_S))
        except urllib.error.HTTPError as exc:  # recorded, not fatal: the store rejected it
            body = {"error": exc.read().decode(errors="replace")[:300]}
        except (TimeoutError, urllib.error.URLError) as exc:  # recorded: slower than the bound
            body = {"error": f"no answer within {QUERY_TIMEOUT_S:g} s ({exc})"}
        elapsed = time.perf_counter() - started
        results.append({**query, "seconds": round(elapsed, 3), "error": body.get("error"),
                        "series": len(body.get("data", {}).get("result", []))})
    return results


def _rule_name(rule: dict[str, Any]) -> str:
    return rule.get("name") or rule.get("record") or rule.get("alert", "?")


class RuleTimes:
    """Evaluation times per group and per rule, sampled from the /api/v1/rules of a ruler."""

    def __init__(self) -> None:
        self.groups: dict[str, list[float]] = {}
        self.rules: dict[tuple[str, str], list[float]] = {}
        self.intervals: dict[str, float] = {}
        self._seen: dict[str, str] = {}

    def sample(self, url: str) -> None:
        for group in json.loads(_get(url + "/api/v1/rules"))["data"]["groups"]:
            name = group["name"]
            self.intervals[name] = float(group.get("interval") or SCRAPE_S)
            rules = group["rules"]
            # vmalert (1.79) times rules only (group times: Iterations).
            stamp = str(group.get("lastEvaluation", rules[0].get("lastEvaluation") if rules else ""))
            if self._seen.get(name) == stamp:
                continue  # the same iteration as the last sample
            self._seen[name] = stamp
            took = group.get("evaluationTime", sum(float(r.get("evaluationTime", 0)) for r in rules))
            self.groups.setdefault(name, []).append(float(took))
            for index, rule in enumerate(rules):
                key = (name, f"{index}:{_rule_name(rule)}")
                self.rules.setdefault(key, []).append(float(rule.get("evaluationTime", 0)))

    def report(self, missed: dict[str, dict[str, float]]) -> dict[str, Any]:
        return {
            "groups": {name: {"interval_s": self.intervals[name],
                              "median_s": round(statistics.median(times), 4),
                              "max_s": round(max(times), 4), "iterations": len(times),
                              **missed.get(name, {"missed": 0, "missed_since_start": 0})}
                       for name, times in sorted(self.groups.items())},
            "rules": [{"group": group, "rule": rule.split(":", 1)[1],
                       "median_s": round(statistics.median(times), 4),
                       "max_s": round(max(times), 4)}
                      for (group, rule), times in sorted(self.rules.items())]}


def missed_iterations(before: dict, after: dict, metric: str,
                      label: str) -> dict[str, dict[str, float]]:
    """Per group: iterations missed over the measured window, and since the ruler started (its
    first minutes, while the store takes in the fleet's first scrapes, included)."""
    def per_group(metrics: dict) -> dict[str, float]:
        return {labels[label].rsplit(";", 1)[-1]: value for labels, value in metrics.get(metric, [])}
    start = per_group(before)
    return {group: {"missed": total - start.get(group, 0), "missed_since_start": total}
            for group, total in per_group(after).items()}


class Iterations:
    """vmalert's own iteration durations per group (`vmalert_iteration_duration_seconds`
    sum and count, sampled more often than the groups run): 1.79's `/api/v1/rules` has no
    group time, and its recording rules' `evaluationTime`s grow along the group (each seems
    to count from the iteration's start), so their sum is not the group's time."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[float, float]] = {}
        self.times: dict[str, list[float]] = {}

    def sample(self, url: str) -> None:
        metrics = _metrics(url)
        counts = {ls["group"]: v for ls, v in
                  metrics.get("vmalert_iteration_duration_seconds_count", [])}
        for labels, total in metrics.get("vmalert_iteration_duration_seconds_sum", []):
            group, count = labels["group"], counts.get(labels["group"], 0.0)
            before = self.last.get(group)
            if before is not None and count > before[1]:
                ran = int(count - before[1])
                self.times.setdefault(group, []).extend([(total - before[0]) / ran] * ran)
            self.last[group] = (total, count)

    def apply(self, report: dict[str, Any]) -> dict[str, Any]:
        for name, group in report["groups"].items():
            times = self.times.get(name)
            if times:
                group.update(median_s=round(statistics.median(times), 4),
                             max_s=round(max(times), 4), iterations=len(times))
        return report


def _watch(seconds: float, every: float, probe: Callable[[], None]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        probe()
        time.sleep(min(every, max(end - time.monotonic(), 0)))


def _scrape_config(targets: Path) -> dict[str, Any]:
    return {"job_name": "llmmon", "scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": "10s",
            "file_sd_configs": [{"files": [str(targets)]}]}


def _alertmanager(procs: Processes) -> str:
    port = free_port()
    config = procs.work / "alertmanager.yml"
    config.write_text(yaml.safe_dump({"route": {"receiver": "null"},
                                      "receivers": [{"name": "null"}]}))
    procs.start("alertmanager", [BIN["prometheus-alertmanager"], f"--config.file={config}",
                                 f"--web.listen-address=127.0.0.1:{port}",
                                 f"--storage.path={procs.work / 'am'}",
                                 "--cluster.listen-address="])
    wait_http(port, "/-/ready", 60)
    return f"127.0.0.1:{port}"


def run_prometheus(procs: Processes, targets: Path, rules: Path | None, settle: float,
                   measure: float) -> dict[str, Any]:
    """Prometheus scraping the fleet and evaluating `rules` (none: scraping and storage only)."""
    alertmanager = _alertmanager(procs)
    port = free_port()
    config = procs.work / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "rule_files": [str(rules / "*.yaml")] if rules else [],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [_scrape_config(targets)]}))
    process = procs.start("prometheus", [
        BIN["prometheus"], f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
        f"--storage.tsdb.path={procs.work / 'prometheus-data'}", "--log.level=warn"])
    url = f"http://127.0.0.1:{port}"
    wait_http(port, "/-/ready", 120)
    time.sleep(settle)
    times = RuleTimes()
    before, started, cpu = _metrics(url), time.monotonic(), procs.cpu_seconds()
    _watch(measure, 5, lambda: times.sample(url))
    after, elapsed = _metrics(url), time.monotonic() - started
    cores = cores_used(cpu, procs.cpu_seconds(), elapsed)
    series = _one(after, "prometheus_tsdb_head_series")
    rss = _rss_bytes(process.pid)
    missed = missed_iterations(before, after, "prometheus_rule_group_iterations_missed_total",
                               "rule_group")
    appended = (_one(after, "prometheus_tsdb_head_samples_appended_total")
                - _one(before, "prometheus_tsdb_head_samples_appended_total"))
    return {"series": int(series), "rss_bytes": rss,
            "bytes_per_series": round(rss / series) if series else None,
            "samples_per_second": round(appended / elapsed), "cores": cores,
            **times.report(missed), "queries": time_queries(url, QUERY_BUDGET_S)}


def start_victoria(procs: Processes, targets: Path
                   ) -> tuple[subprocess.Popen[bytes], str, int]:
    """VictoriaMetrics, and vmagent scraping `targets` into it: (VictoriaMetrics' process, its
    URL, vmagent's port)."""
    vm_port, agent_port = free_port(), free_port()
    vm = f"http://127.0.0.1:{vm_port}"
    process = procs.start("victoria-metrics", [
        BIN["victoria-metrics"], f"-storageDataPath={procs.work / 'vm-data'}",
        f"-httpListenAddr=127.0.0.1:{vm_port}", "-retentionPeriod=1d",
        "-search.maxUniqueTimeseries=10000000", "-loggerLevel=WARN"])
    wait_http(vm_port, "/health", 120)
    scrape = procs.work / "vmagent.yml"
    scrape.write_text(yaml.safe_dump({"global": {"scrape_interval": f"{SCRAPE_S}s"},
                                      "scrape_configs": [_scrape_config(targets)]}))
    procs.start("vmagent", [
        BIN["vmagent"], f"-promscrape.config={scrape}", f"-remoteWrite.url={vm}/api/v1/write",
        f"-remoteWrite.tmpDataPath={procs.work / 'vmagent-data'}",
        f"-httpListenAddr=127.0.0.1:{agent_port}", "-loggerLevel=WARN"])
    return process, vm, agent_port


@contextmanager
def fleet_in_victoria(nodes: int, *fleet_args: str, recording: Path | None = None
                      ) -> Iterator[str]:
    """`nodes` simulated nodes (bench/fleet.py, with `fleet_args`) scraped by vmagent into
    VictoriaMetrics: VictoriaMetrics' URL, once vmagent is up.  No vmalert (a probe times the
    store's answers, not a busy ruler's share of the machine), unless `recording` names a rule
    file: then vmalert evaluates it into the store (the series other rules read), and the URL
    is yielded once each of its groups has written once."""
    work = Path(tempfile.mkdtemp(prefix="llmmon-fleet-vm-"))
    procs = Processes(work)
    targets, fleet_port = work / "targets.json", free_port()
    try:
        procs.start("fleet", [sys.executable, str(ROOT / "bench" / "fleet.py"),
                              f"--nodes={nodes}", f"--port={fleet_port}",
                              f"--targets={targets}", *fleet_args])
        wait_http(fleet_port, "/nodes/0/metrics", 300)
        _, url, agent_port = start_victoria(procs, targets)
        wait_http(agent_port, "/health", 120)
        if recording is not None:
            _record(procs, url, recording)
        yield url
    finally:
        procs.stop()
        shutil.rmtree(work, ignore_errors=True)


def group_seconds(group: dict[str, Any]) -> float:
    """A rule group's evaluation interval in seconds (the scrape interval unless it sets one)."""
    return _seconds(group.get("interval", f"{SCRAPE_S}s"))


def _record(procs: Processes, vm: str, rules: Path) -> None:
    """vmalert evaluating `rules` (recording rules only: it notifies nobody) into `vm`, every
    group run once (vmalert 1.79 runs each at its start; a group that has not run within its
    interval and two minutes more fails the bench)."""
    port = free_port()
    procs.start("vmalert", [
        BIN["vmalert"], f"-rule={rules}", f"-datasource.url={vm}", f"-remoteWrite.url={vm}",
        f"-evaluationInterval={SCRAPE_S}s", f"-httpListenAddr=127.0.0.1:{port}",
        "-loggerLevel=WARN", *remote_write_tuning()])
    wait_http(port, "/health", 120)
    groups = {g["name"]: group_seconds(g) for g in yaml.safe_load(rules.read_text())["groups"]}
    print(f"vmalert records {len(groups)} groups; waiting for each to run once "
          f"(intervals {', '.join(f'{s:.0f} s' for s in sorted(set(groups.values())))})",
          flush=True)
    deadline, ran = time.monotonic() + max(groups.values()) + 120, set[str]()
    while time.monotonic() < deadline:
        ran = {ls["group"] for ls, v in
               _metrics(f"http://127.0.0.1:{port}").get(
                   "vmalert_iteration_duration_seconds_count", []) if v > 0}
        if set(groups) <= ran:
            time.sleep(2 * SCRAPE_S)  # its writes flushed and searchable
            return
        time.sleep(5)
    raise RuntimeError(f"vmalert did not run {sorted(set(groups) - ran)} in time")


def run_victoria(procs: Processes, targets: Path, rules: Path | None, settle: float,
                 measure: float) -> dict[str, Any]:
    """VictoriaMetrics fed by vmagent, with vmalert evaluating `rules` (none: no vmalert)."""
    process, vm, agent_port = start_victoria(procs, targets)
    alert_url = None
    if rules is not None:
        alertmanager, alert_port = _alertmanager(procs), free_port()
        procs.start("vmalert", [
            BIN["vmalert"], f"-rule={rules}/*.yaml", f"-datasource.url={vm}",
            f"-remoteWrite.url={vm}", f"-remoteRead.url={vm}",
            f"-notifier.url=http://{alertmanager}", f"-evaluationInterval={SCRAPE_S}s",
            f"-httpListenAddr=127.0.0.1:{alert_port}", "-loggerLevel=WARN",
            *remote_write_tuning()])
        wait_http(alert_port, "/health", 120)
        alert_url = f"http://127.0.0.1:{alert_port}"
    wait_http(agent_port, "/health", 120)
    time.sleep(settle)
    times, iterations = RuleTimes(), Iterations()
    before, started, cpu = _metrics(vm), time.monotonic(), procs.cpu_seconds()
    alert_before = _metrics(alert_url) if alert_url else {}

    def probe() -> None:
        if alert_url:
            times.sample(alert_url)
            iterations.sample(alert_url)

    _watch(measure, 5, probe)
    after, elapsed = _metrics(vm), time.monotonic() - started
    cores = cores_used(cpu, procs.cpu_seconds(), elapsed)
    alert_metrics = _metrics(alert_url) if alert_url else {}
    series = _one(after, "vm_cache_entries", type="storage/hour_metric_ids")
    rss = _rss_bytes(process.pid)
    missed = missed_iterations(alert_before, alert_metrics, "vmalert_iteration_missed_total", "group")
    inserted = (_one(after, "vm_rows_inserted_total", type="promremotewrite")
                - _one(before, "vm_rows_inserted_total", type="promremotewrite"))
    recorded = {**{name: round(_one(alert_metrics, metric) - _one(alert_before, metric))
                   for name, metric in RECORDED_LOSS.items()},
                "rules_failing_at_end": round(sum(_one(alert_metrics, metric)
                                                  for metric in RULE_FAILING))}
    return {"series": int(series), "rss_bytes": rss,
            "bytes_per_series": round(rss / series) if series else None,
            "samples_per_second": round(inserted / elapsed), "cores": cores,
            **({"recorded": recorded} if alert_url else {}),
            **iterations.apply(times.report(missed)), "queries": time_queries(vm, QUERY_BUDGET_S)}


# What became of vmalert's rule results over the window: rows written, pushes refused by a
# full remote-write queue (vmalert drops that rule's result and does not retry), rows dropped
# after failed sends, and failed evaluations; then the rules whose last evaluation failed
# (1.79's per-rule gauges; later releases count errors instead).
RECORDED_LOSS = {"sent_rows": "vmalert_remotewrite_sent_rows_total",
                 "refused_pushes": "vmalert_remotewrite_errors_total",
                 "dropped_rows": "vmalert_remotewrite_dropped_rows_total",
                 "failed_evaluations": "vmalert_execution_errors_total"}
RULE_FAILING = ("vmalert_recording_rules_error", "vmalert_alerting_rules_error")


def remote_write_tuning() -> list[str]:
    """vmalert's -remoteWrite.* tuning flags as deploy/victoriametrics/compose.yaml ships them
    (not its URL): the bench measures the deployment's queue, not vmalert's defaults."""
    compose = yaml.safe_load((ROOT / "deploy" / "victoriametrics" / "compose.yaml").read_text())
    return [arg for arg in compose["services"]["vmalert"]["command"]
            if arg.startswith("-remoteWrite.") and not arg.startswith("-remoteWrite.url=")]


def run(nodes: int, store: str, rules: Path | None, settle: float, measure: float
        ) -> dict[str, Any]:
    """One store against `nodes` simulated nodes, with `rules` (None: none, the cost of
    scraping and storing alone)."""
    work = Path(tempfile.mkdtemp(prefix=f"llmmon-capacity-{store}-{nodes}-"))
    procs = Processes(work)
    targets = work / "targets.json"
    fleet_port = free_port()
    try:
        procs.start("fleet", [sys.executable, str(ROOT / "bench" / "fleet.py"),
                              f"--nodes={nodes}", f"--port={fleet_port}",
                              f"--targets={targets}"])
        wait_http(fleet_port, "/nodes/0/metrics", 300)
        runner = run_prometheus if store == "prometheus" else run_victoria
        result = runner(procs, targets, rules, settle, measure)
    finally:
        procs.stop()
        shutil.rmtree(work, ignore_errors=True)
    shipped = rules == (ROOT / "alerts" / "rules").resolve()
    exposition = (ROOT / "bench" / "results" / "fleet-node.prom").read_text().splitlines()
    per_node = sum(1 for line in exposition if line and line[0] != "#")
    return {"nodes": nodes, "store": store,
            "rule_files": "none" if rules is None else "shipped" if shipped else str(rules),
            "exposition_series_per_node": per_node,
            "load_average": os.getloadavg()[0], **result}


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB"


def _slowest(entry: dict[str, Any]) -> tuple[str, float, float]:
    """The rule group whose median evaluation takes the largest share of its interval (not the
    most seconds: the 15-minute lemon group once took 6 s, 1 % of its interval): its name,
    seconds and share."""
    name, group = max(entry["groups"].items(),
                      key=lambda kv: kv[1]["median_s"] / kv[1]["interval_s"])
    return name, group["median_s"], group["median_s"] / group["interval_s"]


def _slowest_text(entry: dict[str, Any]) -> str:
    if not entry["groups"]:
        return "-"
    name, seconds, share = _slowest(entry)
    return f"`{name}` {seconds:.2f} s ({share:.0%})"


def _cores_text(entry: dict[str, Any]) -> str:
    """The machine's busy cores over the measured window, then each process's, largest first
    (runs before 2026-12-06 did not sample them)."""
    cores = dict(entry.get("cores", {}))
    if not cores:
        return "-"
    machine = cores.pop("machine")
    parts = [f"{name} {used:.1f}" for name, used in sorted(cores.items(), key=lambda kv: -kv[1])
             if used >= 0.05]
    return f"{machine:.1f} ({', '.join(parts)})"


def _slowest_query(entry: dict[str, Any], dashboard: str) -> str:
    """The slowest query of a dashboard, or how many did not answer within the bound."""
    queries = [q for q in entry["queries"] if q["dashboard"] == dashboard]
    failed = [q for q in queries if q["error"]]
    answered = [q["seconds"] for q in queries if not q["error"]]
    text = f"{max(answered):.2f} s" if answered else "-"
    return text + (f" ({len(failed)} of {len(queries)} unanswered)" if failed else "")


def docs_block(results: list[dict[str, Any]]) -> str:
    """The measured table and the extrapolation of docs/capacity.md."""
    lines = ["| nodes (8 GPUs) | store | rules | head series | series/node | RSS | bytes/series | "
             "samples/s | slowest rule group (median, % of interval) | missed | "
             "wall dashboard, slowest query | triage, slowest query | load average | "
             f"CPU cores busy, of {os.cpu_count()} (by process) |",
             "|---:|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for entry in sorted(results, key=lambda e: (e["nodes"], e["store"], e.get("rule_files", ""))):
        missed = sum(g["missed"] for g in entry["groups"].values())
        lines.append(
            f"| {entry['nodes']:,} | {entry['store']} | {entry.get('rule_files', 'shipped')} | "
            f"{entry['series']:,} | "
            f"{entry['series'] // entry['nodes']:,} | {_gib(entry['rss_bytes'])} | "
            f"{entry['bytes_per_series']:,} | {entry['samples_per_second']:,} | "
            f"{_slowest_text(entry)} | {missed:g} | "
            f"{_slowest_query(entry, DASHBOARDS[0])} | {_slowest_query(entry, DASHBOARDS[1])} | "
            f"{entry.get('load_average', 0):.0f} | {_cores_text(entry)} |")
    lines += ["", extrapolation(results)]
    return "\n".join(lines)


def extrapolation(results: list[dict[str, Any]]) -> str:
    """Linear in nodes from the largest N measured per store: series, RSS, rule time."""
    lines = ["Extrapolated, linear in nodes, from the largest fleet per store (shipped rules) "
             "whose scrapes kept up (head series at least 90 % of nodes x series per node): "
             "series, memory and rule-group time all grow with the series a rule reads, which "
             "grow with nodes. Query latency is not extrapolated. The base runs share the "
             "machine with the fleet and the scraper (load average above), so the times are "
             "upper bounds:", "",
             "| nodes | GPUs | store | head series | RSS | slowest rule group | % of its interval |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for store in ("prometheus", "victoriametrics"):
        measured = [e for e in results
                    if e["store"] == store and e.get("rule_files", "shipped") == "shipped"]
        if not measured:
            continue
        # Runs whose scrapes kept up (head series >= 90 % of nodes x the node's series) first.
        complete = [e for e in measured
                    if e["series"] >= 0.9 * e["nodes"] * e.get("exposition_series_per_node", 0)]
        base = max(complete or measured, key=lambda e: e["nodes"])
        name, seconds, share = _slowest(base)
        for nodes in (n for n in (1_250, 12_500) if n > base["nodes"]):  # beyond the measured
            factor = nodes / base["nodes"]
            lines.append(f"| {nodes:,} | {nodes * GPUS:,} | {store} | "
                         f"{round(base['series'] * factor):,} | "
                         f"{_gib(base['rss_bytes'] * factor)} | `{name}` {seconds * factor:.2f} s | "
                         f"{share * factor:.0%} |")
    return "\n".join(lines)


def write_docs(block: str) -> None:
    """docs/benchmarks/<date>-capacity.md: the table and the extrapolation, after the header
    that says when, on what and at which commit.  How to read it: docs/capacity.md."""
    path = write_result("capacity", "How to read it: [capacity.md](../capacity.md).\n\n" + block,
                        title="Capacity: Prometheus and VictoriaMetrics against a simulated fleet")
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[125, 250, 500, 1000])
    parser.add_argument("--stores", nargs="+", default=["prometheus", "victoriametrics"],
                        choices=["prometheus", "victoriametrics"])
    which_rules = parser.add_mutually_exclusive_group()
    which_rules.add_argument("--rules", type=Path, default=ROOT / "alerts" / "rules")
    which_rules.add_argument("--no-rules", action="store_true",
                             help="no rules (and no vmalert): what scraping and storing alone cost")
    parser.add_argument("--settle", type=float, default=60.0,
                        help="seconds from start to the first sample (default 60)")
    parser.add_argument("--measure", type=float, default=90.0,
                        help="seconds of sampling (default 90: six evaluations)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "capacity.json")
    parser.add_argument("--write-result", "--write-docs", dest="write_docs", action="store_true",
                        help="write the dated result docs/benchmarks/<date>-capacity.md")
    parser.add_argument("--from-json", type=Path, nargs="+", metavar="FILE",
                        help="measure nothing: build the table from earlier --out files")
    args = parser.parse_args()
    if args.from_json:
        results = [entry for path in args.from_json for entry in json.loads(path.read_text())]
        block = docs_block(results)
        print(block)
        if args.write_docs:
            write_docs(block)
        return 0
    missing = [name for name, path in BIN.items() if path is None]
    if missing:
        sys.exit(f"not installed: {', '.join(missing)} (scripts/install.sh --test)")
    results = []
    for nodes in args.nodes:
        for store in args.stores:
            rules = None if args.no_rules else args.rules.resolve()
            entry = run(nodes, store, rules, args.settle, args.measure)
            results.append(entry)
            print(f"{nodes:>5} nodes {store:<16} {entry['series']:>9,} series "
                  f"{_gib(entry['rss_bytes']):>9} {entry['samples_per_second']:>8,}/s  "
                  f"slowest group {_slowest_text(entry)}  "
                  f"wall {_slowest_query(entry, DASHBOARDS[0])}  cores {_cores_text(entry)}",
                  flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1) + "\n")
    block = docs_block(results)
    print(block)
    if args.write_docs:
        write_docs(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
