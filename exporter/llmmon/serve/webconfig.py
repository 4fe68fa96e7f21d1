"""`--web.config.file`: TLS, client certificates and bcrypt basic auth, exporter-toolkit format.

The YAML is the one node_exporter and Prometheus read (`tls_server_config`,
`http_server_config`, `basic_auth_users`), so one file serves the whole fleet and
`promtool check web-config` validates it. Unknown keys are errors, as exporter-toolkit's strict
parsing makes them. As in exporter-toolkit, the file and the certificates it names are re-read
when they change: a renewed certificate is served from the next handshake on and a changed user
list from the next request, without a restart. A change that cannot be applied to a listening
socket (TLS on/off, versions, client auth, ciphers) is logged and waits for a restart.

`/healthz` stays open to callers without credentials (TLS, when on, still applies): it returns a
constant, runs no collector and tells nothing a TCP connect does not, and it lets kubelet probes
work without a password in the pod spec.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import os
import re
import ssl
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable

import bcrypt
import yaml

from llmmon.serve.httpserver import REFUSED

log = logging.getLogger("llmmon.serve.webconfig")

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]],
                   Awaitable[None]]
OPEN_PATHS = frozenset({"/healthz"})

TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# exporter-toolkit's client_auth_type -> Python's verify mode. Go's RequestClientCert asks for
# a certificate and never checks it; Python cannot ask without checking, and since nothing
# here reads an unchecked certificate, not asking serves the same purpose.
CLIENT_AUTH = {"": ssl.CERT_NONE, "NoClientCert": ssl.CERT_NONE,
               "RequestClientCert": ssl.CERT_NONE,
               "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
UNSUPPORTED_CLIENT_AUTH = ("RequireAnyClientCert", "RequireClientCert")
# Go's TLS 1.2 suite names (crypto/tls.CipherSuites) -> OpenSSL's. TLS 1.3 suites are not
# configurable in Go either; they are accepted and left to the library.
CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
TLS13_CIPHERS = frozenset({"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384",
                           "TLS_CHACHA20_POLY1305_SHA256"})
# exporter-toolkit's allowed response headers, with their allowed values (None: any).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None, "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"), "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_ca", "client_auth_type",
            "cipher_suites", "min_version", "max_version", "prefer_server_cipher_suites"}
UNSUPPORTED_TLS_KEYS = {
    "cert": "inline certificates need a temporary file; use cert_file",
    "key": "inline keys need a temporary file; use key_file",
    "curve_preferences": "Python's ssl module cannot set a list of curves",
    "client_allowed_sans": "client SAN matching is not implemented; use a dedicated client CA",
}
BCRYPT_HASH = re.compile(r"^\$2[aby]\$(0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}$")
# bcrypt of "fakepassword" (exporter-toolkit's): unknown users cost as much as known ones, so
# response times do not tell which user names exist.
DECOY_HASH = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
# Only credentials that matched are remembered, so failed attempts cannot push the scraper's
# out; a handful of users rotating passwords fits.
AUTH_CACHE_SIZE = 64
# bcrypt reads 72 bytes of a password and bcrypt 5 refuses longer ones: such a password has no
# hash it matches here.
MAX_PASSWORD_BYTES = 72
# bcrypt costs tens of milliseconds by design. Credentials not seen to match before are checked
# this many at a time, off the event loop, with at most PENDING_CHECKS waiting; beyond that a
# request is refused with 503 unchecked: a wrong-password flood costs one core at most and never
# queues in front of a scraper whose credentials already matched.
CONCURRENT_CHECKS = max(1, (os.cpu_count() or 2) // 2)
PENDING_CHECKS = 16
# A refused request (401, 503) is answered this long after it arrived, whatever the user and
# whatever its bcrypt check cost (a user whose hash has a higher cost is not told apart from a
# name that does not exist), the connection held at the cost of a sleeping coroutine: a client
# guessing passwords in a loop then makes one guess a second instead of as many as the event
# loop can refuse, and the loop stays free for the scraper (200 such clients without it kept a
# matched scrape waiting 1.3 s at p99).
REFUSED_DELAY = 1.0


@dataclass(frozen=True)
class TLSSettings:
    """The TLS policy; `files` are read when a context is built, so renewals are picked up."""

    cert_file: str
    key_file: str
    client_ca_file: str = ""
    client_ca: str = ""
    verify_mode: ssl.VerifyMode = ssl.CERT_NONE
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    ciphers: str = ""
    prefer_server_ciphers: bool = True

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.cert_file, self.key_file, self.client_ca_file) if f)

    def context(self) -> ssl.SSLContext:
        """A server context from the files as they are now; ValueError names what is wrong."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = self.min_version
        ctx.maximum_version = self.max_version
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cert_file {self.cert_file} / key_file {self.key_file}: "
                             f"{exc}") from None
        if self.client_ca_file or self.client_ca:
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file or None,
                                          cadata=self.client_ca or None)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"client CA {self.client_ca_file or '(inline)'}: "
                                 f"{exc}") from None
        ctx.verify_mode = self.verify_mode
        if self.ciphers:
            try:
                ctx.set_ciphers(self.ciphers)
            except ssl.SSLError as exc:
                raise ValueError(f"cipher_suites: OpenSSL accepts none of them: {exc}") from None
        if self.prefer_server_ciphers:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        return ctx


