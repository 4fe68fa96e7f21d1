"""A web config that would open the exporter at reload is refused, and a refused login costs the
same time whether the user exists (and whatever its bcrypt cost) or not."""

from __future__ import annotations

import ssl
import statistics
import time

import bcrypt
import httpx
import yaml

from tests.deploy.deploy_helpers import write
from tests.helpers import wait_for
from tests.slow.deploy.test_webconfig import tls

PASSWORD = "s3cret-scrape"


def _wait_logged(tmp_path, exporter, text: str, timeout: float = 30.0) -> None:
    log = tmp_path / f"llmmon-{exporter.port}.log"  # where web_serve sends the daemon's log
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.1)


def test_a_reload_that_would_turn_authentication_off_is_refused(tmp_path, web_serve):
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    path = write(tmp_path, {"basic_auth_users": {"prometheus": hashed}})
    exporter = web_serve(path)
    url = exporter.http + "/metrics"
    assert httpx.get(url, timeout=5).status_code == 401
    for emptied in ("", "# comments only\n", "basic_auth_users: {}\n"):
        path.write_text(emptied)
        assert httpx.get(url, timeout=5).status_code == 401  # the request reloads the file
        assert httpx.get(url, auth=("prometheus", PASSWORD), timeout=5).status_code == 200
    _wait_logged(tmp_path, exporter, "would turn basic authentication off")
    wait_for(lambda: "llmmon_exporter_web_config_reloads_refused_total 3.0" in httpx.get(
        url, auth=("prometheus", PASSWORD), timeout=5).text, 30, "the refusals counted")


def test_a_reload_that_would_turn_tls_off_is_refused(tmp_path, certs, web_serve):
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    path = write(tmp_path, {"tls_server_config": tls(certs),
                            "basic_auth_users": {"prometheus": hashed}})
    exporter = web_serve(path)
    path.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": hashed}}))
    with httpx.Client(verify=ssl.create_default_context(cafile=str(certs.ca)), timeout=10) as c:
        assert c.get(exporter.https + "/metrics").status_code == 401
        assert c.get(exporter.https + "/metrics",
                     auth=("prometheus", PASSWORD)).status_code == 200
    _wait_logged(tmp_path, exporter, "would turn TLS off")


def test_a_refusal_takes_as_long_for_a_costly_user_as_for_an_unknown_name(tmp_path, web_serve):
    costly = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=13))
    exporter = web_serve(write(tmp_path, {"basic_auth_users": {"alice": costly.decode()}}))
    url = exporter.http + "/metrics"

    def refused(user: str) -> float:
        started = time.monotonic()
        assert httpx.get(url, auth=(user, "wrong"), timeout=30).status_code == 401
        return time.monotonic() - started

    # What telling them apart would take, measured in the same run: a cost-13 check against
    # the cost-10 decoy that unknown names are checked with.
    started = time.perf_counter()
    bcrypt.checkpw(b"wrong", costly)
    own = time.perf_counter() - started
    started = time.perf_counter()
    bcrypt.checkpw(b"wrong", b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi")
    gap = own - (time.perf_counter() - started)
    known = statistics.median(refused("alice") for _ in range(3))
    unknown = statistics.median(refused("mallory") for _ in range(3))
    assert abs(known - unknown) < gap / 2, (known, unknown, gap)
