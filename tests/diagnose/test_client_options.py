"""The TLS and basic-auth options of `--prometheus` (and of the daemons in `llmmon incident`)
make the HTTP session they say."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from llmmon.cli import main
from llmmon.diagnose.prometheus import add_client_arguments, client_session


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_client_arguments(parser, "prometheus", "Prometheus")
    return parser.parse_args(argv)


def test_the_defaults_verify_with_the_system_s_cas_and_send_no_credentials() -> None:
    session = client_session(parse(), "prometheus")
    assert (session.verify, session.cert, session.auth) == (True, None, None)


def test_every_option_reaches_the_session(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("pa:ss word\r\nignored\n")
    session = client_session(parse(
        "--prometheus.ca-file", "/ca.pem", "--prometheus.cert-file", "/c.pem",
        "--prometheus.key-file", "/k.pem", "--prometheus.basic-auth-user", "ops",
        "--prometheus.basic-auth-password-file", str(password)), "prometheus")
    assert (session.verify, session.cert, session.auth) == (
        "/ca.pem", ("/c.pem", "/k.pem"), ("ops", "pa:ss word"))
    insecure = client_session(parse("--prometheus.insecure-skip-verify",
                                    "--prometheus.ca-file", "/ca.pem"), "prometheus")
    assert insecure.verify is False


def test_an_unreadable_password_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        client_session(parse("--prometheus.basic-auth-user", "ops",
                             "--prometheus.basic-auth-password-file",
                             str(tmp_path / "none")), "prometheus")


def test_diagnose_says_so_instead_of_a_traceback(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--prometheus", "http://127.0.0.1:1",
                 "--prometheus.basic-auth-user", "ops", "--prometheus.basic-auth-password-file",
                 str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.startswith("llmmon diagnose: --prometheus: [Errno 2]")
