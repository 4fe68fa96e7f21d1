"""Hostile spool input: refused or sanitised, counted once, never a crash or a runaway label.

tests/fixtures/spool/bad holds truncated, binary, mistyped and out-of-range documents, label
values with quotes, newlines and 10 kB strings, a job id that tries to climb out of the spool,
and a good rank whose entries are mixed with bad ones.  Links, FIFOs, oversized and duplicate
files are made here, because git should not carry them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from llmmon.ranks.validate import LABEL_RULES
from tests.conftest import FIXTURES
from tests.ranks.jobs import by_rank, make_collector, scrape, series

SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.:,=+@-]*$")


def hostile_spool(tmp: Path) -> Path:
    spool = tmp / "spool"
    shutil.copytree(FIXTURES / "spool" / "bad", spool)
    good = spool / "good"
    (good / "rank_7.1007.json").symlink_to("/etc/passwd")
    (spool / "linked").symlink_to(good)
    os.mkfifo(good / "rank_8.1008.json")  # opening it would block: it must never be opened
    with open(good / "rank_9.1009.json", "wb") as huge:
        huge.truncate((16 << 20) + 1)
    (good / "rank_10.1010.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    # rank 6 claimed by two live processes: the newer file wins, the other is a duplicate
    template = (good / "rank_0.1000.json").read_text()
    for pid, age in ((1006, 3.0), (1106, 1.0)):
        path = good / f"rank_6.{pid}.json"
        path.write_text(template.replace('"rank":0', '"rank":6').replace('"pid":1000',
                                                                          f'"pid":{pid}'))
        written = time.time() - age
        os.utime(path, (written, written))
    return spool


def test_hostile_files_are_refused_sanitised_and_counted_once(tmp_path: Path) -> None:
    spool = hostile_spool(tmp_path)
    now = time.time()
    for path in spool.rglob("*.json"):
        if path.is_file() and not path.is_symlink() and "rank_6." not in path.name:
            os.utime(path, (now - 2, now - 2))
    collector = make_collector(spool, tmp_path)
    samples, ctx, text = scrape(collector, now)

    rejected = {dict(k)["reason"]: v for k, v in
                series(samples, "llmmon_ranks_spool_rejected_total").items()}
    assert rejected == {"invalid_json": 3, "schema": 2, "identity_mismatch": 1, "symlink": 2,
                        "unexpected": 2, "too_large": 1, "duplicate": 1, "bad_entry": 1}
    assert len(ctx.errors) == sum(rejected.values())
    sanitised = {dict(k)["field"]: v for k, v in
                 series(samples, "llmmon_ranks_labels_sanitised_total").items()}
    assert sanitised == {"job_id": 2, "pod": 1, "namespace": 1, "uuid": 1,
                         "allocator_config": 1, "pg": 1, "pg_desc": 1}

    # The good rank is whole: its one good entry counted, the six bad ones dropped.
    assert by_rank(samples, "llmmon_rank_up", job_id="good") == {0: 1, 4: 1, 6: 1}
    assert by_rank(samples, "llmmon_nccl_collective_bytes_total", job_id="good") == {0: 2048}
    assert by_rank(samples, "llmmon_nccl_collective_duration_seconds_count",
                   job_id="good") == {0: 1}
    info = {int(dict(k)["rank"]): dict(k) for k in series(samples, "llmmon_rank_info",
                                                          job_id="good")}
    assert info[6]["pid"] == "1106"
    # The job id that tried to climb out is just a label now, and only where its files are.
    assert set(by_rank(samples, "llmmon_rank_up", job_id="_.._etc")) == {1}

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for label, value in sample.labels.items():
                assert SAFE_VALUE.match(value), (label, value)
                limit = LABEL_RULES[label][1] if label in LABEL_RULES else 256
                assert len(value) <= limit, (label, len(value))
    assert info[4]["pod"].startswith("pod___llmmon_rank_up_job_id__x___1_")
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                          capture_output=True, timeout=30)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    # A second read of the same files counts nothing again, and keeps each problem active
    # (the files are still there: not "recovered").
    problems = set(ctx.errors)
    samples, ctx, _ = scrape(collector, now + 1)
    assert ctx.error_count == 0 and set(ctx.errors) == problems
    assert {dict(k)["reason"]: v for k, v in
            series(samples, "llmmon_ranks_spool_rejected_total").items()} == rejected


def test_budgets_bound_files_and_ranks(tmp_path: Path) -> None:
    spool = hostile_spool(tmp_path)
    few_files = scrape(make_collector(spool, tmp_path, max_files=2))[0]
    assert series(few_files, "llmmon_ranks_spool_rejected_total", reason="too_many")
    few_ranks = scrape(make_collector(spool, tmp_path, max_ranks=1))[0]
    assert len(series(few_ranks, "llmmon_rank_up")) == 1
    assert series(few_ranks, "llmmon_ranks_spool_rejected_total", reason="too_many_ranks")
