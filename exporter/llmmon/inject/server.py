"""The webhook's HTTPS server: FastAPI routes over uvicorn, certificates re-read when renewed.

Two mutate paths, one per opt-in: /mutate is called for pods labelled llmmon.io/inject=true,
/mutate/namespace for every pod of a namespace so labelled (the API server's selectors decide;
the webhook calls no API, so it needs no RBAC and no token).
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from llmmon.inject import admission
from llmmon.inject.podpatch import Settings

log = logging.getLogger("llmmon.webhook")


def create_app(settings: Settings) -> FastAPI:
    app = FastAPI(title="llmmon webhook", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz")
    def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok\n")

    @app.post("/mutate")
    async def mutate(request: Request) -> JSONResponse:
        return await _review(request, settings, namespace_opted_in=False)

    @app.post("/mutate/namespace")
    async def mutate_namespace(request: Request) -> JSONResponse:
        return await _review(request, settings, namespace_opted_in=True)

    return app


async def _review(request: Request, settings: Settings, namespace_opted_in: bool
                  ) -> JSONResponse:
    try:
        review = admission.parse(await _bounded_body(request))
    except admission.BadReview as exc:
        log.warning("bad admission review from %s: %s",
                    request.client.host if request.client else "?", exc)
        return JSONResponse({"error": str(exc)}, status_code=400)
    outcome = admission.decide(review, settings, namespace_opted_in)
    log.info("review %s", " ".join(f"{k}={v}" for k, v in {
        **admission.describe(review), "job": outcome.job_id, "operations": len(outcome.patch),
        "outcome": outcome.reason}.items()))
    return JSONResponse(admission.response(review.uid, outcome))


async def _bounded_body(request: Request) -> bytes:
    """The body, refused as soon as it passes the limit (not read whole first)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > admission.MAX_BODY:
        raise admission.BadReview(f"body of {length} bytes is over the "
                                  f"{admission.MAX_BODY}-byte limit")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > admission.MAX_BODY:
            raise admission.BadReview(f"body is over the {admission.MAX_BODY}-byte limit")
    return bytes(body)


@dataclass
class Certificates:
    """The serving certificate, re-read at a handshake once its files changed (cert-manager
    renews it in place); a failed read keeps the previous one."""

    cert_file: str
    key_file: str
    _context: ssl.SSLContext | None = None
    _stamp: tuple[float, ...] = ()
    _checked: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def context(self) -> ssl.SSLContext:
        ctx = self._load()
        ctx.sni_callback = self._on_hello
        return ctx

    def _load(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        stamp = self._files_stamp()
        ctx.load_cert_chain(self.cert_file, self.key_file)
        self._context, self._stamp = ctx, stamp
        return ctx

    def _files_stamp(self) -> tuple[float, ...]:
        return tuple(os.stat(f).st_mtime for f in (self.cert_file, self.key_file))

    def _on_hello(self, sslobj: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._checked >= 1.0:
                self._checked = now
                try:
                    if self._files_stamp() != self._stamp:
                        self._load()
                        self._context.sni_callback = self._on_hello  # type: ignore[union-attr]
                        log.info("certificate reloaded from %s", self.cert_file)
                except (OSError, ssl.SSLError) as exc:
                    log.error("keeping the previous certificate: %s", exc)
            if self._context is not None:
                sslobj.context = self._context


def run(settings: Settings, host: str, port: int, cert_file: str, key_file: str) -> int:
    """Serve until stopped (SIGTERM: uvicorn finishes what is in flight)."""
    certificates = Certificates(cert_file, key_file)
    certificates.context()  # a missing or wrong certificate fails here, at start
    config = uvicorn.Config(create_app(settings), host=host, port=port, ssl_certfile=cert_file,
                            ssl_keyfile=key_file, access_log=False, log_config=None,
                            timeout_graceful_shutdown=5, limit_concurrency=200)
    config.ssl_context_factory = lambda _config, _default: certificates.context()
    uvicorn.Server(config).run()
    return 0