@dataclass(frozen=True)
class WebSettings:
    tls: TLSSettings | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    http2: bool = True


def _mapping(value: Any, where: str, allowed: set[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}; "
                         f"known: {', '.join(sorted(allowed))}")
    return value


def _string(section: dict[str, Any], key: str, where: str) -> str:
    value = section.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key}: expected a string, got {type(value).__name__}")
    return value


def _bool(section: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def _version(section: dict[str, Any], key: str, default: str) -> ssl.TLSVersion:
    name = section.get(key, default)
    if name not in TLS_VERSIONS:
        raise ValueError(f"tls_server_config.{key}: unknown TLS version {name!r}; "
                         f"use one of {', '.join(TLS_VERSIONS)}")
    return TLS_VERSIONS[name]


def _ciphers(names: Any) -> str:
    if names is None:
        return ""
    if not isinstance(names, list):
        raise ValueError("tls_server_config.cipher_suites: expected a list of suite names")
    openssl: list[str] = []
    for name in names:
        if name in CIPHERS:
            openssl.append(CIPHERS[name])
        elif name not in TLS13_CIPHERS:
            raise ValueError(f"tls_server_config.cipher_suites: unknown cipher {name!r}; "
                             f"known: {', '.join(sorted(CIPHERS))}")
    return ":".join(openssl)


def _join(directory: str, path: str) -> str:
    """Relative file names are relative to the web config file, as in exporter-toolkit."""
    return os.path.join(directory, path) if path and not os.path.isabs(path) else path


def _tls(section: dict[str, Any], directory: str) -> TLSSettings | None:
    where = "tls_server_config"
    section = _mapping(section, where, TLS_KEYS | set(UNSUPPORTED_TLS_KEYS))
    for key, why in UNSUPPORTED_TLS_KEYS.items():
        if key in section:
            raise ValueError(f"{where}.{key} is not supported: {why}")
    if not section:
        return None
    cert_file = _join(directory, _string(section, "cert_file", where))
    key_file = _join(directory, _string(section, "key_file", where))
    if not cert_file:
        raise ValueError(f"{where}: cert_file is required when TLS is configured")
    if not key_file:
        raise ValueError(f"{where}: key_file is required when TLS is configured")
    client_ca_file = _join(directory, _string(section, "client_ca_file", where))
    client_ca = _string(section, "client_ca", where)
    auth = _string(section, "client_auth_type", where)
    if auth in UNSUPPORTED_CLIENT_AUTH:
        raise ValueError(f"{where}.client_auth_type {auth} is not supported: Python's ssl "
                         "module cannot require a certificate without verifying it; use "
                         "RequireAndVerifyClientCert with client_ca_file")
    if auth not in CLIENT_AUTH:
        raise ValueError(f"{where}.client_auth_type: invalid value {auth!r}; use one of "
                         f"{', '.join(k for k in CLIENT_AUTH if k)}")
    has_ca = bool(client_ca_file or client_ca)
    if has_ca and auth in ("", "NoClientCert"):
        raise ValueError(f"{where}: a client CA is configured without a client_auth_type "
                         "that verifies certificates (VerifyClientCertIfGiven or "
                         "RequireAndVerifyClientCert)")
    if CLIENT_AUTH[auth] != ssl.CERT_NONE and not has_ca:
        raise ValueError(f"{where}.client_auth_type {auth} needs client_ca_file")
    settings = TLSSettings(
        cert_file=cert_file, key_file=key_file, client_ca_file=client_ca_file,
        client_ca=client_ca, verify_mode=CLIENT_AUTH[auth],
        min_version=_version(section, "min_version", "TLS12"),
        max_version=_version(section, "max_version", "TLS13"),
        ciphers=_ciphers(section.get("cipher_suites")),
        prefer_server_ciphers=_bool(section, "prefer_server_cipher_suites", True, where))
    if settings.min_version > settings.max_version:
        raise ValueError(f"{where}: min_version is above max_version")
    settings.context()  # the files exist and match: fail at start, not at the first scrape
    return settings


def _users(section: Any) -> dict[str, bytes]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ValueError("basic_auth_users: expected a mapping of user name to bcrypt hash")
    users: dict[str, bytes] = {}
    for user, hashed in section.items():
        if not isinstance(hashed, str) or not BCRYPT_HASH.match(hashed):
            raise ValueError(f"basic_auth_users.{user}: not a bcrypt hash (expected "
                             "$2y$<cost>$..., e.g. from `htpasswd -nBC 10 \"\" | tr -d ':'`)")
        users[str(user)] = hashed.encode()
    return users


def _headers(section: Any) -> dict[str, str]:
    section = _mapping(section, "http_server_config.headers", set(HEADERS))
    for name, value in section.items():
        allowed = HEADERS[name]
        if allowed is not None and value not in allowed:
            raise ValueError(f"http_server_config.headers.{name}: {value!r} is not one of "
                             f"{', '.join(allowed)}")
    return {str(k): str(v) for k, v in section.items()}


def parse(path: str) -> WebSettings:
    """Read and validate a web config file; every problem is a ValueError naming the key."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as exc:
        raise ValueError(f"web config {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"web config {path}: invalid YAML: {exc}") from None
    try:
        data = _mapping(data, "top level",
                        {"tls_server_config", "http_server_config", "basic_auth_users"})
        http = _mapping(data.get("http_server_config"), "http_server_config",
                        {"http2", "headers"})
        return WebSettings(
            tls=_tls(data.get("tls_server_config") or {}, os.path.dirname(path)),
            users=_users(data.get("basic_auth_users")),
            headers=_headers(http.get("headers")),
            http2=_bool(http, "http2", True, "http_server_config"))
    except ValueError as exc:
        raise ValueError(f"web config {path}: {exc}") from None


def _signature(paths: tuple[str, ...]) -> tuple[tuple[int, int, int], ...]:
    """What changes when a file is rewritten or replaced (Kubernetes swaps Secret symlinks)."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((0, 0, 0))
    return tuple(out)


class WebConfig:
    """A loaded web config that follows its file; `protect` and `configure` wire it in."""

    def __init__(self, path: str, settings: WebSettings) -> None:
        self.path = path
        self._settings = settings
        self._serving_tls = settings.tls
        self._context: ssl.SSLContext | None = None
        self._signature = self._watch_signature()
        self._matched: OrderedDict[str, None] = OrderedDict()
        self._checks = asyncio.Semaphore(CONCURRENT_CHECKS)
        self._waiting = 0
        self.refused_reloads = 0

    @property
    def serves_tls(self) -> bool:
        return self._serving_tls is not None

    @classmethod
    def load(cls, path: str) -> WebConfig:
        return cls(path, parse(path))

    def current(self) -> WebSettings:
        """The settings now, re-read first if the file or its certificates changed."""
        signature = self._watch_signature()
        if signature != self._signature:
            self._signature = signature
            self._reload()
        return self._settings

    def _watch_signature(self) -> tuple[tuple[int, int, int], ...]:
        tls = self._settings.tls
        return _signature((self.path,) + (tls.files if tls else ()))

    def _reload(self) -> None:
        """Apply a changed file; a bad edit or a half-renewed key pair keeps the last good."""
        running = self._serving_tls
        try:
            fresh = parse(self.path)
            context = (replace(running, **_files(fresh.tls)).context()
                       if fresh.tls is not None and running is not None else self._context)
        except ValueError as exc:
            log.error("keeping the previous web config: %s", exc)
            return
        weaker = _weakened(self._settings, fresh, running is not None)
        if weaker:
            self.refused_reloads += 1
            log.error("keeping the previous web config: %s %s; that takes a restart (a file "
                      "truncated or emptied must not open the exporter)", self.path, weaker)
            return
        if (fresh.tls is None) != (running is None) or (
                fresh.tls is not None and running is not None
                and _policy(fresh.tls) != _policy(running)):
            log.warning("web config %s: TLS on/off, versions, client auth and ciphers apply "
                        "after a restart; certificates and users apply now", self.path)
        self._context = context
        self._settings = fresh
        log.info("web config %s reloaded", self.path)

    # --- TLS -------------------------------------------------------------------------------

    def configure(self, config: Any) -> Any:
        """Serve HTTPS with this config's policy from a uvicorn.Config (returned, changed)."""
        if self._serving_tls is None:
            return config
        config.ssl_context_factory = lambda _config, _default: self._server_context()
        return config

    def _server_context(self) -> ssl.SSLContext:
        assert self._serving_tls is not None
        ctx = self._serving_tls.context()
        ctx.sni_callback = self._on_hello
        return ctx

    def _on_hello(self, sslobj: ssl.SSLObject, _server_name: str | None,
                  _ctx: ssl.SSLContext) -> None:
        """Called at every ClientHello (with or without SNI): swap in renewed certificates."""
        try:
            self.current()
            if self._context is not None:
                sslobj.context = self._context
        except Exception:  # a failed reload must not fail the handshake
            log.exception("web config reload failed")

    # --- HTTP ------------------------------------------------------------------------------

    def protect(self, app: ASGIApp) -> ASGIApp:
        """Wrap an ASGI app: response headers, and basic auth on every path but /healthz."""

        async def guarded(scope: dict, receive: Callable[[], Awaitable[dict]],
                          send: Callable[[dict], Awaitable[None]]) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            arrived = time.monotonic()
            settings = self.current()
            if settings.headers:
                send = _with_headers(send, settings.headers)
            status = 200
            if settings.users and scope["path"] not in OPEN_PATHS:
                status = await self._authorize(scope, settings.users)
            if status == 200:
                await app(scope, receive, send)
                return
            scope[REFUSED] = True  # the listener may close this connection to make room
            await asyncio.sleep(max(0.0, REFUSED_DELAY - (time.monotonic() - arrived)))
            headers = [(b"content-type", b"text/plain; charset=utf-8")]
            if status == 401:
                headers.append((b"www-authenticate", b"Basic"))
            else:
                headers.append((b"retry-after", b"1"))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body",
                        "body": b"Unauthorized\n" if status == 401 else b"Busy\n"})

        return guarded

    async def _authorize(self, scope: dict, users: dict[str, bytes]) -> int:
        """200, 401, or 503 when too many unverified credentials already wait for bcrypt."""
        credentials = _basic_credentials(scope)
        if credentials is None:
            return 401
        user, password = credentials
        hashed = users.get(user)
        if len(password) > MAX_PASSWORD_BYTES:
            return 401
        key = hashlib.sha256(b"\0".join((user.encode(), hashed or DECOY_HASH, password)))
        digest = key.hexdigest()
        if hashed is not None and digest in self._matched:
            self._matched.move_to_end(digest)
            return 200
        if self._waiting >= PENDING_CHECKS:
            return 503
        self._waiting += 1
        try:
            async with self._checks:
                matches = await asyncio.to_thread(_checkpw, password, hashed or DECOY_HASH)
        finally:
            self._waiting -= 1
        if not matches or hashed is None:
            return 401
        if digest not in self._matched:
            log.info("basic auth: user %s authenticated; remembered until the config changes",
                     user)
        self._matched[digest] = None
        while len(self._matched) > AUTH_CACHE_SIZE:
            self._matched.popitem(last=False)
        return 200


