"""--web.config.file without a live server: clear errors for bad files, `llmmon serve`
refusing one, and the shipped examples (tests/slow/deploy/test_webconfig.py serves them)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys

import pytest
import yaml

from llmmon.serve.webconfig import WebConfig
from tests.deploy.deploy_helpers import ROOT, require, write

SHIPPED = [ROOT / "deploy/kubernetes/overlays/tls/web-config.yml",
           ROOT / "deploy/systemd/web-config.yml"]


T = {"cert_file": "server.crt", "key_file": "server.key"}
BAD = [
    ({"tls_server_config": {"cert_file": "server.crt"}}, "key_file is required"),
    ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "server.key"}},
     "missing.crt"),
    ({"tls_server_config": {**T, "min_version": "TLS14"}}, "unknown TLS version 'TLS14'"),
    ({"tls_server_config": {**T, "min_version": "TLS13", "max_version": "TLS12"}},
     "min_version is above max_version"),
    ({"tls_server_config": {**T, "client_auth_type": "RequireAndVerifyClientCert"}},
     "needs client_ca_file"),
    ({"tls_server_config": {**T, "client_auth_type": "RequireAnyClientCert"}}, "not supported"),
    ({"tls_server_config": {**T, "client_ca_file": "ca.crt"}}, "without a client_auth_type"),
    ({"tls_server_config": {**T, "cipher_suites": ["TLS_MADE_UP"]}},
     "unknown cipher 'TLS_MADE_UP'"),
    ({"tls_server_config": {**T, "curve_preferences": ["X25519"]}}, "curve_preferences is not"),
    ({"tls_server_config": {**T, "certfile": "x"}}, "unknown key(s) certfile"),
    ({"basic_auth_users": {"prometheus": "plaintext"}}, "basic_auth_users.prometheus: not a"),
    ({"http_server_config": {"headers": {"X-Frame-Options": "allow"}}}, "X-Frame-Options"),
    ({"http_server_config": {"headers": {"Server": "llmmon"}}}, "unknown key(s) Server"),
    ({"rate_limit": {"burst": 1}}, "unknown key(s) rate_limit"),
]


@pytest.mark.parametrize("config,message", BAD, ids=[m for _, m in BAD])
def test_bad_config_is_a_clear_error(workdir, config, message):
    with pytest.raises(ValueError) as err:
        WebConfig.load(str(write(workdir, config)))
    assert message in str(err.value)
    assert str(workdir / "web-config.yml") in str(err.value)


def test_serve_refuses_a_bad_web_config(tmp_path):
    config = tmp_path / "llmmon.yml"
    config.write_text(yaml.safe_dump({"web": {"config_file": str(write(
        tmp_path, {"basic_auth_users": {"prometheus": "plaintext"}}))}}))
    out = subprocess.run([sys.executable, "-m", "llmmon", "serve", f"--config.file={config}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "basic_auth_users.prometheus: not a bcrypt hash" in out.stderr


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_examples_pass_promtool_and_load(path, tmp_path, certs):
    """The shipped file, verbatim, beside real certificates where its relative paths point."""
    example = tmp_path / "web-config.yml"
    shutil.copy(path, example)
    (tmp_path / "tls").mkdir()
    shutil.copy(certs.server_cert, tmp_path / "tls" / "tls.crt")
    shutil.copy(certs.server_key, tmp_path / "tls" / "tls.key")
    shutil.copy(certs.ca, tmp_path / "tls" / "ca.crt")
    out = subprocess.run([require("promtool"), "check", "web-config", str(example)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    settings = WebConfig.load(str(example)).current()
    assert settings.users and settings.tls is not None
    assert settings.tls.min_version >= ssl.TLSVersion.TLSv1_2
