"""The scale-out path: the same hang page through vmagent, VictoriaMetrics and vmalert as
through Prometheus.

`llmmon simulate` runs two nodes, sim-00 with the hang scenario.  One Prometheus (started
here, as test_paging starts its own) and the shipped VictoriaMetrics path (deploy/victoriametrics/
compose.yaml: VictoriaMetrics, two vmagent shards, vmalert) watch them, each notifying its own
Alertmanager with the shipped routing.  The commands are the compose file's own, only the
host:port addresses and paths mapped to this machine, and the 15 s scrape and evaluation
intervals cut to 1 s (the rules' `for:` cut to 5 s, the hang window to 30 s, and
VictoriaMetrics' `-search.latencyOffset` from its 30 s default, two of the shipped scrape
intervals, to two of these: 2 s).  The page must
be the same: same labels, same rendered description; every node is scraped by exactly one
vmagent shard.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from llmmon.simulate import stack
from tests.conftest import ROOT
from tests.helpers import free_port, stop_process, wait_for
from tests.slow.e2e.conftest import Alert

DEPLOY = ROOT / "deploy" / "victoriametrics"
INTERVAL = "1s"
# The hang window, both rulers' `hang_window_seconds` (the shipped 180 s made this module wait
# three minutes for what it compares: the same page through both paths, which does not depend
# on the window's length).
HANG_WINDOW = 30
# How long VictoriaMetrics hides the newest samples from queries near now (-search.latencyOffset):
# its default 30 s is two of the shipped 15 s scrape intervals; this is two of INTERVAL. Every
# rule that reads a recording vmalert wrote through the store waited the 30 s again (the hang
# page reads three in a row).
LATENCY_OFFSET = "2s"
# That window plus `for`, the latency offsets and delivery, on a loaded 2-core machine.
DEADLINE = 300.0


@dataclass
class Route:
    """One way from the exporters to a pager: its Alertmanager's webhook receiver."""

    receiver: stack.WebhookReceiver

    def hang(self) -> Alert | None:
        return next((Alert(n.receiver, a["status"], a["labels"], a["annotations"])
                     for n in self.receiver.snapshot() for a in n.payload["alerts"]
                     if n.receiver == "pager" and a["status"] == "firing"
                     and a["labels"].get("alertname") == "LLMTrainingHang"), None)


@dataclass
class Stacks:
    prometheus: Route
    victoria: Route
    vmagents: list[str]  # URLs of the shards
    started: float
    vm: str  # VictoriaMetrics' URL
    rules: Path  # the rule files vmalert evaluates


def compose_command(service: str, mapping: dict[str, str]) -> list[str]:
    """A service's command from the shipped compose file, with `mapping`'s substrings replaced."""
    command = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"][service]["command"]
    out = []
    for arg in command:
        for old, new in mapping.items():
            arg = arg.replace(old, new)
        out.append(arg)
    return out


