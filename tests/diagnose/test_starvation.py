"""Starvation branch: 20 Hz power dips, MFU from the reporter's model FLOPs, disk read latency."""

from __future__ import annotations

from pathlib import Path

from tests.diagnose.node import check, subjects, texts

BUSY_MW, IDLE_MW = 690_000, 90_000  # around the levels of a 700 W H200: busy >= 350, low < 210


def _starve(doc: dict) -> None:
    """Half a second at the cap, half a second idle, for ~200 s of 20 Hz samples."""
    step = [{"id": 186, "ret": 0, "type": 1, "value": BUSY_MW}] * 10 + \
        [{"id": 186, "ret": 0, "type": 1, "value": IDLE_MW}] * 10
    doc["field_values"]["NVML_FI_DEV_POWER_INSTANT"] = {"sequence": step * 200}


def test_power_dips_name_the_starved_gpu(node) -> None:
    starved = node()
    starved.edit_gpu(2, _starve)
    report = starved.start().report(wait=3.0)

    found = check(report, "starvation.power_dips")
    assert found["verdict"] == "suspect"
    assert "2" in subjects(found, "gpu")
    gpu2 = next(e for e in found["evidence"] if e["subject"]["gpu"] == "2")
    assert 0.3 < gpu2["values"]["low_power_fraction"] < 0.7
    assert gpu2["values"]["dips_per_minute"] > 30  # one dip a second
    assert not {"0", "3", "7"} & subjects(found, "gpu")  # steady or idle: no dips


def _diskstats_read(proc: Path, device: str, reads: int, milliseconds: int) -> None:
    lines = []
    for line in (proc / "diskstats").read_text().splitlines():
        parts = line.split()
        if parts[2] == device:
            parts[3] = str(int(parts[3]) + reads)
            parts[6] = str(int(parts[6]) + milliseconds)
        lines.append(" ".join(parts))
    (proc / "diskstats").write_text("\n".join(lines) + "\n")


def test_slow_disk_reads(node) -> None:
    disk = node().start()
    report = disk.report(lambda: _diskstats_read(disk.proc, "sdb", 5000, 500_000))

    found = check(report, "starvation.disk_reads")
    assert found["verdict"] == "suspect"
    assert subjects(found, "device") == {"sdb"}
    sdb = found["evidence"][0]["values"]
    assert abs(sdb["read_latency_seconds"] - 0.1) < 1e-9  # 500 s over 5,000 reads
    assert sdb["reads_per_second"] > 10
    assert "IO pressure: tasks stalled on IO full" in texts(found)


def test_low_mfu_of_a_progressing_job(node) -> None:
    job = node()
    gpus = (0, 2, 3, 5)
    job.edit_ranks(lambda doc, rank: doc["identity"].update(uuid=job.uuid(gpus[rank])))
    job.start()
    peak = 4 * 989.5e12  # four H200s, bf16 dense

    def train(doc: dict, rank: int) -> None:
        doc["step"]["steps"] += 1
        doc["step"]["model_flops"] += 0.1 * peak / 4  # 10 % of a second's peak, per rank

    report = job.report(lambda: job.edit_ranks(train))
    found = check(report, "starvation.mfu")
    assert found["verdict"] == "suspect"
    assert subjects(found, "job_id") == {"llama-8b"}
    assert 0 < found["evidence"][0]["values"]["mfu"] < 0.3