def _weakened(running: WebSettings, fresh: WebSettings, serving_tls: bool) -> str:
    """What `fresh` would turn off that the running server has: '' when nothing."""
    if serving_tls and fresh.tls is None:
        return "would turn TLS off"
    if running.users and not fresh.users:
        return "would turn basic authentication off"
    return ""


def _checkpw(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # a NUL byte, or what a future bcrypt refuses: no match, no traceback
        return False


def _policy(tls: TLSSettings) -> tuple[Any, ...]:
    return (tls.verify_mode, tls.min_version, tls.max_version, tls.ciphers,
            tls.prefer_server_ciphers)


def _files(tls: TLSSettings) -> dict[str, str]:
    return {"cert_file": tls.cert_file, "key_file": tls.key_file,
            "client_ca_file": tls.client_ca_file, "client_ca": tls.client_ca}


def _basic_credentials(scope: dict) -> tuple[str, bytes] | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() != b"basic":
                return None
            try:
                decoded = base64.b64decode(token.strip(), validate=True)
            except (binascii.Error, ValueError):
                return None
            user, sep, password = decoded.partition(b":")
            if not sep:
                return None
            return user.decode("utf-8", "replace"), password
    return None


def _with_headers(send: Callable[[dict], Awaitable[None]],
                  headers: dict[str, str]) -> Callable[[dict], Awaitable[None]]:
    extra = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def sending(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": list(message.get("headers", ())) + extra}
        await send(message)

    return sending
