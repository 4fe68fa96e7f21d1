"""`View` over a Prometheus server: the cluster as Prometheus sees it, with the shipped rules.

Each method is one instant query at a fixed evaluation time, so every check reads the same
moment.  Series carry Prometheus' target labels (`cluster`, `node`, `instance`), which the
evidence shows.  Recording rules are read by name: the server must load alerts/rules/.
"""

from __future__ import annotations

import argparse
import time

import requests

from llmmon.diagnose.view import Sample, QueryError


class PrometheusError(QueryError):
    """The server could not be asked or refused the query; the message says which."""


def add_client_arguments(parser: argparse.ArgumentParser, prefix: str, what: str) -> None:
    """TLS and basic-auth options for the HTTP client of `what` (`--<prefix>.ca-file` ...).
    Prometheus and the llmmon daemons (their --web.config.file) speak the same two."""
    group = parser.add_argument_group(f"{what}: TLS and basic auth")
    dest = prefix.replace("-", "_")
    group.add_argument(f"--{prefix}.ca-file", dest=f"{dest}_ca_file", metavar="FILE",
                       help=f"CA bundle (PEM) to verify {what} with (default: the system's).")
    group.add_argument(f"--{prefix}.insecure-skip-verify", dest=f"{dest}_insecure",
                       action="store_true", help=f"Do not verify the certificate of {what}.")
    group.add_argument(f"--{prefix}.cert-file", dest=f"{dest}_cert_file", metavar="FILE",
                       help=f"Client certificate (PEM) to present to {what}.")
    group.add_argument(f"--{prefix}.key-file", dest=f"{dest}_key_file", metavar="FILE",
                       help="Its private key (PEM).")
    group.add_argument(f"--{prefix}.basic-auth-user", dest=f"{dest}_user", metavar="USER",
                       help=f"Basic auth user for {what}.")
    group.add_argument(f"--{prefix}.basic-auth-password-file", dest=f"{dest}_password_file",
                       metavar="FILE", help="Its password, first line of FILE (never on the "
                       "command line, where every user of the machine can read it).")


def client_session(args: argparse.Namespace, prefix: str) -> requests.Session:
    """A session with the options `add_client_arguments(prefix)` added; OSError when a file
    it names cannot be read."""
    dest = prefix.replace("-", "_")

    def option(name: str) -> str | None:
        return getattr(args, f"{dest}_{name}", None)

    session = requests.Session()
    session.verify = False if option("insecure") else option("ca_file") or True
    if option("cert_file"):
        session.cert = (option("cert_file"), option("key_file")) if option("key_file") \
            else option("cert_file")
    if option("user") is not None:
        password = ""
        if option("password_file"):
            with open(option("password_file"), encoding="utf-8") as handle:
                password = handle.readline().rstrip("\r\n")
        session.auth = (option("user"), password)
    return session


class PrometheusView:
    kind = "prometheus"
    scope = "cluster"
    observations = 0

    def __init__(self, url: str, at: float | None = None, timeout: float = 10.0,
                 session: requests.Session | None = None) -> None:
        self.url = url.rstrip("/")
        self.now = time.time() if at is None else at
        self.window_seconds = 300.0  # the longest range the checks ask for (5m)
        self._timeout = timeout
        self._http = session or requests.Session()
        self._answers: dict[str, list[Sample]] = {}  # one moment: each expression asked once

    def query(self, expr: str) -> list[Sample]:
        if expr not in self._answers:
            self._answers[expr] = self._ask(expr)
        return self._answers[expr]

    def _ask(self, expr: str) -> list[Sample]:
        try:
            response = self._http.get(f"{self.url}/api/v1/query", timeout=self._timeout,
                                      params={"query": expr, "time": f"{self.now:.3f}"})
            answer = response.json()
        except (requests.RequestException, ValueError) as exc:
            raise PrometheusError(f"{self.url}: {exc}") from None
        if answer.get("status") != "success":
            raise PrometheusError(f"{self.url}: {expr}: {answer.get('error', response.text)}")
        data = answer["data"]
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expr}: expected a vector, got {data['resultType']}")
        return [Sample({k: v for k, v in item["metric"].items() if k != "__name__"},
                       float(item["value"][1]))
                for item in data["result"]]

    @staticmethod
    def _selector(name: str, selector: str) -> str:
        return f"{name}{{{selector}}}" if selector else name

    def instant(self, name: str, selector: str = "") -> list[Sample]:
        return self.query(self._selector(name, selector))

    def rate(self, name: str, window: str, selector: str = "") -> list[Sample] | None:
        return self.query(f"rate({self._selector(name, selector)}[{window}])")

    def increase(self, name: str, window: str, selector: str = "") -> list[Sample] | None:
        return self.query(f"increase({self._selector(name, selector)}[{window}])")

    def mean_over_time(self, name: str, window: str, selector: str = "") -> list[Sample]:
        return self.query(f"avg_over_time({self._selector(name, selector)}[{window}])")

    def rule(self, record: str) -> list[Sample] | None:
        return self.query(record)
