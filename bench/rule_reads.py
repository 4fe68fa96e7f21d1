"""Series each rule selects, per node and minute: a cost model of the shipped rules that no load
on the machine can blur.

    python bench/rule_reads.py [--exposition bench/results/fleet-node.prom] [--rules alerts/rules]
                               [--top 20] [--json OUT]

For every rule of the rendered rule files: the series of one node's exposition (by default the
budget node `bench/fleet.py` serves N times) that the rule's selectors match, times how many
times a minute its group runs (15 s when the group sets no interval, as deploy/prometheus
evaluates). Prometheus reads every selector of a rule whatever the other side of an `and` holds,
and at fleet size its CPU goes to finding and reading series (docs/capacity.md), so this is what
a rule asks of its head for each node, per minute. Not counted: series the store adds (`up`,
`ALERTS`) and recordings (a recording is a few series per job or group, not per node).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from llmmon.options import parse_duration  # noqa: E402

EVALUATION_INTERVAL_S = 15.0
SELECTOR = re.compile(r"(?<![\w:])(llmmon_\w+)(?:\{([^}]*)\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')

Series = list[tuple[str, dict[str, str]]]


def node_series(text: str) -> Series:
    """Every sample of an exposition: (name, labels)."""
    return [(sample.name, sample.labels) for family in text_string_to_metric_families(text)
            for sample in family.samples]


def _matches(labels: dict[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    for label, op, value in matchers:
        have = labels.get(label, "")
        hit = re.fullmatch(value, have) is not None if op in ("=~", "!~") else have == value
        if hit != (op in ("=", "=~")):
            return False
    return True


def selected(expr: str, series: Series) -> int:
    """Series of one node that the selectors of `expr` match, each selector counted."""
    return sum(1 for name, body in SELECTOR.findall(expr)
               for matchers in [MATCHER.findall(body)]
               for have, labels in series if have == name and _matches(labels, matchers))


def rule_reads(rule_files: list[Path], series: Series) -> list[dict]:
    """One row a rule: its group, name, series per evaluation and per minute."""
    rows = []
    for path in rule_files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            per_minute = 60.0 / parse_duration(group.get("interval", EVALUATION_INTERVAL_S))
            for index, rule in enumerate(group["rules"]):
                reason = rule.get("labels", {}).get("reason")
                name = rule.get("alert") or rule["record"]
                each = selected(rule["expr"], series)
                rows.append({"group": group["name"], "index": index,
                             "rule": f"{name} ({reason})" if reason else name,
                             "per_evaluation": each, "per_minute": each * per_minute})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exposition", type=Path,
                        default=ROOT / "bench" / "results" / "fleet-node.prom",
                        help="one node's /metrics (bench/fleet.py records it: run it once)")
    parser.add_argument("--rules", type=Path, default=ROOT / "alerts" / "rules")
    parser.add_argument("--top", type=int, default=20, help="rules to list (default 20)")
    parser.add_argument("--json", type=Path, help="write every row here")
    args = parser.parse_args(argv)
    try:
        series = node_series(args.exposition.read_text())
    except OSError as e:
        parser.error(f"--exposition: {e}")
    files = sorted(args.rules.glob("*.yaml"))
    if not files:
        parser.error(f"--rules: no *.yaml in {args.rules}")
    rows = rule_reads(files, series)
    groups: Counter[str] = Counter()
    for row in rows:
        groups[row["group"]] += row["per_minute"]
    print(f"{len(series)} series a node; the rules select {sum(groups.values()):,.0f} of them "
          "a minute (each selector counted)")
    for group, total in groups.most_common():
        print(f"  {total:8,.0f}  {group}")
    for row in sorted(rows, key=lambda r: -r["per_minute"])[:args.top]:
        print(f"  {row['per_minute']:8,.0f}  {row['per_evaluation']:5d} an evaluation  "
              f"{row['group']}: {row['rule']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
