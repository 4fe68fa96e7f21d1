"""Reading a running `llmmon serve` (tests.conftest.ServeProcess) the way an operator would."""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import wait_for


def collector(server, name: str) -> dict:  # type: ignore[no-untyped-def]
    """The collector's entry in /api/v1/collectors (which must answer 200)."""
    response = requests.get(server.url + "/api/v1/collectors", timeout=10)
    assert response.status_code == 200, response.text
    return next(s for s in response.json()["collectors"] if s["name"] == name)


def samples(server) -> dict[tuple[str, tuple], float]:  # type: ignore[no-untyped-def]
    text = requests.get(server.url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(server, name: str, **labels: str) -> float | None:  # type: ignore[no-untyped-def]
    """One sample of /metrics, or None when the series is not exported."""
    return samples(server).get((name, tuple(sorted(labels.items()))))


def runs_after(server, name: str, runs: int = 2) -> None:  # type: ignore[no-untyped-def]
    """Wait until the collector has finished `runs` more runs (its duration changes)."""
    for _ in range(runs):
        before = collector(server, name)["last_duration_seconds"]
        wait_for(lambda: collector(server, name)["last_duration_seconds"] != before, 60,
                 f"another {name} run")


def consistent_scrape(server, timeout: float = 60.0  # type: ignore[no-untyped-def]
                      ) -> tuple[dict, int]:
    """One scrape whose llmmon_exporter_series equals its own sample count (the self-metrics
    are re-rendered just after each collector run, so poll for a settled one)."""
    def settled() -> tuple[dict, int] | None:
        text = requests.get(server.url + "/metrics", timeout=5).text
        scraped = [s for family in text_string_to_metric_families(text) for s in family.samples]
        found = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in scraped}
        return (found, len(scraped)) if found.get(("llmmon_exporter_series", ())) == len(
            scraped) else None
    return wait_for(settled, timeout, "llmmon_exporter_series to match the scrape", 0.2)
