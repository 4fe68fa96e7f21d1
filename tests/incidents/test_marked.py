"""A directory counts as the daemon's only when it and its marker are its user's own: the one
rule behind the incidents the daemon lists and prunes and the dump sets it keeps."""

from __future__ import annotations

import os
from pathlib import Path

from llmmon.sources.marked import made_by_us

NOBODY = 65534
MARK = ".ours"


def made(tmp_path: Path, name: str = "made") -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / MARK).write_text("")
    return directory


def test_a_directory_with_its_marker_is_ours_by_path_and_by_descriptor(tmp_path) -> None:
    directory = made(tmp_path)
    assert made_by_us(str(directory), MARK)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert made_by_us(fd, MARK)
    finally:
        os.close(fd)


def test_no_marker_a_linked_marker_or_a_marker_directory_is_not_ours(tmp_path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    (tmp_path / "elsewhere").write_text("")
    (linked / MARK).symlink_to(tmp_path / "elsewhere")
    hollow = tmp_path / "hollow"
    (hollow / MARK).mkdir(parents=True)
    assert not any(made_by_us(str(d), MARK) for d in (bare, linked, hollow))


def test_a_link_to_our_directory_is_not_ours(tmp_path) -> None:
    directory = made(tmp_path)
    (tmp_path / "alias").symlink_to(directory)
    assert not made_by_us(str(tmp_path / "alias"), MARK)
    assert not made_by_us(str(tmp_path / "missing"), MARK)


def test_another_users_directory_or_marker_is_not_ours(tmp_path) -> None:
    theirs, planted = made(tmp_path, "theirs"), made(tmp_path, "planted")
    os.chown(theirs, NOBODY, NOBODY)
    os.chown(planted / MARK, NOBODY, NOBODY)
    assert not made_by_us(str(theirs), MARK)
    assert not made_by_us(str(planted), MARK)
