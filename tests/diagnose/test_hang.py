"""Hang branch: collective progress per group, lost GPUs, RDMA loss, links down or flapping."""

from __future__ import annotations

from pathlib import Path

from llmmon.diagnose.thresholds import Thresholds
from tests.diagnose.node import check, subjects, texts


def _heal(doc: dict, rank: int) -> None:
    """Every rank enqueued and completed #16 of group 0: nothing in flight."""
    doc["status"]["pg_status"]["0"].update(last_enqueued_collective="16",
                                           last_started_collective="16",
                                           last_completed_collective="16")
    doc["inflight"] = None


def test_progressing_job_is_ok(node) -> None:
    healthy = node()
    healthy.edit_ranks(_heal)
    report = healthy.start().report()
    found = check(report, "hang.progress")
    assert found["verdict"] == "ok"
    assert "job llama-8b, group 0: nothing in flight (last completed #16)" in texts(found)


def test_the_daemons_learned_threshold_judges_below_the_configured_ceiling(node, tmp_path: Path) -> None:
    """The alerts config's hang_window_seconds is only the ceiling: the daemon's own stall
    measurement against the threshold it learned from the job (llmmon_nccl_stalled_seconds,
    llmmon_nccl_stall_threshold_seconds) calls the hang, as the rules do."""
    config = tmp_path / "config.yaml"
    config.write_text("hang_window_seconds: {value: 86400000, why: a patient site}\n")
    job = node().start()
    job.diagnoser.thresholds = Thresholds.load(str(config))
    found = check(job.report(), "hang.progress")
    assert found["verdict"] == "suspect"
    assert found["thresholds"] == {"hang_window_seconds": 86400000.0, "hang_busy_seconds": 10.0}
    assert "rank 3 never enqueued collective #16 of group 0" in texts(found)


def _bump(path: Path, by: int) -> None:
    path.write_text(f"{int(path.read_text()) + by}\n")


def test_rdma_loss_and_flaps(node) -> None:
    fabric = node().start()
    ports = fabric.sys / "class" / "infiniband"

    def degrade() -> None:
        _bump(ports / "mlx5_0" / "ports" / "1" / "hw_counters" / "out_of_sequence", 500)
        _bump(ports / "mlx5_2" / "ports" / "1" / "counters" / "link_downed", 1)

    report = fabric.report(degrade)
    loss = check(report, "hang.rdma_loss")
    assert loss["verdict"] == "suspect"
    assert [(e["subject"]["device"], e["subject"]["port"]) for e in loss["evidence"]] == \
        [("mlx5_0", "1")]
    assert "out_of_sequence" in texts(loss)
    links = check(report, "hang.links")
    assert "mlx5_2/1 went down 1 times in the window" in texts(links)
    assert "mlx5_1/1 is down" in texts(links)


def test_lost_gpu(node) -> None:
    lost = node()
    lost.edit_gpu(3, lambda doc: doc["device0"].update(
        power_usage_mw={"nvml_error": "GPU is lost", "code": 15}))
    found = check(lost.start().report(), "hang.gpu_errors")
    assert found["verdict"] == "suspect"
    assert subjects(found, "gpu") == {"3", "5"}
    assert found["runbook"].endswith("#gpulost")  # the finding's own alert
    assert "GPU 3 (GPU-5f3c2a10-7d41-4e8b-9c62-0a1b2c3d4e53) does not answer NVML" in texts(found)


def _rank1_broadcasts(doc: dict, rank: int) -> None:
    """Rank 1's #16 of group 0 is a broadcast where ranks 0 and 2 all-gather (in both of its
    files: the state's in-flight records and the entries)."""
    part = doc.get("inflight") if "inflight" in doc else doc.get("dump")
    for entry in (part or {}).get("entries", []) if rank == 1 else []:
        if entry.get("pg_id") == 0 and entry.get("collective_seq_id") == 16:
            entry["profiling_name"] = "nccl:broadcast"


def test_a_desync_names_the_rank_that_issued_another_collective(node) -> None:
    quiet = check(node().start().report(), "hang.desync")
    assert quiet["verdict"] == "ok", quiet  # ranks 0-2 all wait in the same all-gather
    job = node()
    job.edit_ranks(_rank1_broadcasts)
    job.edit_ranks(_rank1_broadcasts, "entries")
    found = check(job.start().report(), "hang.desync")
    assert found["verdict"] == "suspect", found
    assert found["alerts"] == ["LLMTrainingDesync"]
    said = texts(found)
    assert len(found["evidence"]) == 1, found["evidence"]
    assert said.startswith("job llama-8b rank 1") and "issued broadcast " in said, said
    assert "as collective #16 of group 0, where 2 ranks issued _all_gather_base " in said, said
