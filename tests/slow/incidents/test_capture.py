"""A real hang becomes one incident on the node, without anybody asking: rank 2 of a 3-rank gloo
job stops issuing collectives; `llmmon serve` writes the job's evidence (its verdict, the
ranks' stacks and environment, every rank's Flight Recorder dump, the kernel log since the
stall) into one directory, once. An abnormal end's incident (a rank's exit or SIGKILL, on the
culprit's node) is asserted with the fault benchmark's classes, tests/slow/faults/test_faults.py.
"""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import requests

from llmmon.commands.launch import environment
from llmmon.incidents import layout
from tests.helpers import wait_for
from tests.ranks.jobs import Job, base_env

JOB = "team-a.llama-incident"


def _kmsg(path: Path) -> None:
    """A saved kernel log: one record from boot (before the stall) and one from after it."""
    late = int((time.monotonic() + 3600) * 1e6)
    path.write_text(f"6,1,1000000,-;eth0: link up at boot\n"
                    f"4,2,{late},-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus\n")


def _incidents(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*") if layout.ID.match(p.name))


def _runs(server, collector: str) -> float:  # type: ignore[no-untyped-def]
    text = requests.get(server.url + "/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith("llmmon_exporter_collector_last_success_timestamp_seconds{") \
                and f'collector="{collector}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _served_job(tmp_path: Path, serve, job_id: str, args: list[str]
                ) -> tuple[list[Path], str, str]:  # type: ignore[no-untyped-def]
    """Runs the job beside `llmmon serve` until it has an incident and ten more runs of the
    incidents collector went by; returns the incidents, the last metrics and the job's logs."""
    spool, fr_dir, pipe_dir = tmp_path / "spool", tmp_path / "fr", tmp_path / "pipe"
    incidents, kmsg = tmp_path / "incidents", tmp_path / "kmsg"
    spool.mkdir()
    _kmsg(kmsg)
    env = environment(base_env(), job_id, str(spool), str(fr_dir), str(pipe_dir), 2000,
                      timing=False, dump_on_timeout=True)
    env.update(PYTHONPATH=base_env()["PYTHONPATH"], NCCL_DEBUG="INFO",
               WANDB_API_KEY="hunter2-secret", TORCH_HUB_TOKEN="hunter2-token",
               NCCL_SOCKET_IFNAME="lo")
    server = serve("--collector.disable-defaults", "--collector.ranks", "--collector.incidents",
                   f"--spool.dir={spool}", "--collector.ranks.interval=0.5s",
                   "--collector.ranks.stall-after=2s", "--collector.ranks.auto-dump=false",
                   f"--collector.ranks.fr-dir={fr_dir}", f"--collector.ranks.pipe-dir={pipe_dir}",
                   f"--collector.incidents.dir={incidents}",
                   f"--collector.incidents.kmsg-path={kmsg}", "--collector.incidents.node=node-a")
    with Job(tmp_path, 3, args, env) as job:
        found = wait_for(lambda: _incidents(incidents) or None, 300, "an incident",
                         context=lambda: job.logs()[-2000:])
        # once per incident: the stall goes on, the collector keeps running, no second one
        seen = _runs(server, "incidents")
        wait_for(lambda: _runs(server, "incidents") > seen + 10 or None, 120,
                 "ten more runs of the incidents collector")
        assert _incidents(incidents) == found
        return found, requests.get(server.url + "/metrics", timeout=5).text, job.logs()


def test_a_hang_is_kept_once_with_its_dumps_stacks_and_environment(tmp_path: Path,
                                                                   serve) -> None:
    args = ["--steps", "20", "--compute", "0.01", "--behaviour", "hang", "--culprit", "2",
            "--hold", "600", "--timeout", "600"]
    found, metrics, _ = _served_job(tmp_path, serve, JOB, args)
    [incident] = found
    summary = json.loads((incident / "summary.json").read_text())
    assert summary["job_id"] == JOB and summary["node"] == "node-a"
    assert incident.name.endswith(summary["id"][-6:]) and JOB in incident.name
    assert summary["trigger"] == "stalled"
    assert summary["culprit"]["ranks"] == [2] and summary["culprit"]["cause"] == "root"
    assert "rank 2" in summary["verdict"]
    assert summary["onset"] <= summary["declared"] <= summary["completed"]
    assert summary["dumps"] == {"0": "collected", "1": "collected", "2": "collected"}
    for rank in range(3):
        dump = json.loads((incident / "fr" / f"rank_{rank}.json").read_text())
        assert dump["entries"], rank
    assert set(summary["files"]) >= {"ranks.json", "stacks.json", "env.json", "gpus.json",
                                     "network.json", "kmsg.txt", "fr/rank_2.json"}
    assert summary["bytes"] == sum(summary["files"].values())
    assert summary["local_ranks"] == [0, 1, 2] and summary["stalled_groups"][0]["pg"] == "0"

    ranks = json.loads((incident / "ranks.json").read_text())
    assert ranks["job_id"] == JOB and ranks["verdict"]["roots"] == [2]
    records = json.loads((incident / "collectives.json").read_text())["ranks"]
    assert records["0"]["progress"]["0"]["enqueued"] == records["2"]["progress"]["0"]["enqueued"] + 1
    # what rank 0 last shipped of its ring: the all_reduce it waits in, once it has shipped it
    assert all(r["pg"] == "0" for r in records["0"]["records"])
    stacks = json.loads((incident / "stacks.json").read_text())["ranks"]
    assert stacks["2"]["source"] == "reporter" and stacks["2"]["frames"]
    environ = json.loads((incident / "env.json").read_text())
    assert environ["ranks"]["1"]["NCCL_DEBUG"] == "INFO"
    assert environ["ranks"]["1"]["NCCL_SOCKET_IFNAME"] == "lo"
    assert environ["ranks"]["1"]["TORCH_HUB_TOKEN"] == "<redacted>"
    assert environ["redacted"] == ["TORCH_HUB_TOKEN"]
    assert "WANDB_API_KEY" not in environ["ranks"]["1"]  # only what decides NCCL and torch
    assert "hunter2" not in "".join(p.read_text(errors="replace")
                                    for p in incident.rglob("*") if p.is_file())
    log = (incident / "kmsg.txt").read_text()
    assert "Xid" in log and "link up at boot" not in log

    assert stat.S_IMODE(incident.stat().st_mode) == 0o750
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o640
               for p in incident.rglob("*") if p.is_file())
    assert not [p for p in incident.parent.iterdir() if p.name.startswith(layout.TMP_PREFIX)]
    assert 'llmmon_incidents_written_total{trigger="stalled"} 1.0' in metrics
    assert f'llmmon_job_incident_info{{incident="{incident.name}",job_id="{JOB}"}} 1.0' \
        in metrics
