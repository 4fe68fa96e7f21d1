"""Writes the real Flight Recorder dumps under tests/fixtures/incidents/fr/ (see its README).

    PYTHONPATH=exporter:reporter:. python -m tests.incidents.make_fr_dumps [DEST]

`mesh/`: a 4-rank gloo job over a 2x2 DeviceMesh (tests/ranks/meshtrainer.py: groups mesh_dp
{0,2} {1,3} and mesh_tp {0,1} {2,3}, whose Flight Recorder ids differ from their names) under
`llmmon launch`'s environment; rank 3 sleeps before its tp all-reduce of step 5.  Once the
ranks collector's verdict names rank 3, each rank is asked for a dump through the dump pipe
and its reporter writes `rank_<r>.json`, as it does for an incident.
`pickled/`: tests/incidents/p2ptrainer.py, two gloo ranks, rank 1 in a receive rank 0 never
sends; each rank writes torch's pickled dump to `rank_<r>` (ProcessGroupNCCL's naming).  gloo
records no send or receive in the Flight Recorder (torch 2.13): only the all-reduces show.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from llmmon.commands.launch import environment
from llmmon.ranks.dumps import request
from tests.helpers import wait_for
from tests.ranks.jobs import Job, base_env, job_doc, make_collector

HERE = Path(__file__).parent
MESH_TRAINER = HERE.parent / "ranks" / "meshtrainer.py"
P2P_TRAINER = HERE / "p2ptrainer.py"
DEST = HERE.parent / "fixtures" / "incidents" / "fr"
JOB = "mesh-job"


def mesh(tmp: Path, dest: Path) -> None:
    spool, fr_dir, pipe_dir = tmp / "spool", tmp / "fr", tmp / "pipe"
    spool.mkdir()
    env = environment(base_env(), JOB, str(spool), str(fr_dir), str(pipe_dir), 2000,
                      timing=False, dump_on_timeout=False)
    env["PYTHONPATH"] = base_env()["PYTHONPATH"]
    for directory in (fr_dir / JOB, pipe_dir / JOB):
        directory.mkdir(parents=True)
    collector = make_collector(spool, tmp, stall_after="1s", auto_dump="false")
    args = ["--steps", "40", "--compute", "0.02", "--culprit", "3", "--stuck-at", "5"]

    def rooted() -> bool:
        doc = job_doc(collector)
        return bool(doc and doc["verdict"] and doc["verdict"].get("roots") == [3])

    with Job(tmp, 4, args, env, script=MESH_TRAINER):
        wait_for(rooted, 300, "the verdict naming rank 3")
        assert set(request(str(pipe_dir), JOB, [0, 1, 2, 3]).values()) == {"requested"}
        wait_for(lambda: len(list((fr_dir / JOB).glob("*.json"))) == 4, 120, "four dumps")
    collector.close()
    for path in sorted((fr_dir / JOB).glob("*.json")):
        shutil.copyfile(path, dest / f"rank_{path.stem.rsplit('_', 1)[-1]}.json")


def pickled(tmp: Path, dest: Path) -> None:
    out = tmp / "out"
    with Job(tmp, 2, ["--after", "8"], base_env(), script=P2P_TRAINER):
        wait_for(lambda: all((out / f"rank_{r}").exists() for r in (0, 1)), 120, "two dumps")
    for rank in (0, 1):
        shutil.copyfile(out / f"rank_{rank}", dest / f"rank_{rank}")


def main() -> None:
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else DEST
    for name, make in (("mesh", mesh), ("pickled", pickled)):
        (dest / name).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            make(Path(tmp), dest / name)
        print(f"wrote {dest / name}: {sorted(p.name for p in (dest / name).iterdir())}")


if __name__ == "__main__":
    main()
