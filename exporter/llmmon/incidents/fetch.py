"""Each node's newest incident of a job, over the daemons' HTTP API, and the job's nodes from
Prometheus.

Nodes are asked in parallel, each with its own timeout and byte caps, so one that is down,
slow or hostile costs its own incident and never the others': it is reported as missing.
Only file names the format allows (`layout.allowed`) are asked for or kept, so `--out` can
write them under a directory without a path leaving it.  The HTTP session (TLS, basic auth)
is the caller's: the command builds it from the same options as `diagnose --prometheus`.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import requests

from llmmon.incidents import layout
from llmmon.incidents.merge import Missing, NodeIncident

MAX_FILE_BYTES = 64 << 20  # the writer's cap on a whole incident
MAX_NODE_BYTES = 256 << 20
MAX_LIST_BYTES = 16 << 20
WORKERS = 16
DEFAULT_PORT = 9476  # the daemon's --web.listen-address
RANK_INFO = "llmmon_rank_info"
INCIDENT_INFO = "llmmon_job_incident_info"


class FetchError(Exception):
    """One node's incident could not be had; the message says why."""


class BadURL(ValueError):
    """An address that is not an http(s) URL of a host."""


def base_url(address: str, scheme: str = "http", port: int = DEFAULT_PORT) -> str:
    """`host:port` or `host` (Prometheus' `instance`: the shipped Kubernetes scrape job sets it
    to the node's name) or a URL, as a base URL; `port` where a bare `host` has none."""
    url = address if "://" in address else f"{scheme}://{address}"
    parts = urllib.parse.urlsplit(url)
    try:
        has_port = parts.port is not None  # raises on a port that is not a number
    except ValueError:
        raise BadURL(f"{address!r}: not a port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.fragment or parts.username:
        raise BadURL(f"{address!r}: not an http(s) address (host:port or URL)")
    if "://" not in address and not has_port:
        url = f"{scheme}://{parts.netloc}:{port}{parts.path}"
    return url.rstrip("/")


def selector(job_id: str) -> str:
    """`{job_id="..."}` with the job id escaped as PromQL's string literal wants."""
    escaped = job_id.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{{job_id="{escaped}"}}'


def discover(query: Callable[[str], Iterable[Mapping[str, str]]], job_id: str) -> list[str]:
    """The `instance` of every daemon that follows a rank of the job or keeps an incident of
    it (`query`: an instant query's label sets)."""
    found = set()
    for metric in (RANK_INFO, INCIDENT_INFO):
        for labels in query(f"{metric}{selector(job_id)}"):
            instance = labels.get("instance")
            if instance:
                found.add(instance)
    return sorted(found)


@dataclass(frozen=True)
class Fetched:
    incidents: list[NodeIncident]
    missing: list[Missing]


def fetch(session: requests.Session, nodes: Iterable[str], job_id: str, timeout: float,
          unreachable: Callable[[str, BaseException], str] = lambda url, exc: f"{url}: {exc}"
          ) -> Fetched:
    """Every node's newest incident of `job_id`; `nodes` are base URLs (`base_url`)."""
    nodes = list(dict.fromkeys(nodes))

    def one(base: str) -> NodeIncident | Missing:
        try:
            return fetch_node(session, base, job_id, timeout)
        except FetchError as exc:
            return Missing(base, str(exc))
        except (requests.ConnectionError, requests.Timeout) as exc:
            return Missing(base, unreachable(base, exc))
        except requests.RequestException as exc:
            return Missing(base, f"{base}: {exc}")

    with ThreadPoolExecutor(max_workers=max(1, min(WORKERS, len(nodes)))) as pool:
        results = list(pool.map(one, nodes))
    return Fetched([r for r in results if isinstance(r, NodeIncident)],
                   [r for r in results if isinstance(r, Missing)])


def fetch_node(session: requests.Session, base: str, job_id: str, timeout: float
               ) -> NodeIncident:
    listing = _json(_get(session, f"{base}/api/v1/incidents", timeout, MAX_LIST_BYTES,
                         {"job_id": job_id}), f"{base}/api/v1/incidents")
    incidents = listing.get("incidents") if isinstance(listing, dict) else None
    if not isinstance(incidents, list):
        raise FetchError(f"{base}/api/v1/incidents: no incident list in the answer")
    ours = [s for s in incidents if isinstance(s, dict) and s.get("job_id") == job_id]
    if not ours:
        raise FetchError(f"{base}: no incident of job {job_id}")
    summary = ours[0]  # newest first
    ident = summary.get("id")
    if not (isinstance(ident, str) and layout.ID.match(ident)):
        raise FetchError(f"{base}: an incident id that is not one: {str(ident)[:80]!r}")
    files, errors, total = {}, [], 0
    listed = summary.get("files") if isinstance(summary.get("files"), dict) else {}
    for name in sorted(listed):
        if name == layout.SUMMARY:
            continue
        if not (isinstance(name, str) and layout.allowed(name)):
            errors.append(f"{str(name)[:80]!r}: not a file an incident holds; not fetched")
            continue
        url = f"{base}/api/v1/incidents/{ident}/files/{urllib.parse.quote(name)}"
        try:
            data = _get(session, url, timeout, min(MAX_FILE_BYTES, MAX_NODE_BYTES - total))
        except (FetchError, requests.RequestException) as exc:
            errors.append(f"{name}: {exc}")
            continue
        files[name] = data
        total += len(data)
    return NodeIncident(base, summary, files, tuple(errors))


def _get(session: requests.Session, url: str, timeout: float, cap: int,
         params: Mapping[str, str] | None = None) -> bytes:
    """The body, within `cap` bytes and `timeout` seconds in all (a trickle is cut too)."""
    deadline = time.monotonic() + timeout
    with session.get(url, params=params, timeout=timeout, stream=True,
                     allow_redirects=False) as response:
        if response.status_code != 200:
            raise FetchError(f"{url}: HTTP {response.status_code} {response.reason}")
        data = bytearray()
        for chunk in response.iter_content(1 << 16):
            data += chunk
            if len(data) > cap:
                raise FetchError(f"{url}: over {cap} bytes; not kept")
            if time.monotonic() > deadline:
                raise FetchError(f"{url}: not whole after {timeout:g} s")
    return bytes(data)


def _json(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise FetchError(f"{what}: not JSON: {exc}") from None
