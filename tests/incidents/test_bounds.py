"""The incident directory stays bounded and the daemon's own: byte budgets, the count and the
total, dumps copied only when they are plain files, and other users' look-alikes left alone."""

from __future__ import annotations

import os
from pathlib import Path

from llmmon.incidents import layout
from llmmon.incidents.recorder import (Limits, Recorder, Sources, _Budget, _dump_path,
                                       layout_ours)
from llmmon.sources.fs import RootedFS

NOBODY = 65534


def _incident(root: Path, stamp: str, size: int, owner: int | None = None) -> str:
    name = f"{stamp}-job-a-abc{len(list(root.glob('*'))):03d}"
    path = root / name
    path.mkdir(parents=True)
    (path / layout.MARKER).write_bytes(b"")
    (path / "summary.json").write_bytes(b"x" * size)
    if owner is not None:
        for p in (path, path / layout.MARKER, path / "summary.json"):
            os.chown(p, owner, owner)
    return name


def _recorder(root: Path, **limits: int) -> Recorder:
    bounds = {"max_bytes": 1 << 20, "max_total_bytes": 1 << 30, "keep": 32, **limits}
    return Recorder(str(root), Limits(**bounds),
                    Sources(RootedFS("/proc"), "/nonexistent", "/nonexistent", "/nonexistent",
                            "node-a"))


def test_the_oldest_of_ours_go_beyond_the_count_and_the_total_and_nothing_else(
        tmp_path: Path) -> None:
    oldest = _incident(tmp_path, "20261207T100000Z", 100)
    middle = _incident(tmp_path, "20261207T110000Z", 100)
    foreign = _incident(tmp_path, "20261207T090000Z", 100, owner=NOBODY)  # older, not ours
    newest = _incident(tmp_path, "20261207T120000Z", 100)
    (tmp_path / "20261207T080000Z-job-a-abc999").symlink_to(tmp_path / oldest)
    (tmp_path / f"{layout.TMP_PREFIX}20261207T130000Z-job-a-abc998").mkdir()  # being written
    recorder = _recorder(tmp_path, keep=2)
    recorder.prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [middle, foreign, newest, "20261207T080000Z-job-a-abc999",
         f"{layout.TMP_PREFIX}20261207T130000Z-job-a-abc998"])
    assert (recorder.written.kept, recorder.written.bytes) == (2, 200)

    recorder = _recorder(tmp_path, keep=32, max_total_bytes=150)
    recorder.prune()
    assert sorted(layout_ours(str(tmp_path))) == [newest]
    assert (tmp_path / foreign).is_dir()


def test_an_incident_over_its_budget_lists_what_it_left_out(tmp_path: Path) -> None:
    budget = _Budget(str(tmp_path), 1000)
    budget.text("ranks.json", "r" * 600)
    budget.text("stacks.json", "s" * 600)
    source = tmp_path / "dump"
    source.write_bytes(b"d" * 300)
    assert budget.copy("fr/rank_0.json", str(source))
    assert not budget.copy("fr/rank_1.json", str(source))
    assert budget.files == {"ranks.json": 600, "fr/rank_0.json": 300}
    assert [line.split(":")[0] for line in budget.left_out] == ["stacks.json", "fr/rank_1.json"]
    assert "--collector.incidents.max-bytes" in budget.left_out[0]
    assert not (tmp_path / "stacks.json").exists()


def test_a_dump_that_is_a_link_or_a_pipe_is_not_copied(tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root's secret")
    (tmp_path / "link").symlink_to(secret)
    os.mkfifo(tmp_path / "fifo")
    out = tmp_path / "incident"
    out.mkdir()
    budget = _Budget(str(out), 1 << 20)
    assert not budget.copy("fr/rank_0.json", str(tmp_path / "link"))
    assert not budget.copy("fr/rank_1.json", str(tmp_path / "fifo"))
    assert budget.files == {} and len(budget.errors) == 2
    assert "not a regular file" in budget.errors[1]
    assert not (out / "fr").exists() or not list((out / "fr").iterdir())


def test_a_rank_s_dump_is_found_where_it_was_written_or_in_the_set_it_was_moved_to(
        tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "dump-20261207T100000Z").mkdir(parents=True)
    asked = 1_800_000_000.0
    old = job / "rank_0.json"
    old.write_text("{}")
    os.utime(old, (asked - 60, asked - 60))  # an earlier dump's: not this incident's
    assert _dump_path(str(tmp_path), "job", 0, asked) is None
    moved = job / "dump-20261207T100000Z" / "rank_0.json"
    moved.write_text("{}")
    os.utime(moved, (asked + 1, asked + 1))
    assert _dump_path(str(tmp_path), "job", 0, asked) == str(moved)
    pickled = job / "rank_1"
    pickled.write_bytes(b"\x80\x04")
    os.utime(pickled, (asked + 2, asked + 2))
    assert _dump_path(str(tmp_path), "job", 1, asked) == str(pickled)
    (job / "rank_2.json").symlink_to(moved)
    assert _dump_path(str(tmp_path), "job", 2, asked) is None
    assert _dump_path(str(tmp_path), "no-such-job", 0, asked) is None
