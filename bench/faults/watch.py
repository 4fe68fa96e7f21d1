"""What each source says about a job: the daemons' /api/v1/ranks, `llmmon diagnose`, the pages.

Each reader turns a source's answer into (text about the job, ranks it blames).  A source that
calls every rank of a job down at once is describing a job that ended, not blaming a rank.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any, Iterable

from bench.faults.classes import ranks_in
from llmmon import cli

VERDICT_KEYS = ("verdict", "cause", "explanation", "doing", "state", "stack", "ended", "exited")


def _strings(value: Any, keys: tuple[str, ...], inside: bool = False) -> Iterable[str]:
    """String values under any of `keys` (at any depth)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, keys, inside or any(k in key for k in keys))
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, keys, inside)
    elif inside and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        yield str(value)


QUIET = "stuck before its next collective"  # a quiet hang names every rank, and is no end


def _job_ended(blamed: set[int], world: int) -> set[int]:
    """No rank is blamed when all of them are (a job that ended), unless the job has only one."""
    return set() if world > 1 and len(blamed) >= world else blamed


def api(ranks: dict[str, dict[str, Any]], job_id: str, world: int) -> tuple[str, set[int]]:
    """The job's stalled groups, its end, down ranks and any verdicts, over both daemons."""
    lines: list[str] = []
    blamed: set[int] = set()
    quiet: set[int] = set()  # ranks a quiet hang names: all of them may be, and rightly
    down: set[int] = set()
    up = 0
    for node, answer in sorted(ranks.items()):
        for job in answer.get("jobs", []):
            if job.get("job_id") != job_id:
                continue
            end = job.get("end")
            if end:  # the daemon's verdict on the job's end: the rank named first is blamed
                lines.append(f"{node}: {end['summary']}")
                blamed |= set(end.get("first", []))
            for rank in job.get("ranks", []):
                if rank.get("up"):
                    up += 1
                elif not rank.get("exit"):  # an ended rank is in the end's verdict
                    down.add(rank["rank"])
                    lines.append(f"{node}: rank {rank['rank']} down, report age "
                                 f"{rank.get('report_age_seconds')} s")
            verdict = job.get("verdict")
            if verdict is not None:  # the job's one verdict: its roots are whom it blames
                if verdict.get("stalled"):
                    lines.append(f"{node}: {verdict['summary']}")
                    (quiet if QUIET in verdict["summary"] else blamed).update(
                        verdict.get("roots", []))
            for group in job.get("groups", []):
                if group.get("stalled") and verdict is None:
                    lines.append(f"{node}: {group.get('summary')}")
                    blamed |= set(group.get("behind", [])) | set(group.get("stale", [])) | \
                        set((group.get("desync") or {}).get("odd", [])) | \
                        set(group.get("stopped", []))
                    quiet |= set(group.get("quiet_ranks", []))
            # A rank's own `doing` and `stack` describe every rank, healthy ones included (a
            # slow import shows up there), as the job's `stacks` numbers do; what blames a rank
            # is in the verdict and its exit.
            described = {**job, "groups": None, "verdict": None, "stacks": None, "ranks": [
                {k: v for k, v in rank.items() if k not in ("doing", "stack")}
                for rank in job.get("ranks", [])]}
            for text in _strings(described, VERDICT_KEYS):
                lines.append(f"{node}: {text}")
                blamed |= ranks_in(text)
            for group in job.get("groups", []):  # a group that is not stalled claims nothing
                for text in _strings(group, VERDICT_KEYS) if group.get("stalled") else ():
                    lines.append(f"{node}: {text}")
                if group.get("stalled") and verdict is not None:
                    lines.append(f"{node}: {group.get('summary')}")
    if up:  # some ranks still report: the silent ones are suspects
        blamed |= down
    return "\n".join(lines), _job_ended(blamed, world) | quiet


def _cli(*argv: str) -> str:
    """What `llmmon <argv>` prints (run in this process: no interpreter start per look)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(io.StringIO()):
        try:
            cli.main(list(argv))
        except SystemExit:
            pass
        except Exception as exc:  # noqa: BLE001 (a failing source is a finding here)
            print(f"diagnose {argv} failed: {exc}")
    return buffer.getvalue()


def diagnose_text(url: str) -> list[str]:
    """What `llmmon diagnose` claims on one daemon: the `--ranks` findings marked [CRIT] or
    [WARN], and each suspect check of `--hang` (its summary and each evidence item)."""
    lines = [line.strip() for line in _cli("diagnose", "--url", url, "--ranks").splitlines()
             if line.startswith(("[CRIT]", "[WARN]"))]
    try:
        report = json.loads(_cli("diagnose", "--url", url, "--hang", "--json"))
    except ValueError:
        return lines
    for branch in report.get("branches", []):
        for check in branch.get("checks", []):
            if check.get("verdict") == "suspect":
                head = f"SUSPECT {check.get('title')}"
                lines.append(f"{head}: {check.get('summary')}")
                lines += [f"{head}: {item.get('text')}" for item in check.get("evidence", [])]
    return lines


def diagnose(claims: dict[str, list[str]], job_id: str, world: int) -> tuple[str, set[int]]:
    """The nodes' diagnose claims about the job, and the ranks they blame."""
    lines = [f"{node}: {line}" for node, found in sorted(claims.items()) for line in found
             if job_id in line]
    blamed: set[int] = set()
    quiet: set[int] = set()
    for line in lines:
        (quiet if QUIET in line else blamed).update(ranks_in(line.split(job_id, 1)[1]))
    return "\n".join(lines), _job_ended(blamed, world) | quiet


def pages(notifications: list[Any], job_id: str, receivers: tuple[str, ...]
          ) -> tuple[str, set[int], int]:
    """Firing notifications to `receivers` for the job: text, ranks named, notification count."""
    lines: list[str] = []
    blamed: set[int] = set()
    count = 0
    for note in notifications:
        if note.receiver not in receivers or note.payload.get("status") != "firing":
            continue
        alerts = [a for a in note.payload.get("alerts", [])
                  if a["labels"].get("job_id") == job_id and a["status"] == "firing"]
        if not alerts:
            continue
        count += 1
        for alert in alerts:
            labels = alert["labels"]
            notes = alert["annotations"]
            lines.append(f"{labels.get('alertname')} {labels.get('reason', '')}: "
                         f"{notes.get('description', '')}")
            if "rank" in labels:
                blamed.add(int(labels["rank"]))
            else:
                blamed |= ranks_in(notes.get("description", ""))
    return "\n".join(lines), blamed, count
