"""A benchmark's result is a dated file under docs/benchmarks/ that says when, on what and at
which commit it was measured, and a later run never overwrites an earlier one."""

from __future__ import annotations

import platform
import subprocess
from datetime import datetime, timezone

from bench.common import write_result
from tests.conftest import ROOT


def test_a_result_is_a_dated_file_that_says_when_where_and_at_which_commit(tmp_path) -> None:
    when = datetime(2026, 12, 7, 3, 4, tzinfo=timezone.utc)
    path = write_result("demo", "| figure | value |\n|---|---|\n| p99 | 3.3 ms |\n",
                        title="Demo bench", command="python bench/demo.py --fast", when=when,
                        out_dir=tmp_path)
    assert path == tmp_path / "2026-12-07-demo.md"
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# Demo bench\n")
    assert "| date | 2026-12-07 03:04 UTC |" in text
    assert "| command | `python bench/demo.py --fast` |" in text
    assert "| host cores | " in text
    assert f"| python | {platform.python_version()} |" in text
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    if head:
        assert f"| git commit | {head}" in text
    else:
        assert "| git commit | unknown" in text
    assert text.endswith("| p99 | 3.3 ms |\n")


def test_a_second_result_the_same_day_is_kept_beside_the_first(tmp_path) -> None:
    when = datetime(2026, 12, 7, 3, 4, tzinfo=timezone.utc)
    first = write_result("demo", "first", when=when, out_dir=tmp_path)
    second = write_result("demo", "second", when=when, out_dir=tmp_path)
    assert (first.name, second.name) == ("2026-12-07-demo.md", "2026-12-07-demo-2.md")
    assert first.read_text().endswith("first\n") and second.read_text().endswith("second\n")
