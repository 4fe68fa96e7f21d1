"""Reading a running `llmmon serve` (tests.conftest.ServeProcess) the way an operator would."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

import requests
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


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
        wait_for(lambda: collector(server, name)["last_duration_seconds"] != before,
                 f"another {name} run")
