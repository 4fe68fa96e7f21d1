"""--web.config.file against a live `llmmon serve`: HTTPS, minimum TLS version, client
certificates, bcrypt basic auth, headers, certificate rotation, and floods of wrong passwords
that never shut out the scraper."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bcrypt
import httpx
import pytest

from tests.deploy.deploy_helpers import ROOT, Certs, issue, require, write

PASSWORD = "s3cret-scrape"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()


def tls(certs: Certs, **extra: object) -> dict:
    return {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key), **extra}


def client(certs: Certs, cert: Path | None = None, key: Path | None = None,
           max_version: ssl.TLSVersion | None = None, ciphers: str | None = None
           ) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    if max_version is not None:
        ctx.maximum_version = max_version
    if ciphers is not None:
        ctx.set_ciphers(ciphers)
    return httpx.Client(verify=ctx, timeout=10)


def test_https_with_basic_auth(tmp_path, certs, web_serve):
    exporter = web_serve(write(tmp_path, {
        "tls_server_config": tls(certs),
        "basic_auth_users": {"prometheus": HASH},
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}}}))
    with client(certs) as c:
        ok = c.get(exporter.https + "/metrics", auth=("prometheus", PASSWORD))
        assert ok.status_code == 200
        assert 'llmmon_exporter_collector_success{collector="disk"}' in ok.text
        assert ok.headers["x-content-type-options"] == "nosniff"
        again = c.get(exporter.https + "/metrics", auth=("prometheus", PASSWORD))
        assert again.status_code == 200  # served from the auth cache
        for auth in (None, ("prometheus", "wrong"), ("nobody", PASSWORD)):
            denied = c.get(exporter.https + "/metrics", auth=auth)
            assert denied.status_code == 401, auth
            assert denied.headers["www-authenticate"] == "Basic"
            assert "llmmon_" not in denied.text
        assert c.get(exporter.https + "/api/v1/collectors").status_code == 401
        assert c.get(exporter.https + "/").status_code == 401
        health = c.get(exporter.https + "/healthz")
        assert health.status_code == 200 and health.text == "ok\n"
    with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS port
        httpx.get(exporter.http + "/healthz", timeout=5)
    with pytest.raises(httpx.ConnectError):  # our CA only: a self-signed cert is not trusted
        httpx.get(exporter.https + "/healthz", timeout=5)


def test_basic_auth_without_tls(tmp_path, web_serve):
    exporter = web_serve(write(tmp_path, {"basic_auth_users": {"prometheus": HASH}}))
    assert httpx.get(exporter.http + "/metrics", timeout=5).status_code == 401
    assert httpx.get(exporter.http + "/metrics", auth=("prometheus", PASSWORD),
                     timeout=5).status_code == 200


def test_dump_action_needs_the_credentials_a_scrape_needs(tmp_path, web_serve):
    """POST /api/v1/ranks/dump writes into a job's dump pipes: the web config admits to it
    exactly the users it admits to /metrics (exporter-toolkit has no per-path rights), and it
    answers POST only."""
    spool = tmp_path / "spool"
    shutil.copytree(ROOT / "tests/fixtures/spool/nccl4", spool)  # job llama-8b, ranks 0-3
    for path in spool.rglob("*.json"):
        path.touch()  # written now: live ranks
    pipe = tmp_path / "frpipe" / "llama-8b" / "rank_0.pipe"
    pipe.parent.mkdir(parents=True)
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # rank 0 listens, as torch does
    try:
        users = write(tmp_path, {"basic_auth_users": {"prometheus": HASH}})
        exporter = web_serve(users, flags=(
            "--collector.ranks", f"--spool.dir={spool}",
            f"--collector.ranks.pipe-dir={tmp_path / 'frpipe'}",
            f"--collector.ranks.fr-dir={tmp_path / 'fr'}",
            "--collector.ranks.auto-dump=false"))  # the fixture job hangs: no dump by itself
        auth = ("prometheus", PASSWORD)
        with httpx.Client(base_url=exporter.http, timeout=10) as c:
            wait_for_job(c, auth, "llama-8b")
            url = "/api/v1/ranks/dump?job_id=llama-8b"
            for wrong in (None, ("prometheus", "wrong"), ("nobody", PASSWORD)):
                assert c.post(url, auth=wrong).status_code == 401, wrong
            assert os.read(reader, 16) == b""  # refused requests never reach the pipe
            assert c.get(url, auth=auth).status_code == 405
            done = c.post(url, auth=auth)
            assert done.status_code == 200, done.text
            assert done.json() == {"job_id": "llama-8b", "ranks": {
                "0": "requested", "1": "no pipe", "2": "no pipe", "3": "no pipe"}}
            assert os.read(reader, 16) == b"1"
            unknown = c.post("/api/v1/ranks/dump?job_id=elsewhere", auth=auth)
            assert unknown.status_code == 400 and "llama-8b" in unknown.json()["error"]
    finally:
        os.close(reader)


def wait_for_job(c: httpx.Client, auth: tuple[str, str], job_id: str) -> None:
    """Until the ranks collector has read the spool (its first run)."""
    deadline = time.monotonic() + 30
    while job_id not in {j["job_id"] for j in c.get("/api/v1/ranks", auth=auth).json()["jobs"]}:
        assert time.monotonic() < deadline, f"job {job_id} never appeared"
        time.sleep(0.2)


def test_min_version_tls13_refuses_tls12(tmp_path, certs, web_serve):
    exporter = web_serve(write(tmp_path, {"tls_server_config": tls(certs, min_version="TLS13")}))
    with client(certs, max_version=ssl.TLSVersion.TLSv1_2) as c, \
            pytest.raises(httpx.ConnectError):
        c.get(exporter.https + "/healthz")
    with client(certs) as c:
        assert c.get(exporter.https + "/healthz").status_code == 200
    s_client = subprocess.run(
        [require("openssl"), "s_client", "-connect", f"127.0.0.1:{exporter.port}", "-tls1_2"],
        input="", capture_output=True, text=True, timeout=30)
    assert s_client.returncode != 0
    s_client = subprocess.run(
        [require("openssl"), "s_client", "-connect", f"127.0.0.1:{exporter.port}", "-tls1_3",
         "-CAfile", str(certs.ca), "-verify_return_error"],
        input="", capture_output=True, text=True, timeout=30)
    assert s_client.returncode == 0 and "TLSv1.3" in s_client.stdout


def test_cipher_suites_restrict_tls12(tmp_path, certs, web_serve):
    exporter = web_serve(write(tmp_path, {"tls_server_config": tls(
        certs, max_version="TLS12",
        cipher_suites=["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"])}))
    with client(certs, ciphers="ECDHE-ECDSA-AES256-GCM-SHA384") as c, \
            pytest.raises(httpx.ConnectError):
        c.get(exporter.https + "/healthz")
    with client(certs, ciphers="ECDHE-ECDSA-AES128-GCM-SHA256") as c:
        assert c.get(exporter.https + "/healthz").status_code == 200


def test_require_and_verify_client_cert(tmp_path, certs, web_serve):
    exporter = web_serve(write(tmp_path, {"tls_server_config": tls(
        certs, client_ca_file=str(certs.ca), client_auth_type="RequireAndVerifyClientCert")}))
    with client(certs, certs.client_cert, certs.client_key) as c:
        assert c.get(exporter.https + "/metrics").status_code == 200
    for cert, key in ((None, None), (certs.stranger_cert, certs.stranger_key)):
        with client(certs, cert, key) as c, pytest.raises(httpx.HTTPError):
            c.get(exporter.https + "/metrics")


def test_verify_client_cert_if_given(workdir, certs, web_serve):
    exporter = web_serve(write(workdir, {"tls_server_config": tls(
        certs, client_ca_file="ca.crt", client_auth_type="VerifyClientCertIfGiven")}))
    # ca.crt is relative: resolved against the web config's folder, as exporter-toolkit does
    with client(certs) as c:
        assert c.get(exporter.https + "/metrics").status_code == 200
    with client(certs, certs.stranger_cert, certs.stranger_key) as c, \
            pytest.raises(httpx.HTTPError):
        c.get(exporter.https + "/metrics")


def peer_certificate(port: int, certs: Certs) -> bytes:
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), 10),
                         server_hostname="127.0.0.1") as sock:
        return sock.getpeercert(binary_form=True)


def test_renewed_certificate_served_without_restart(workdir, certs, web_serve):
    tmp_path = workdir
    cert, key = tmp_path / "live.crt", tmp_path / "live.key"
    shutil.copy(certs.server_cert, cert)
    shutil.copy(certs.server_key, key)
    exporter = web_serve(write(tmp_path, {"tls_server_config": {
        "cert_file": "live.crt", "key_file": "live.key"}}))
    before = peer_certificate(exporter.port, certs)
    issue(certs.dir, "renewed", "ca", "/CN=llmmon-renewed",
           "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    shutil.copy(certs.dir / "renewed.key", tmp_path / "next.key")
    shutil.copy(certs.dir / "renewed.crt", tmp_path / "next.crt")
    (tmp_path / "next.crt").replace(cert)  # rename, as Secret updates and cert tools do
    # half renewed: the new certificate does not match the old key; the last good pair serves
    assert peer_certificate(exporter.port, certs) == before
    (tmp_path / "next.key").replace(key)
    after = peer_certificate(exporter.port, certs)
    assert after != before
    assert after == ssl.PEM_cert_to_DER_cert((certs.dir / "renewed.crt").read_text())
    assert exporter.process.poll() is None


def test_user_list_reloaded(tmp_path, web_serve):
    path = write(tmp_path, {"basic_auth_users": {"prometheus": HASH}})
    exporter = web_serve(path)
    url = exporter.http + "/metrics"
    assert httpx.get(url, auth=("prometheus", PASSWORD), timeout=5).status_code == 200
    write(tmp_path, {"basic_auth_users": {"grafana": HASH}})
    assert httpx.get(url, auth=("prometheus", PASSWORD), timeout=5).status_code == 401
    assert httpx.get(url, auth=("grafana", PASSWORD), timeout=5).status_code == 200
    path.write_text("basic_auth_users: [broken")  # a bad edit keeps the last good config
    assert httpx.get(url, auth=("grafana", PASSWORD), timeout=5).status_code == 200


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_idle_tls_connections_neither_exhaust_the_daemon_nor_shut_out_the_scraper(
        tmp_path, certs, web_serve):
    """asyncio gives every accepted TLS socket a 256 KiB buffer before a byte is read: 720
    idle ones took the daemon past its 256 MiB limit. Connections that never start a handshake
    and ones idle after it count against --web.max-connections; past it the one idle longest
    is closed, and a scrape over TLS with basic auth still gets /metrics."""
    exporter = web_serve(write(tmp_path, {"tls_server_config": tls(certs),
                                          "basic_auth_users": {"prometheus": HASH}}),
                         flags=("--web.max-connections=40",))
    auth = ("prometheus", PASSWORD)
    with client(certs) as c:
        assert c.get(exporter.https + "/metrics", auth=auth).status_code == 200
    before = open_fds(exporter.process.pid)
    context = ssl.create_default_context(cafile=str(certs.ca))
    address = ("127.0.0.1", exporter.port)
    idle = [context.wrap_socket(socket.create_connection(address, timeout=30),
                                server_hostname="127.0.0.1") for _ in range(20)]
    bare = [socket.create_connection(address, timeout=30) for _ in range(150)]
    try:
        with client(certs) as c:
            for _ in range(3):
                scrape = c.get(exporter.https + "/metrics", auth=auth)
                assert scrape.status_code == 200 and "llmmon_exporter_collector_success" in \
                    scrape.text
        assert open_fds(exporter.process.pid) <= before + 40
    finally:
        for sock in idle + bare:
            sock.close()


def test_a_password_longer_than_bcrypt_reads_is_refused_without_a_traceback(tmp_path,
                                                                              web_serve):
    exporter = web_serve(write(tmp_path, {"basic_auth_users": {"prometheus": HASH}}))
    url = exporter.http + "/metrics"
    for password in ("x" * 100, PASSWORD + "x" * 72):  # bcrypt 5 raises on these
        assert httpx.get(url, auth=("prometheus", password), timeout=30).status_code == 401
    assert httpx.get(url, auth=("prometheus", PASSWORD), timeout=30).status_code == 200
    log = (tmp_path / f"llmmon-{exporter.port}.log").read_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log


def test_failed_logins_never_evict_the_scraper_whose_password_matched(tmp_path, web_serve):
    """Only credentials that matched are remembered: 150 distinct wrong passwords (more than
    the old 100-entry cache of every attempt) leave the scraper's entry in place, so its
    scrapes need no new bcrypt check."""
    exporter = web_serve(write(tmp_path, {"basic_auth_users": {"prometheus": HASH}}))
    url = exporter.http + "/metrics"
    with httpx.Client(timeout=30) as c:
        assert c.get(url, auth=("prometheus", PASSWORD)).status_code == 200
    with ThreadPoolExecutor(10) as pool:  # each refusal takes a second
        statuses = list(pool.map(lambda n: httpx.get(url, auth=("prometheus", f"wrong-{n}"),
                                                     timeout=120).status_code, range(150)))
    assert set(statuses) <= {401, 503} and statuses.count(401) >= 100, statuses
    with httpx.Client(timeout=30) as c:
        for _ in range(3):
            assert c.get(url, auth=("prometheus", PASSWORD)).status_code == 200
    log = (tmp_path / f"llmmon-{exporter.port}.log").read_text()
    assert log.count("user prometheus authenticated") == 1, log


def test_a_refusal_is_answered_only_after_a_second(tmp_path, web_serve) -> None:
    """A client guessing passwords in a loop gets one answer a second , not as
    many as the event loop can give; the matched scraper is not held."""
    exporter = web_serve(write(tmp_path, {"basic_auth_users": {"prometheus": HASH}}))
    url = exporter.http + "/metrics"
    with httpx.Client(timeout=30) as c:
        assert c.get(url, auth=("prometheus", PASSWORD)).status_code == 200
        for auth in (("prometheus", "wrong"), ("nobody", PASSWORD), None):
            started = time.monotonic()
            assert c.get(url, auth=auth).status_code == 401
            assert time.monotonic() - started >= 1.0, auth  # docs/security.md: one second


def test_a_wrong_password_flood_is_shed_and_never_delays_the_matched_scraper(tmp_path,
                                                                              web_serve):
    """48 clients with wrong passwords for a cost-12 hash: a few are checked at a time, those
    beyond the waiting bound get 503 unchecked, and the scraper whose password already matched
    gets /metrics while checks are still queued."""
    slow = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=12)).decode()
    exporter = web_serve(write(tmp_path, {"basic_auth_users": {"prometheus": slow}}))
    url = exporter.http + "/metrics"
    assert httpx.get(url, auth=("prometheus", PASSWORD), timeout=60).status_code == 200
    with ThreadPoolExecutor(48) as pool:
        flood = [pool.submit(lambda n: httpx.get(url, auth=("prometheus", f"wrong-{n}"),
                                                 timeout=120).status_code, n)
                 for n in range(48)]
        deadline = time.monotonic() + 60
        while not any(f.done() and f.result() == 503 for f in flood):
            assert time.monotonic() < deadline and not all(f.done() for f in flood), \
                "no request was shed"
            time.sleep(0.05)
        assert httpx.get(url, auth=("prometheus", PASSWORD), timeout=60).status_code == 200
        still_checking = sum(not f.done() for f in flood)
        statuses = [f.result() for f in flood]
    assert still_checking > 0  # the scrape did not queue behind the flood's checks
    assert set(statuses) == {401, 503}, statuses
