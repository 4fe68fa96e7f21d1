"""The cluster wall's slowest query at fleet size: the GPU power timeline, side by side with the
join it replaced (target: the wall's slowest query under 1 s at 1,000 nodes).

    python bench/wall_query.py --nodes 1000 [--settle 300] [--runs 5]

Serves `--nodes` simulated nodes from `bench/fleet.py`, scraped by vmagent into
VictoriaMetrics (no vmalert: the probe times the store's answer, not a busy ruler's share of
the machine), waits `--settle` seconds, then runs the wall's power timeline query as the
generated dashboard has it and the join of instant-min watts to the power limit that it
replaced, alternated `--runs` times each, at the wall's default range and step.  Prints each
answer's seconds, series and points, and the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capacity  # noqa: E402  (bench/ is not a package: capacity.py imports `common` the same way)

# What the wall read before the node exported the share: every GPU's series joined to its limit.
JOINED = ('llmmon_gpu_power_instant_min_watts{cluster=~".*"} / on (cluster, node, uuid) '
          'group_left llmmon_gpu_power_limit_watts{cluster=~".*"}')


def timeline() -> dict:
    return next(q for q in capacity.dashboard_queries()
                if q["dashboard"] == capacity.DASHBOARDS[0] and "instant power" in q["panel"])


def ask(url: str, expr: str, query: dict) -> tuple[float, int, int]:
    """Seconds, series and most points of `expr` over the wall's range and step."""
    started = time.perf_counter()
    body = json.loads(capacity._get(capacity.query_url(url, query, expr), 60))
    seconds = time.perf_counter() - started
    result = body["data"]["result"]
    return round(seconds, 3), len(result), max((len(r["values"]) for r in result), default=0)


def probe(nodes: int, settle: float, runs: int) -> dict[str, list[tuple[float, int, int]]]:
    query = timeline()
    with capacity.fleet_in_victoria(nodes) as url:
        time.sleep(settle)
        answers: dict[str, list[tuple[float, int, int]]] = {"wall": [], "joined": []}
        for _ in range(runs):
            for name, expr in (("wall", query["expr"]), ("joined", JOINED)):
                answers[name].append(ask(url, expr, query))
                print(name, *answers[name][-1], flush=True)
        return answers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--settle", type=float, default=300.0,
                        help="seconds of data before the queries (default 300)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    answers = probe(args.nodes, args.settle, args.runs)
    for name, runs in answers.items():
        times = [seconds for seconds, _, _ in runs]
        print(f"{name}: median {statistics.median(times):.2f} s "
              f"({min(times):.2f}-{max(times):.2f}), {runs[-1][1]:,} series of "
              f"{runs[-1][2]} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
