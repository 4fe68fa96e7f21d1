"""The dumps of a real stuck mesh job, made afresh as the fixtures were (this torch, this
reporter), tell what the committed ones tell: the fixtures still stand for what torch writes."""

from __future__ import annotations

from pathlib import Path

from llmmon.incidents import frtrace
from tests.incidents.make_fr_dumps import mesh
from tests.incidents.test_frtrace import MESH_LINES


def test_a_fresh_stuck_mesh_job_s_dumps_name_rank_3(tmp_path: Path) -> None:
    work, dest = tmp_path / "work", tmp_path / "fr"
    work.mkdir()
    dest.mkdir()
    mesh(work, dest)
    dumps = [frtrace.parse(r, frtrace.load((dest / f"rank_{r}.json").read_bytes()))
             for r in range(4)]
    analysis = frtrace.analyse(dumps)
    assert analysis.lines() == MESH_LINES
    assert analysis.culprits == (3,)
