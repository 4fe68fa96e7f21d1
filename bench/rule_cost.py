"""What each rule of a group costs VictoriaMetrics at fleet size, side by side with an older render
of the same rules (issue 16: every group under 20 % of its interval at 1,250 nodes).

    python bench/rule_cost.py --nodes 500 [--group G] [--recorded] [--hung-jobs 2]
                              [--baseline REV] [--runs 5]

Serves `--nodes` simulated nodes from `bench/fleet.py` (`--hung-jobs` of its 128-rank jobs
look hung), scraped by vmagent into VictoriaMetrics, waits `--settle` seconds, then asks every
rule of `--group` (alerting and recording) as an instant query (what vmalert sends each
interval), the rule of alerts/rules/ and the same rule as rendered at git revision `--baseline`
alternated, `--runs` times each, with VictoriaMetrics' result cache off.  Prints each rule's
median seconds and series for both, and the sums.  Both renders must answer the same series:
the bench says so when they do not.  Rules that read series recorded by other rules (a `:` in
a metric name) need those written: with `--recorded`, vmalert evaluates the shipped recording
groups that write them (and nothing else) into the store from the start, and the probe waits for
each to have run once; without it they are left out.  Rules that read ALERTS are
always left out (nothing here alerts).
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
RECORDED = re.compile(r"\b[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]*\b")


def recorded_names(expr: str) -> set[str]:
    """The recorded series (a `:` in the name) an expression reads; ranges (`[5m:1m]`) and
    strings are not names."""
    return set(RECORDED.findall(re.sub(r'\[[^]]*\]|"[^"]*"', "", expr)))


def group_rules(texts: list[str], group: str, recorded: bool) -> list[tuple[str, str]]:
    """(rule name, expression) of each rule of `group` in these rule files that reads scraped
    series only, or (`recorded`) recorded series too; none that reads ALERTS."""
    found = [g["rules"] for text in texts for g in yaml.safe_load(text)["groups"]
             if g["name"] == group]
    if not found:
        raise SystemExit(f"no rule group {group!r} in {RULES}/")
    kept = []
    for rule in found[0]:
        if "ALERTS" not in rule["expr"] and (recorded or not recorded_names(rule["expr"])):
            kept.append((rule.get("alert") or rule["record"], rule["expr"]))
    return kept


def recording_only(texts: list[str], read: set[str]) -> dict[str, Any]:
    """The recording rules of these rule files, in their groups, without the alerting ones:
    the groups that record a series of `read`, or one those read in turn."""
    groups = [{**g, "rules": [r for r in g["rules"] if "record" in r]}
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
        read = sorted({name for rules in renders.values() for _, expr in rules
                       for name in recorded_names(expr)})
        for name in read:  # a rule that reads a series nobody recorded costs nothing here
            print(f"recorded {name}: {series(url, name)} series", flush=True)
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
    parser.add_argument("--group", default="llmmon.training")
    parser.add_argument("--baseline", default="HEAD", help="git revision of the older render")
    parser.add_argument("--settle", type=float, default=120.0,
                        help="seconds of data before the queries (default 120)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--recorded", action="store_true",
                        help="vmalert records the shipped recording rules into the store, and "
                        "the rules that read them are costed too")
    args = parser.parse_args()
    now = rule_files(None)
    renders = {args.baseline: group_rules(rule_files(args.baseline), args.group, args.recorded),
               "now": group_rules(now, args.group, args.recorded)}
    if [n for n, _ in renders["now"]] != [n for n, _ in renders[args.baseline]]:
        parser.error(f"the two renders of {args.group} have different rules")
    with tempfile.TemporaryDirectory(prefix="llmmon-rule-cost-") as work:
        recording = None
        if args.recorded:
            recording = Path(work) / "recording.yaml"
            read = {name for _, expr in renders["now"] for name in recorded_names(expr)}
            recording.write_text(yaml.safe_dump(recording_only(now, read), sort_keys=False))
        found = probe(args.nodes, args.hung_jobs, args.settle, args.runs, renders, recording)
    for name, rules in found.items():
        print(f"{name}: {sum(r['median_s'] for r in rules):.2f} s for {len(rules)} rules")
    differ = [rule["rule"] for rule, other in zip(*found.values())
              if rule["answer"] != other["answer"]]
    print("the renders answer the same series" if not differ else
          f"the renders answer different series: {', '.join(differ)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
