"""Thermal branch: clock-event reasons over the window, power of busy GPUs against peers."""

from __future__ import annotations

from tests.diagnose.node import check, subjects, texts


def _cool(doc: dict) -> None:
    doc["device0"].update(clocks_event_reasons={"ok": 0x4}, temp_gpu_c={"ok": 66})


def test_software_slowdown_on_another_card(node) -> None:
    hot = node()
    hot.edit_gpu(4, _cool)
    hot.edit_gpu(6, lambda doc: doc["device0"].update(clocks_event_reasons={"ok": 0x24}))
    report = hot.start().report()

    found = check(report, "thermal.clock_events")
    assert found["verdict"] == "suspect"
    assert subjects(found, "gpu") == {"6"}
    assert found["evidence"][0]["values"] == {"sw_thermal_slowdown_fraction": 1.0,
                                              "hw_thermal_slowdown_fraction": 0.0}
    assert found["runbook"].endswith("#gputhermalthrottle")


def test_cool_cards_are_ok(node) -> None:
    cool = node()
    cool.edit_gpu(4, _cool)
    assert check(cool.start().report(), "thermal.clock_events")["verdict"] == "ok"


def test_power_below_the_jobs_peers(node) -> None:
    job = node()
    gpus = (0, 2, 3, 5)
    job.edit_ranks(lambda doc, rank: doc["identity"].update(uuid=job.uuid(gpus[rank])))
    job.edit_gpu(2, lambda doc: doc["device0"].update(power_usage_mw={"ok": 400_000}))
    report = job.start().report()

    found = check(report, "thermal.power_peers")
    assert found["verdict"] == "suspect"
    assert "its job's GPUs" in found["summary"]
    assert subjects(found, "gpu") == {"2"}  # GPU 1 (384 W) runs no rank of the job
    assert "GPU 2 of job llama-8b draws 400 W against a median of" in texts(found)
