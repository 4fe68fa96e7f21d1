"""The report for people: one line per branch and check, evidence beneath, runbook links for
what is suspect.  Renders the JSON form, so a report fetched from a daemon prints the same."""

from __future__ import annotations

import time
from typing import Any

from llmmon.diagnose.branches import TREE

NUMBER = {branch.id: number for number, branch in enumerate(TREE, 1)}  # the tree's order
MARK = {"ok": "ok", "suspect": "SUSPECT", "unknown": "no data"}


def _source(source: dict[str, Any]) -> str:
    where = f"{source['kind']} {source['url']}"
    if source["kind"] == "prometheus":
        return f"{where} (cluster, rates over up to {source['window_seconds']:.0f} s)"
    return (f"{where} ({source['scope']}, {source['observations']} observations over "
            f"{source['window_seconds']:.0f} s)")


def text(report: dict[str, Any]) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(report["generated_at"]))
    head = MARK[report["verdict"]]
    if report["suspects"]:
        head += ": " + ", ".join(report["suspects"])
    lines = [f"llmmon diagnose {stamp}: {head}", f"source: {_source(report['source'])}", ""]
    for branch in report["branches"]:
        lines.append(f"{NUMBER[branch['id']]}. {branch['title']} [{MARK[branch['verdict']]}] "
                     f"{branch['question']}")
        for check in branch["checks"]:
            lines.append(f"   {MARK[check['verdict']]:<8} {check['title']}: {check['summary']}")
            lines += [f"            - {item['text']}" for item in check["evidence"]]
            if check["verdict"] == "suspect":
                lines.append(f"            runbook: {check['runbook']}")
        lines.append("")
    return "\n".join(lines)
