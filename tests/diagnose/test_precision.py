"""Precision branch: gradient-reduction dtypes from the Flight Recorder entries, loss reports."""

from __future__ import annotations

from tests.diagnose.node import check, subjects, texts

REDUCTIONS = ("nccl:all_reduce", "nccl:_reduce_scatter_base")


def _half(doc: dict, rank: int) -> None:
    for entry in doc["dump"]["entries"]:
        if entry["profiling_name"] in REDUCTIONS:
            entry["input_dtypes"] = entry["output_dtypes"] = ["Half"]


def test_fp16_gradients_are_suspect(node) -> None:
    fp16 = node()
    fp16.edit_ranks(_half, "entries")
    report = fp16.start().report()

    found = check(report, "precision.gradient_dtype")
    assert found["verdict"] == "suspect"
    assert found["alerts"] == ["LLMTrainingNotBF16"]
    assert found["thresholds"] == {"reduction_collectives": ".*(all_?reduce|reduce_scatter).*",
                                   "fp16_share": 0.5}
    assert subjects(found, "job_id") == {"llama-8b"}
    assert found["evidence"][0]["values"]["half_share"] == 1.0
    assert "100 % of the gradient-reduction bytes are Half (Half 100 %) since the ranks " \
        "started" in texts(found)
    assert "precision.gradient_dtype" in report["suspects"]


def test_nonfinite_loss_in_the_window_is_suspect(node) -> None:
    job = node().start()

    def nan_on_rank_1(doc: dict, rank: int) -> None:
        if rank == 1:
            doc["step"]["loss_nonfinite"] += 3

    report = job.report(lambda: job.edit_ranks(nan_on_rank_1))
    found = check(report, "precision.loss_finite")
    assert found["verdict"] == "suspect"
    assert [(e["subject"]["rank"], e["values"]["nonfinite"]) for e in found["evidence"]] == \
        [("1", 3.0)]
    assert check(report, "precision.gradient_dtype")["verdict"] == "ok"