def _listen(service: str) -> tuple[str, str]:
    """The compose service's -httpListenAddr, and a free 127.0.0.1 port to map it to."""
    flag = next(a for a in compose_command(service, {}) if a.startswith("-httpListenAddr="))
    return flag, f"-httpListenAddr=127.0.0.1:{free_port()}"


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, log.read_text(errors="replace")[-2000:]
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return
        except OSError:
            assert time.monotonic() < deadline, f"{url} not ready; see {log}"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def stacks() -> Iterator[Stacks]:
    binaries = {name: stack.find_binary(name) for name in
                ("prometheus", "victoria-metrics", "vmagent", "vmalert")}
    alertmanager_bin = stack.find_binary("alertmanager", "prometheus-alertmanager")
    assert all(binaries.values()) and alertmanager_bin, \
        f"missing binaries {binaries}: scripts/install.sh --test"
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix="llmmon-vm-", dir=shm))
    receivers = [stack.WebhookReceiver(), stack.WebhookReceiver()]
    servers: list[stack.ServiceProcess] = []
    processes: list[subprocess.Popen[bytes]] = []
    with open(work / "simulate.log", "wb") as log:
        simulator = subprocess.Popen(
            [sys.executable, "-m", "llmmon", "simulate", f"--dir={work / 'sim'}", "--nodes=2",
             "--job-nodes=1", "--port=0", "--speed=20", "--scenario=hang@sim-00",
             *(f"--serve-arg=--collector.{c}.interval={INTERVAL}" for c in ("gpu", "ranks"))],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        targets = work / "sim" / "targets.json"
        wait_for(lambda: targets.exists() or simulator.poll() is not None, 150,
                 "the simulator's targets file", interval=0.5)
        assert simulator.poll() is None, (work / "simulate.log").read_text()
        rules = stack.rules_dir(work, "5s", {"hang_window_seconds": HANG_WINDOW})
        managers = [stack.start_alertmanager(
            alertmanager_bin, work / f"alertmanager-{i}",
            stack.alertmanager_config(r.url, group_wait="1s", group_interval="2s"))
            for i, r in enumerate(receivers)]
        servers += managers
        servers.append(stack.start_prometheus(
            binaries["prometheus"], work / "prometheus",
            stack.prometheus_config(targets, rules, managers[0].url.removeprefix("http://"),
                                    INTERVAL)))

        def start(name: str, args: list[str]) -> None:
            log = work / f"{name}.log"
            with open(log, "ab") as handle:
                process = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL)
            processes.append(process)
            url = "http://" + next(a for a in args if a.startswith("-httpListenAddr="))
            _wait_ready(url.replace("-httpListenAddr=", ""), process, log)

        old, new = _listen("victoriametrics")
        vm_url = "http://" + new.split("=", 1)[1]
        start("victoria-metrics", [binaries["victoria-metrics"], *compose_command(
            "victoriametrics", {old: new, "/storage": str(work / "vm-data")}),
            f"-search.latencyOffset={LATENCY_OFFSET}"])
        scrape = yaml.safe_load((DEPLOY / "vmagent.yml").read_text())
        scrape["global"]["scrape_interval"] = scrape["global"]["scrape_timeout"] = INTERVAL
        scrape["scrape_configs"][0]["file_sd_configs"][0]["files"] = [str(targets)]
        (work / "vmagent.yml").write_text(yaml.safe_dump(scrape))
        shards = []
        for shard in ("vmagent-0", "vmagent-1"):
            old, new = _listen(shard)
            start(shard, [binaries["vmagent"], *compose_command(shard, {
                old: new, "http://victoriametrics:8428": vm_url,
                "/etc/vmagent/vmagent.yml": str(work / "vmagent.yml"),
                "/vmagent-data": str(work / f"{shard}-data"), "cluster=my-cluster": "cluster=sim"})])
            shards.append("http://" + new.split("=", 1)[1])
        old, new = _listen("vmalert")
        start("vmalert", [binaries["vmalert"], *compose_command("vmalert", {
            old: new, "http://victoriametrics:8428": vm_url,
            "http://alertmanager:9093": managers[1].url,
            "/etc/llmmon/rules": str(rules), "-evaluationInterval=15s": f"-evaluationInterval={INTERVAL}"})])
        yield Stacks(Route(receivers[0]), Route(receivers[1]), shards, time.monotonic(), vm_url,
                     rules)
    finally:
        for process in reversed(processes):
            stop_process(process)
        for server in reversed(servers):
            server.stop()
        stop_process(simulator, 30)
        for entry in json.loads((work / "sim" / "exporters.json").read_text()) \
                if (work / "sim" / "exporters.json").exists() else []:
            try:
                if b"llmmon" in Path(f"/proc/{entry['pid']}/cmdline").read_bytes():
                    os.kill(entry["pid"], 9)
            except OSError:
                pass
        for receiver in receivers:
            receiver.close()
        shutil.rmtree(work, ignore_errors=True)


def _active_targets(url: str) -> list[str]:
    with urllib.request.urlopen(url + "/api/v1/targets", timeout=5) as response:
        active = json.load(response)["data"]["activeTargets"]
    return sorted(t["labels"]["node"] for t in active)


def test_the_vmagent_shards_split_the_targets_between_them(stacks: Stacks) -> None:
    """Both shards load the whole target file; each scrapes only what vmagent's cluster hashing
    of the target's labels gives it. Which shard gets which node depends on the simulator's
    random ports (both can fall to one shard: a run once saw that), so what is checked is the
    split: every node scraped by exactly one shard (a shard ignoring its memberNum would make
    it twice, and this wait would never end)."""
    def split() -> list[list[str]] | None:
        shards = [_active_targets(url) for url in stacks.vmagents]
        return shards if sum(map(len, shards)) == 2 else None

    shards = wait_for(split, stacks.started + 60 - time.monotonic(), "the shards' targets",
                      interval=0.5)
    assert sorted(n for shard in shards for n in shard) == ["sim-00", "sim-01"], shards


