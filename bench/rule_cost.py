"""What each rule of a group costs VictoriaMetrics at fleet size, side by side with an older render
of the same rules (target: every group under 20 % of its interval at 1,250 nodes).

    python bench/rule_cost.py --nodes 500 [--group G ... | --all-groups] [--recorded]
                              [--hung-jobs 2] [--baseline REV] [--runs 5]

Serves `--nodes` simulated nodes from `bench/fleet.py` (`--hung-jobs` of its 128-rank jobs
look hung), scraped by vmagent into VictoriaMetrics, waits `--settle` seconds, then asks every
rule of each `--group` (alerting and recording) as an instant query (what vmalert sends each
interval), the rule of alerts/rules/ and the same rule as rendered at git revision `--baseline`
alternated, `--runs` times each, with VictoriaMetrics' result cache off.  Prints each rule's
median seconds and series for both and, per group, their sum: what one iteration of the group
asks of the store, rule after rule, with no other group beside it, as a share of its interval.
Both renders must answer the same series: the bench says so when they do not.  Rules that read
series recorded by other rules (a `:` in a metric name) need those written: with `--recorded`,
vmalert evaluates the shipped recording groups that write them (and nothing else) into the
store from the start, and the probe waits until each recorded name the rules read holds series
(or says it does not); without it they are left out.  Rules that read ALERTS are always left
out (nothing here alerts).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capacity  # noqa: E402  (bench/ is not a package: capacity.py imports `common` the same way)
import fleet  # noqa: E402

sys.path.insert(0, str(capacity.ROOT))
from alerts.render import load_thresholds  # noqa: E402

RULES = Path("alerts") / "rules"
RECORDED_WAIT_S = 600.0  # at most, for the recorded series the probed rules read
RECORD_EVERY_S = 60.0  # the longest interval a recording group runs at here
RECORDED = re.compile(r"\b[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]*\b")


def recorded_names(expr: str) -> set[str]:
    """The recorded series (a `:` in the name) an expression reads; ranges (`[5m:1m]`) and
    strings are not names."""
    return set(RECORDED.findall(re.sub(r'\[[^]]*\]|"[^"]*"', "", expr)))


def group_rules(texts: list[str], groups: list[str], recorded: bool) -> list[tuple[str, str]]:
    """("group/rule name", expression) of each rule of `groups` in these rule files that reads
    scraped series only, or (`recorded`) recorded series too; none that reads ALERTS."""
    known = {g["name"]: g["rules"] for text in texts for g in yaml.safe_load(text)["groups"]}
    if missing := [group for group in groups if group not in known]:
        raise SystemExit(f"no rule group {', '.join(missing)} in {RULES}/")
    return [(f"{group}/{rule.get('alert') or rule['record']}", rule["expr"])
            for group in groups for rule in known[group]
            if "ALERTS" not in rule["expr"] and (recorded or not recorded_names(rule["expr"]))]


def intervals(texts: list[str]) -> dict[str, float]:
    """Each group's evaluation interval in seconds."""
    return {g["name"]: capacity.group_seconds(g)
            for text in texts for g in yaml.safe_load(text)["groups"]}


def recording_only(texts: list[str], read: set[str]) -> dict[str, Any]:
    """The recording rules of these rule files, in their groups, without the alerting ones:
    the groups that record a series of `read`, or one those read in turn, each at most every
    RECORD_EVERY_S (the lemon group's 15 minutes would hold the probe that long; what it
    records, hence what the rules over it read, does not depend on how often)."""
    groups = [{**g, "interval": f"{min(RECORD_EVERY_S, capacity.group_seconds(g)):.0f}s",
               "rules": [r for r in g["rules"] if "record" in r]}
              for text in texts for g in yaml.safe_load(text)["groups"]]
    wanted, needed = [], set(read)
    while True:
        more = [g for g in groups if g not in wanted
                and any(r["record"] in needed for r in g["rules"])]
        if not more:
            return {"groups": [g for g in groups if g in wanted]}
        wanted += more
        needed |= {name for g in more for r in g["rules"] for name in recorded_names(r["expr"])}


def rule_files(revision: str | None) -> list[str]:
    """The text of each shipped rule file, now or at a git revision."""
    if revision is None:
        return [path.read_text() for path in sorted((capacity.ROOT / RULES).glob("*.yaml"))]
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{revision}:{RULES}"],
                           cwd=capacity.ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    return [subprocess.run(["git", "show", f"{revision}:{RULES}/{name}"], cwd=capacity.ROOT,
                           capture_output=True, text=True, check=True).stdout
            for name in sorted(names) if name.endswith(".yaml")]


def ask(url: str, expr: str) -> tuple[float, list[dict[str, str]]]:
    """Seconds and the series' labels of `expr` as an instant query now, uncached."""
    params = {"query": expr, "time": f"{time.time():.3f}", "nocache": "1"}
    started = time.perf_counter()
    body = json.loads(capacity._get(f"{url}/api/v1/query?{urllib.parse.urlencode(params)}", 120))
    seconds = time.perf_counter() - started
    return round(seconds, 4), sorted((r["metric"] for r in body["data"]["result"]),
                                     key=lambda m: sorted(m.items()))


