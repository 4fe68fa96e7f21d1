"""Memory branch: OOMs and allocator retries in the window, reserved memory against the card
(ranks joined to the NVML GPUs by UUID), fragmentation."""

from __future__ import annotations

from tests.diagnose.node import check, subjects

GPUS = (0, 2, 3, 5)  # the GPUs of ranks 0-3


def test_oom_and_retries_in_the_window(node) -> None:
    job = node().start()

    def fail_rank_2(doc: dict, rank: int) -> None:
        if rank == 2:
            doc["memory"]["num_ooms"] += 1
            doc["memory"]["num_alloc_retries"] += 4

    report = job.report(lambda: job.edit_ranks(fail_rank_2))
    ooms = check(report, "memory.ooms")
    assert ooms["verdict"] == "suspect" and subjects(ooms, "rank") == {"2"}
    assert ooms["evidence"][0]["values"]["increase"] == 1
    retries = check(report, "memory.alloc_retries")
    assert retries["verdict"] == "suspect"
    assert [(e["subject"]["rank"], e["values"]["increase"]) for e in retries["evidence"]] == \
        [("2", 4.0)]
    assert retries["runbook"].endswith("#gpumemoryoomrisk")


def test_reserved_capacity_and_fragmentation(node) -> None:
    job = node()
    total = 150754820096  # the H200 capture's frame buffer
    shapes = {0: (0.97, 0.96), 1: (0.90, 0.40), 2: (0.60, 0.10), 3: (0.50, 0.45)}

    def place(doc: dict, rank: int) -> None:
        doc["identity"]["uuid"] = job.uuid(GPUS[rank])
        reserved, allocated = shapes[rank]
        doc["memory"]["reserved_bytes.all.current"] = int(reserved * total)
        doc["memory"]["allocated_bytes.all.current"] = int(allocated * total)

    job.edit_ranks(place)
    report = job.start().report()

    capacity = check(report, "memory.reserved_capacity")
    assert capacity["verdict"] == "suspect" and subjects(capacity, "rank") == {"0"}
    assert abs(capacity["evidence"][0]["values"]["reserved_share"] - 0.97) < 1e-6
    assert capacity["evidence"][0]["subject"]["uuid"] == job.uuid(0)

    # Rank 1: 56 % unallocated of a 90 % reservation. Rank 2 is as fragmented but small.
    fragmented = check(report, "memory.fragmentation")
    assert fragmented["verdict"] == "suspect" and subjects(fragmented, "rank") == {"1"}
    values = fragmented["evidence"][0]["values"]
    assert abs(values["unallocated_share"] - 0.5 / 0.9) < 1e-6
    assert abs(values["reserved_share"] - 0.9) < 1e-6
