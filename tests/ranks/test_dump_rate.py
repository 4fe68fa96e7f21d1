"""POST /api/v1/ranks/dump in a loop: one dump of a job per dump_interval reaches its ranks'
pipes; the rest get 429 without touching a pipe or the log."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from llmmon.sampler import Sampler
from llmmon.serve.app import create_app
from llmmon.serve.routes import collector_routes
from llmmon_reporter.dumppipe import DumpPipe
from llmmon_reporter.layout import pipe_path
from tests.ranks.jobs import make_collector, scrape
from tests.ranks.test_nccl_dumps import staged


def test_a_job_is_dumped_once_per_interval_however_often_it_is_asked(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool, now = staged(tmp_path, "nccl4")  # job llama-8b
    collector = make_collector(spool, tmp_path, auto_dump=False, dump_interval=2.0)
    scrape(collector, now)
    client = TestClient(create_app(Sampler([collector], "test"), collector_routes([collector])))
    pipe = DumpPipe(pipe_path(str(tmp_path / "pipe"), "llama-8b", 0))
    url, job = "/api/v1/ranks/dump", {"job_id": "llama-8b"}
    try:
        with caplog.at_level(logging.WARNING, logger="llmmon"):
            asked = time.monotonic()
            assert client.post(url, params=job).status_code == 200
            answers = []  # (answered within the interval of the first, answer)
            for _ in range(200):
                answer = client.post(url, params=job)
                answers.append((time.monotonic() - asked < 2.0, answer))
        inside = [a for within, a in answers if within]
        assert inside and all(a.status_code == 429 for a in inside)
        assert "one per 2s" in inside[0].json()["error"]
        assert pipe.requested() and not pipe.requested()  # one byte: one request reached it
        assert len([r for r in caplog.records if "dump requested" in r.getMessage()]) <= 2
        deadline = time.monotonic() + 30
        while client.post(url, params=job).status_code != 200:  # the next interval admits one
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert pipe.requested()
        assert client.post(url, params={"job_id": "other"}).status_code == 400
    finally:
        pipe.close()
