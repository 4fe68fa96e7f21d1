"""XID events through the collector's own thread: every event counted, clean shutdown."""

from __future__ import annotations

import time
from pathlib import Path

from tests.core.helpers import run
from tests.gpu.conftest import edit


def xid_counts(collector) -> dict[tuple[int, int], int]:
    return {key: count for key, (count, _) in collector.xid.counts().items()}


def wait_for_counts(collector, expected: dict, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while xid_counts(collector) != expected:
        assert time.monotonic() < deadline, xid_counts(collector)
        time.sleep(0.02)


def test_every_xid_is_counted_and_the_thread_stops(gpu_collector, h200x8: Path) -> None:
    collector = gpu_collector(h200x8)
    collector.start()
    before = time.time()
    run(collector)  # discovery tells the thread which GPUs to register
    wait_for_counts(collector, {(5, 48): 2, (5, 94): 1})
    assert collector.xid.watched == tuple(range(8))
    assert before <= collector.xid.counts()[(5, 48)][1] <= time.time()

    # The same XID again, on another GPU too: repeats are visible, unlike a last-value gauge.
    edit(h200x8 / "gpu5.json", lambda doc: doc["xid_events"].append({"xid": 48}))
    edit(h200x8 / "gpu0.json", lambda doc: doc.update(xid_events=[{"xid": 79}]))
    wait_for_counts(collector, {(5, 48): 3, (5, 94): 1, (0, 79): 1})
    samples, _, _ = run(collector)
    xids = {(dict(labels)["gpu"], dict(labels)["xid"]): value for (name, labels), value
            in samples.items() if name == "llmmon_gpu_xid_errors_total"}
    assert xids == {("5", "48"): 3, ("5", "94"): 1, ("0", "79"): 1}

    thread = collector.xid._thread
    collector.close()
    assert thread is not None and not thread.is_alive()


def test_gpus_without_xid_events_are_not_watched(gpu_collector, h200x8: Path) -> None:
    edit(h200x8 / "gpu2.json", lambda doc: doc["device0"].update(
        supported_event_types={"ok": 0x1}))
    edit(h200x8 / "gpu3.json", lambda doc: doc["device0"].update(
        supported_event_types={"nvml_error": "Not Supported", "code": 3}))
    collector = gpu_collector(h200x8)
    run(collector)
    collector.xid.poll(0)
    samples, _, _ = run(collector)
    watched = {dict(labels)["gpu"]: value for (name, labels), value in samples.items()
               if name == "llmmon_gpu_xid_watched"}
    assert watched == {"0": 1, "1": 1, "2": 0, "3": 0, "4": 1, "5": 1, "6": 1, "7": 1}
