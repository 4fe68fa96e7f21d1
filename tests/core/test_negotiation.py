"""Content negotiation of /metrics on a real `llmmon serve`: a format or coding the scraper lists
with q=0 is one it refuses, so it is never served (RFC 9110 12.4.2)."""

from __future__ import annotations

import gzip

import pytest
import requests

from llmmon.serve.app import qualities

PROMETHEUS = ("application/openmetrics-text;version=1.0.0;q=0.5,"
              "text/plain;version=0.0.4;q=0.2,*/*;q=0.1")


@pytest.mark.parametrize(("header", "expected"), [
    ("gzip", {"gzip": 1.0}),
    ("identity, gzip;q=0", {"identity": 1.0, "gzip": 0.0}),
    ("GZIP;Q=0.5", {"gzip": 0.5}),
    ("gzip;q=abc, br;q=2, zstd;q=nan", {"gzip": 0.0, "br": 0.0, "zstd": 0.0}),
    (" , ;q=1", {}),
])
def test_qualities_read_each_token_and_refuse_what_is_not_a_quality(header, expected) -> None:
    assert qualities(header) == expected


def test_q_zero_is_a_refusal_for_the_format_and_the_coding(serve) -> None:
    server = serve("--no-collector.gpu", "--no-collector.rdma")
    url = server.url + "/metrics"

    def get(accept: str, encoding: str) -> requests.Response:
        # stream + raw: requests would otherwise decode gzip and hide what was sent
        return requests.get(url, headers={"Accept": accept, "Accept-Encoding": encoding},
                            timeout=10, stream=True)

    chosen = get(PROMETHEUS, "gzip")
    assert chosen.headers["Content-Type"].startswith("application/openmetrics-text")
    assert chosen.headers.get("Content-Encoding") == "gzip"
    assert gzip.decompress(chosen.raw.read()).endswith(b"# EOF\n")

    refused = get("application/openmetrics-text;q=0, text/plain", "identity, gzip;q=0")
    assert refused.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "Content-Encoding" not in refused.headers
    body = refused.raw.read()
    assert body.startswith(b"# HELP") and b"# EOF" not in body
