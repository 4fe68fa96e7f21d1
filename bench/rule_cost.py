"""What each rule of a group costs VictoriaMetrics at fleet size, side by side with an older render
of the same rules (issue 16: every group under 20 % of its interval at 1,250 nodes).

    python bench/rule_cost.py --nodes 500 [--hung-jobs 2] [--baseline REV] [--runs 5]

Serves `--nodes` simulated nodes from `bench/fleet.py` (`--hung-jobs` of its 128-rank jobs
look hung), scraped by vmagent into VictoriaMetrics, waits `--settle` seconds, then asks every
alerting rule of `--group` as an instant query (what vmalert sends each interval), the rule of
alerts/rules/ and the same rule as rendered at git revision `--baseline` alternated, `--runs`
times each, with VictoriaMetrics' result cache off.  Prints each rule's median seconds and
series for both, and the sums.  Both renders must answer the same series: the bench says so
when they do not.  Rules that read series recorded by other rules (a `:` in a metric name) or
ALERTS are left out: without vmalert nothing writes them.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
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

RULES = Path("alerts") / "rules" / "alerts.yaml"
RECORDED = re.compile(r"[a-z_]+:[a-z_:]+|\bALERTS\b")


def alerts(text: str, group: str) -> list[tuple[str, str]]:
    """(alert name, expression) of each alerting rule of `group` that reads scraped series only."""
    rules = next(g["rules"] for g in yaml.safe_load(text)["groups"] if g["name"] == group)
    return [(r["alert"], r["expr"]) for r in rules
            if "alert" in r and not RECORDED.search(re.sub(r"\[[^]]*\]", "", r["expr"]))]


def ask(url: str, expr: str) -> tuple[float, list[dict[str, str]]]:
    """Seconds and the series' labels of `expr` as an instant query now, uncached."""
    params = {"query": expr, "time": f"{time.time():.3f}", "nocache": "1"}
    started = time.perf_counter()
    body = json.loads(capacity._get(f"{url}/api/v1/query?{urllib.parse.urlencode(params)}", 120))
    seconds = time.perf_counter() - started
    return round(seconds, 4), sorted((r["metric"] for r in body["data"]["result"]),
                                     key=lambda m: sorted(m.items()))


def probe(nodes: int, hung_jobs: int, settle: float, runs: int,
          renders: dict[str, list[tuple[str, str]]]) -> dict[str, list[dict[str, Any]]]:
    with capacity.fleet_in_victoria(nodes, f"--hung-jobs={hung_jobs}") as url:
        time.sleep(settle)
        # The fleet's jobs have one group each: as many groups as hung jobs must look hung,
        # by each rank's last-progress time and by each group's.
        window = load_thresholds()["hang_window_seconds"].value  # the shipped hang window
        for name in fleet.PROGRESS:
            _, hung = ask(url, f"time() - max by (cluster, job_id, pg) ({name}) > {window}")
            print(f"groups that completed nothing for {window} s by {name}: {len(hung)}"
                  + ("" if len(hung) == hung_jobs else f" (not {hung_jobs}: the run is not valid)"),
                  flush=True)
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
    args = parser.parse_args()
    old = subprocess.run(["git", "show", f"{args.baseline}:{RULES}"], cwd=capacity.ROOT,
                         capture_output=True, text=True, check=True).stdout
    renders = {args.baseline: alerts(old, args.group),
               "now": alerts((capacity.ROOT / RULES).read_text(), args.group)}
    if [n for n, _ in renders["now"]] != [n for n, _ in renders[args.baseline]]:
        parser.error(f"the two renders of {args.group} have different alerting rules")
    found = probe(args.nodes, args.hung_jobs, args.settle, args.runs, renders)
    for name, rules in found.items():
        print(f"{name}: {sum(r['median_s'] for r in rules):.2f} s for {len(rules)} rules")
    differ = [rule["rule"] for rule, other in zip(*found.values())
              if rule["answer"] != other["answer"]]
    print("the renders answer the same series" if not differ else
          f"the renders answer different series: {', '.join(differ)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
