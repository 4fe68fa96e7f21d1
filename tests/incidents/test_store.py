"""The reading side: only complete incidents of ours, safe names, no symbolic link, capped reads,
and one bad incident never hides the others."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from llmmon.incidents import layout
from llmmon.incidents.store import (BadName, MissingFile, Store, TooLarge, UnknownIncident,
                                    Unreadable)
from tests.incidents.fixtures import JOB, ONSET, incident_id, write_incident

NOBODY = 65534


def ids(store: Store, job_id: str | None = None) -> list[str]:
    return [s["id"] for s in store.list(job_id)]


def test_newest_first_and_by_job(tmp_path: Path) -> None:
    older = write_incident(tmp_path, onset=ONSET).name
    newer = write_incident(tmp_path, onset=ONSET + 3600).name
    other = write_incident(tmp_path, job_id="team-b/bert", onset=ONSET + 60).name
    # Two in the same second: the one completed later first.
    same = write_incident(tmp_path, onset=ONSET + 3600, suffix="000001",
                          files={"summary.json": None}).name
    summary = json.loads((tmp_path / same / "summary.json").read_text())
    summary["completed"] += 1
    (tmp_path / same / "summary.json").write_text(json.dumps(summary))
    store = Store(str(tmp_path))
    assert ids(store) == [same, newer, other, older]
    assert ids(store, JOB) == [same, newer, older]
    assert ids(store, "team-b/bert") == [other] and other.endswith("-team-b_bert-3f2a9c")
    assert ids(store, "nope") == []
    assert store.summary(newer)["culprit"]["ranks"] == [3]


def test_a_missing_root_has_no_incident(tmp_path: Path) -> None:
    assert Store(str(tmp_path / "not-yet")).listing().incidents == []


def test_only_complete_directories_of_ours_are_listed(tmp_path: Path) -> None:
    ours = write_incident(tmp_path).name
    theirs = write_incident(tmp_path, suffix="00000a")
    os.chown(theirs, NOBODY, NOBODY)  # another user's directory, marker and all
    their_marker = write_incident(tmp_path, suffix="00000b")
    os.chown(their_marker / layout.MARKER, NOBODY, NOBODY)
    no_marker = write_incident(tmp_path, suffix="00000c")
    (no_marker / layout.MARKER).unlink()
    marker_dir = write_incident(tmp_path, suffix="00000d")
    (marker_dir / layout.MARKER).unlink()
    (marker_dir / layout.MARKER).mkdir()
    linked_marker = write_incident(tmp_path, suffix="00000e")
    (linked_marker / layout.MARKER).unlink()
    (linked_marker / layout.MARKER).symlink_to(tmp_path / ours / layout.MARKER)
    (tmp_path / incident_id(suffix="00000f")).symlink_to(tmp_path / ours)  # a linked directory
    write_incident(tmp_path, suffix="000010").rename(tmp_path / f".tmp-{incident_id()}x")
    (tmp_path / "not-an-id").mkdir()
    (tmp_path / incident_id(suffix="000011")).write_text("a file")
    store = Store(str(tmp_path))
    listing = store.listing()
    assert [s["id"] for s in listing.incidents] == [ours]
    assert listing.unreadable == []  # what is not ours is not mentioned
    for name in (theirs.name, their_marker.name, no_marker.name, marker_dir.name,
                 linked_marker.name, incident_id(suffix="00000f")):
        with pytest.raises(UnknownIncident):
            store.summary(name)
        with pytest.raises(UnknownIncident):
            store.read(name, layout.KMSG, 1000)


@pytest.mark.parametrize("bad", ["../etc", "20261207T120102Z-x-3f2a9", "x", "",
                                 "20261207T120102Z-a/b-3f2a9c", ".tmp-20261207T120102Z-x-3f2a9c"])
def test_an_id_off_the_pattern_is_unknown(tmp_path: Path, bad: str) -> None:
    with pytest.raises(UnknownIncident, match="not an incident id"):
        Store(str(tmp_path)).summary(bad)


@pytest.mark.parametrize("name", ["../summary.json", "/etc/passwd", "fr/../summary.json",
                                  "fr/rank_x.json", "fr/rank_3.txt", ".llmmon-incident",
                                  "notes.txt", "fr", "fr/", "FR/rank_3.json"])
def test_names_off_the_list_are_refused(tmp_path: Path, name: str) -> None:
    incident = write_incident(tmp_path).name
    with pytest.raises(BadName) as refused:
        Store(str(tmp_path)).read(incident, name, 1000)
    assert refused.value.status == 400


def test_files_are_read_capped_and_never_through_a_link(tmp_path: Path) -> None:
    directory = write_incident(tmp_path)
    store, incident = Store(str(tmp_path)), directory.name
    assert store.read(incident, "kmsg.txt", 1000).startswith(b"[812345.120001] nfs:")
    assert store.read_json(incident, "fr/rank_3.json", 1 << 20)["pg_status"]["0"][
        "last_enqueued_collective"] == 41
    with pytest.raises(TooLarge, match="over 10"):
        store.read(incident, "kmsg.txt", 10)
    with pytest.raises(MissingFile) as missing:
        store.read(incident, "fr/rank_9.json", 1000)
    assert missing.value.status == 404

    secret = tmp_path / "secret"
    secret.write_text("not the incident's")
    (directory / "env.json").unlink()
    (directory / "env.json").symlink_to(secret)
    with pytest.raises(Unreadable, match="env.json"):
        store.read(incident, "env.json", 1000)
    other = tmp_path / "other-fr"
    other.mkdir()
    (other / "rank_0.json").write_text("{}")
    (directory / "fr" / "rank_0.json").unlink()
    os.rename(directory / "fr", tmp_path / "fr-moved")
    (directory / "fr").symlink_to(other)  # a linked folder on the way
    with pytest.raises(Unreadable, match="fr/rank_0.json"):
        store.read(incident, "fr/rank_0.json", 1000)
    (directory / "kmsg.txt").unlink()
    os.mkfifo(directory / "kmsg.txt")  # nobody writes it: must not hang
    with pytest.raises(Unreadable, match="not a regular file"):
        store.read(incident, "kmsg.txt", 1000)
    os.chown(directory / "gpus.json", NOBODY, NOBODY)
    with pytest.raises(Unreadable, match="not a regular file of the daemon's"):
        store.read(incident, "gpus.json", 1 << 20)


@pytest.mark.parametrize("summary, why", [
    (b"{not json", "not JSON"),
    (b"\xff\xfe\x00garbage", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"id": "20200101T000000Z-other-000000"}', "names another incident"),
    (b"[" * 100000 + b"]" * 100000, "nests too deep"),
    (b" " * (1 << 20) + b"{}", "over"),
], ids=["not-json", "not-utf8", "array", "another-id", "deep", "huge"])
def test_a_bad_summary_is_said_and_hides_no_other_incident(tmp_path: Path, summary: bytes,
                                                            why: str) -> None:
    good = write_incident(tmp_path).name
    bad = write_incident(tmp_path, onset=ONSET + 60, suffix="0000aa",
                         files={"summary.json": summary}).name
    store = Store(str(tmp_path))
    listing = store.listing()
    assert [s["id"] for s in listing.incidents] == [good]
    (line,) = listing.unreadable
    assert line.startswith(f"{bad}: ") and why in line
    with pytest.raises(Unreadable, match=why):
        store.summary(bad)


def test_the_tail_of_a_file_starts_at_a_line(tmp_path: Path) -> None:
    lines = b"".join(b"[%d.0] line %d\n" % (i, i) for i in range(1000))
    incident = write_incident(tmp_path, files={"kmsg.txt": lines}).name
    store = Store(str(tmp_path))
    assert store.tail(incident, "kmsg.txt", 1 << 20) == lines
    end = store.tail(incident, "kmsg.txt", 100)
    assert end.startswith(b"[99") and lines.endswith(end) and 80 < len(end) <= 100


def test_an_incident_being_removed_is_not_reported(tmp_path: Path) -> None:
    kept = write_incident(tmp_path).name
    going = write_incident(tmp_path, suffix="0000cc")
    (going / "summary.json").unlink()  # removal has begun; the marker is still there
    listing = Store(str(tmp_path)).listing()
    assert [s["id"] for s in listing.incidents] == [kept] and listing.unreadable == []
