"""The daemon side: /api/v1/diagnose on the daemon's own FastAPI app, the observation thread and
its bounded window, and the window's counter arithmetic on real expositions."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from llmmon.serve.app import create_app
from llmmon.cli import build_parser
from llmmon.collectors import discover
from llmmon.config import build_settings
from llmmon.serve.assembly import build
from llmmon.diagnose.model import SCHEMA, Report
from llmmon.diagnose.schema import ADAPTER
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.window import LocalView, Window, parse
from tests.conftest import GOLDEN
from tests.diagnose.node import check, touch_tree


def _valid(document: dict) -> None:
    """The document is exactly a Report: every field present, typed, and nothing else."""
    report: Report = ADAPTER.validate_python(document)
    assert report.as_json() == document
    assert document["schema"] == SCHEMA


def test_endpoint_serves_the_report(node) -> None:
    started = node().start()
    diagnoser = started.diagnoser
    started.observe()
    time.sleep(1.0)
    started.observe()
    served = TestClient(create_app(started.daemon.sampler, started.daemon.routes())).get("/api/v1/diagnose")
    assert served.status_code == 200 and served.headers["content-type"] == "application/json"
    document = served.json()
    _valid(document)
    assert document["source"] == {"kind": "daemon", "url": "/api/v1/diagnose", "scope": "node",
                                  "observations": 2,
                                  "window_seconds": document["source"]["window_seconds"]}
    assert document["source"]["window_seconds"] >= 1.0
    assert check(document, "hang.progress")["verdict"] == "suspect"
    here = diagnoser.result()
    assert [b["verdict"] for b in here["branches"]] == \
        [b["verdict"] for b in document["branches"]]


def test_observation_is_what_the_rendered_exposition_says(node) -> None:
    """The daemon observes its collectors' runs as they are rendered, not by parsing its
    exposition back: every wanted sample of the text a scrape gets is in the observation, with
    its labels and value, and nothing else is."""
    built = node()
    touch_tree(built.spool)  # the fixture ranks are fresh
    settings = build_settings(build_parser().parse_args(["serve", *built.args()]), discover())
    daemon = build(settings)
    try:
        for collector in daemon.collectors:
            daemon.sampler.run_once(collector)
        daemon.diagnoser.observe()
        text = daemon.sampler.body(openmetrics=False, compressed=False).decode()
    finally:
        for collector in daemon.collectors:
            collector.close()
    observed = daemon.diagnoser.window.observations()[-1].snapshot
    parsed = parse(text)
    assert {"llmmon_gpu_up", "llmmon_rdma_port_info", "llmmon_rank_up"} <= observed.keys()
    assert sum(len(series) for series in parsed.values()) > 500
    assert ({n: {k: repr(v) for k, v in s.items()} for n, s in observed.items()}
            == {n: {k: repr(v) for k, v in s.items()} for n, s in parsed.items()})


def test_first_request_observes_once(node) -> None:
    started = node().start()
    document = started.diagnoser.result()
    _valid(document)
    assert document["source"]["observations"] == 1
    assert check(document, "hang.rdma_loss")["summary"].startswith("needs two observations")


def test_thread_keeps_a_bounded_window(node) -> None:
    started = node().start()
    diagnoser = started.diagnoser
    diagnoser.interval, diagnoser.window.span = 0.05, 1.0
    began = time.time()
    diagnoser.start()
    try:
        time.sleep(3.0)
        observations = diagnoser.window.observations()
    finally:
        diagnoser.stop()
    assert not diagnoser._thread.is_alive()
    assert len(observations) >= 2
    assert observations[0].time > began + 1.0  # the first ones were dropped
    assert observations[-1].time - observations[0].time <= 1.0


def _rdma(value: int) -> str:
    """The golden RDMA exposition with mlx5_0/1's out_of_sequence counter set to `value`."""
    lines = []
    for line in (GOLDEN / "rdma.prom").read_text().splitlines():
        if line.startswith('llmmon_rdma_out_of_sequence_total{device="mlx5_0",port="1"}'):
            line = f"{line.rsplit(' ', 1)[0]} {value}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_window_rates_handle_counter_resets() -> None:
    window = Window(span=60)
    window.add(_rdma(1000), at=100.0)
    view = LocalView(window.observations(), "scrape", "", Thresholds())
    assert view.rate("llmmon_rdma_out_of_sequence_total", "5m") is None
    window.add(_rdma(1100), at=110.0)
    window.add(_rdma(40), at=120.0)  # the 32-bit hw counter wrapped (or the driver reloaded)
    view = LocalView(window.observations(), "scrape", "", Thresholds())
    rates = {(s.get("device"), s.get("port")): s.value
             for s in view.rate("llmmon_rdma_out_of_sequence_total", "5m")}
    assert rates[("mlx5_0", "1")] == (100 + 40) / 20
    increases = view.increase("llmmon_rdma_out_of_sequence_total", "5m",
                              'device="mlx5_0",port="1"')
    assert [s.value for s in increases] == [140]
    assert view.window_seconds == 20 and view.observations == 3


def test_window_forgets_old_observations_and_unread_families() -> None:
    window = Window(span=30)
    for at in (0.0, 10.0, 20.0, 30.0, 40.0):
        window.add(_rdma(int(at)) + "other_exporter_metric 1\n", at=at)
    kept = window.observations()
    assert [o.time for o in kept] == [10.0, 20.0, 30.0, 40.0]
    assert "other_exporter_metric" not in kept[-1].snapshot
    assert "llmmon_rdma_port_info" in kept[-1].snapshot


def test_window_stores_each_label_set_once() -> None:
    """Snapshots share the label tuples of series they have in common (the window's memory is
    its values, not 12 copies of every label set); a new series gets its own."""
    window = Window(span=60)
    window.add(_rdma(1000), at=0.0)
    window.add(_rdma(1100) + 'llmmon_rdma_port_up{device="mlx5_9",port="1"} 1\n', at=10.0)
    old, new = (o.snapshot["llmmon_rdma_out_of_sequence_total"] for o in window.observations())
    assert old.keys() == new.keys()
    assert all(any(key is other for other in old) for key in new)
    up = window.observations()[1].snapshot["llmmon_rdma_port_up"]
    assert (("device", "mlx5_9"), ("port", "1")) in up