def series(url: str, name: str) -> int:
    """How many series of `name` the store holds now."""
    params = {"query": f'count({{__name__="{name}"}})', "nocache": "1"}
    body = json.loads(capacity._get(f"{url}/api/v1/query?{urllib.parse.urlencode(params)}", 120))
    result = body["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


def wait_recorded(url: str, names: list[str]) -> None:
    """Wait until every recorded name holds series, or until no more of them have for two
    RECORD_EVERY_S (at most RECORDED_WAIT_S), and say how many each holds: a rule over an
    empty series costs nothing.  A rule that reads what an earlier rule of its group records
    sees it an iteration later (vmalert writes it remotely), so the straggler score, three
    rules down `llmmon.recording.nccl`, needs three of its minutes; a name may stay empty on
    a healthy fleet."""
    started = time.monotonic()
    grew, counts = started, dict.fromkeys(names, 0)
    while True:
        now = {name: series(url, name) for name in names}
        if sum(map(bool, now.values())) > sum(map(bool, counts.values())):
            grew = time.monotonic()
        counts = now
        if all(counts.values()) or time.monotonic() - grew > 2 * RECORD_EVERY_S \
                or time.monotonic() - started > RECORDED_WAIT_S:
            break
        time.sleep(capacity.SCRAPE_S)
    for name, count in counts.items():
        print(f"recorded {name}: {count} series"
              + ("" if count else " (none: the rules over it cost nothing here)"), flush=True)


def probe(nodes: int, hung_jobs: int, settle: float, runs: int,
          renders: dict[str, list[tuple[str, str]]], recording: Path | None
          ) -> dict[str, list[dict[str, Any]]]:
    with capacity.fleet_in_victoria(nodes, f"--hung-jobs={hung_jobs}",
                                    recording=recording) as url:
        time.sleep(settle)
        # The fleet's jobs have one group each: as many groups as hung jobs must look hung,
        # by each rank's last-progress time and by each group's.
        window = load_thresholds()["hang_window_seconds"].value  # the shipped hang window
        for name in fleet.PROGRESS:
            _, hung = ask(url, f"time() - max by (cluster, job_id, pg) ({name}) > {window}")
            print(f"groups that completed nothing for {window} s by {name}: {len(hung)}"
                  + ("" if len(hung) == hung_jobs else f" (not {hung_jobs}: the run is not valid)"),
                  flush=True)
        wait_recorded(url, sorted({name for rules in renders.values() for _, expr in rules
                                   for name in recorded_names(expr)}))
        found: dict[str, list[dict[str, Any]]] = {name: [] for name in renders}
        for index in range(len(next(iter(renders.values())))):
            times: dict[str, list[float]] = {name: [] for name in renders}
            answers: dict[str, list[dict[str, str]]] = {}
            for _ in range(runs):
                for name, rules in renders.items():
                    seconds, answers[name] = ask(url, rules[index][1])
                    times[name].append(seconds)
            for name, rules in renders.items():
                found[name].append({"rule": f"{index}:{rules[index][0]}",
                                    "median_s": statistics.median(times[name]),
                                    "series": len(answers[name]), "answer": answers[name]})
            print(*(f"{name} {found[name][-1]['rule']} {found[name][-1]['median_s']:.3f} s "
                    f"{found[name][-1]['series']} series" for name in renders), sep=" | ",
                  flush=True)
        return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--hung-jobs", type=int, default=0)
    parser.add_argument("--group", action="append",
                        help="a rule group to cost (repeat for several; default llmmon.training)")
    parser.add_argument("--all-groups", action="store_true", help="cost every shipped group")
    parser.add_argument("--baseline", default="HEAD", help="git revision of the older render")
    parser.add_argument("--settle", type=float, default=120.0,
                        help="seconds of data before the queries (default 120)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--recorded", action="store_true",
                        help="vmalert records the shipped recording rules into the store, and "
                        "the rules that read them are costed too")
    args = parser.parse_args()
    now = rule_files(None)
    every = intervals(now)
    groups = list(every) if args.all_groups else args.group or ["llmmon.training"]
    renders = {args.baseline: group_rules(rule_files(args.baseline), groups, args.recorded),
               "now": group_rules(now, groups, args.recorded)}
    if [n for n, _ in renders["now"]] != [n for n, _ in renders[args.baseline]]:
        parser.error(f"the two renders of {', '.join(groups)} have different rules")
    with tempfile.TemporaryDirectory(prefix="llmmon-rule-cost-") as work:
        recording = None
        read = {name for _, expr in renders["now"] for name in recorded_names(expr)}
        if args.recorded and read:  # nothing to record when the rules read no recorded series
            recording = Path(work) / "recording.yaml"
            recording.write_text(yaml.safe_dump(recording_only(now, read), sort_keys=False))
        found = probe(args.nodes, args.hung_jobs, args.settle, args.runs, renders, recording)
    for name, rules in found.items():
        for group in groups:  # what an iteration of the group asks, one rule after another
            mine = [r["median_s"] for r in rules if r["rule"].split(":", 1)[1].startswith(
                f"{group}/")]
            print(f"{name} {group}: {sum(mine):.2f} s for {len(mine)} rules "
                  f"({100 * sum(mine) / every[group]:.0f} % of its {every[group]:.0f} s)")
    differ = [rule["rule"] for rule, other in zip(*found.values())
              if rule["answer"] != other["answer"]]
    print("the renders answer the same series" if not differ else
          f"the renders answer different series: {', '.join(differ)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
