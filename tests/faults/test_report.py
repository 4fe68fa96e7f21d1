"""The fault benchmark's table header: which run, how, measured which classes."""

from __future__ import annotations

from bench.faults.run import measured


def _meta(finished: str, parallel: int, classes: list[str]) -> dict:
    return {"finished": finished, "machine": "2 CPUs, load 0.4", "parallel": parallel,
            "healthy_s": 1800.0, "classes": classes}


def test_a_table_of_several_runs_says_how_each_was_made() -> None:
    """A rerun of a few classes replaces their rows: the header names each run's own settings,
    not the first run's for all of them."""
    text = measured([_meta("2026-12-05 23:03 UTC", 2, ["loader", "healthy"]),
                     _meta("2026-12-06 06:04 UTC", 3, ["loader", "lock"])])
    first, second = text.split("; then ")
    assert "`--parallel 2`, healthy run 1800 s, classes `loader,healthy`" in first
    assert "`--parallel 3`, classes `loader,lock`" in second and "healthy run" not in second
    assert text.endswith("A class of a later run replaces the earlier run's row.")


def test_one_run_is_one_sentence() -> None:
    assert measured([_meta("2026-12-06 06:04 UTC", 3, ["lock"])]) == (
        "Measured 2026-12-06 06:04 UTC on 2 CPUs, load 0.4, `--parallel 3`, classes `lock`.")