def test_hang_pages_the_same_through_vmalert_as_through_prometheus(stacks: Stacks) -> None:
    deadline = stacks.started + DEADLINE
    expected = wait_for(stacks.prometheus.hang, deadline - time.monotonic(),
                        "LLMTrainingHang through Prometheus", interval=0.5)
    got = wait_for(stacks.victoria.hang, deadline - time.monotonic(),
                   "LLMTrainingHang through vmalert", interval=0.5)
    assert expected.labels["node"] == "sim-00"
    # vmalert adds the name of the rule group as `alertgroup`; every other label is the same.
    assert {k: v for k, v in got.labels.items() if k != "alertgroup"} == expected.labels
    # The description is rendered by each ruler's own template queries; the one part that
    # depends on when it was evaluated is how long the group has completed nothing: at least
    # the daemon's stall floor (10 s), below which no hang pages, whichever ruler renders it
    # (the daemon's learned threshold can page before the window).
    # (humanizeDuration: "3m 5s", and "45.23s" under a minute)
    stalled = re.compile(r"completed nothing for (?:(\d+)m )?(\d+(?:\.\d+)?)s")
    for alert in (expected, got):
        found = stalled.search(alert.annotations["description"])
        assert found, alert.annotations["description"]
        minutes, seconds = found.groups()
        assert int(minutes or 0) * 60 + float(seconds) >= 10, alert.annotations["description"]
    assert stalled.sub("completed nothing for ...", got.annotations["description"]) == \
        stalled.sub("completed nothing for ...", expected.annotations["description"])
    assert {k: v for k, v in got.annotations.items() if k != "description"} == \
        {k: v for k, v in expected.annotations.items() if k != "description"}


# Families with one series per rank (or per rank and group): what a rule must not read for the
# whole fleet when one job hangs.  (The cheap question itself reads one more, each rank's
# last-progress time: "has the group completed nothing for the hang window".)
PER_RANK = re.compile(r"llmmon_nccl_last_(enqueued|started|completed)_seq|llmmon_rank_\w+")
FETCH = re.compile(r"^fetch matching series: filters=\[\{(.*)\}\]")
FILTER = re.compile(r'([a-zA-Z_]+)(=~|!~|!=|=)"((?:[^"\\]|\\.)*)"')


def _query(url: str, expr: str, **extra: str) -> dict:
    params = urllib.parse.urlencode({"query": expr, **extra})
    with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=30) as response:
        return json.load(response)


def _fetches(trace: dict) -> Iterator[list[tuple[str, str, str]]]:
    """The label filters of every series fetch in a VictoriaMetrics query trace."""
    found = FETCH.match(trace.get("message", ""))
    if found:
        yield FILTER.findall(found.group(1))
    for child in trace.get("children") or ():
        yield from _fetches(child)


def _reads(filters: list[tuple[str, str, str]], job: str) -> bool:
    """Whether a fetch with these filters reads series of `job`."""
    for label, op, value in filters:
        if label == "job_id" and (op == "=" and value != job
                                  or op == "=~" and not re.fullmatch(value, job)):
            return False
    return True


def test_the_hang_rules_read_the_ranks_of_the_stalled_job_only(stacks: Stacks) -> None:
    """Every LLMTrainingHang and LLMTrainingNetworkSlow rule asks its cheap per-group question
    first: VictoriaMetrics (1.79: it evaluates the right side of `and` first and narrows the
    left side's selectors to the label values it returned) then reads the per-rank series of
    the job that stalled, never those of sim-01's healthy job (docs/capacity.md). Without the
    series of no job, an empty answer to the cheap question narrows nothing. So do the
    per-group recordings the hang rules read (recorded for stalled groups only)."""
    wait_for(stacks.victoria.hang, stacks.started + DEADLINE - time.monotonic(),
             "LLMTrainingHang through vmalert", interval=0.5)
    info = _query(stacks.vm, 'llmmon_rank_info{node="sim-01"}')["data"]["result"]
    healthy = info[0]["metric"]["job_id"]
    rules = [r for g in yaml.safe_load((stacks.rules / "alerts.yaml").read_text())["groups"]
             for r in g["rules"]
             if r.get("alert") in ("LLMTrainingHang", "LLMTrainingNetworkSlow")
             or r.get("record", "").endswith("_stalled")]
    assert len(rules) == 13
    for rule in rules:
        trace = _query(stacks.vm, rule["expr"], trace="1", nocache="1")["trace"]
        per_rank = [f for f in _fetches(trace)
                    if any(k == "__name__" and PER_RANK.fullmatch(v) for k, _, v in f)]
        read = [f for f in per_rank if _reads(f, healthy)]
        assert not read, (rule.get("labels", rule.get("record")), read)
        assert per_rank or rule.get("alert") == "LLMTrainingNetworkSlow", rule.get("labels", rule.get("record"))
