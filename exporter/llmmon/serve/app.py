"""The HTTP face of the daemon: pre-rendered /metrics, health, a landing page and JSON APIs.

/metrics hands out bytes the sampler rendered when a snapshot changed (in a format nobody
scraped lately, after it asked for them); nothing here touches hardware or renders metric
families.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Awaitable, Callable, Iterator, Protocol

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse as StarletteJSONResponse
from fastapi.responses import PlainTextResponse, RedirectResponse, Response
from fastapi.responses import StreamingResponse

from llmmon import __version__
from llmmon.collector import RouteError
from llmmon.incidents.html import error_page, list_page
from llmmon.incidents.incidentpage import Incident, incident_page
from llmmon.incidents.status import Answer, NodeStatus, status_page
from llmmon.incidents.store import IncidentError, Store, UnknownIncident
from llmmon.serve.routes import Routes
from llmmon.textsafe import json_ready


class JSONResponse(StarletteJSONResponse):
    """The answer of every /api/v1 endpoint: always 200-able, never a 500.

    Starlette's JSONResponse raises on a string UTF-8 cannot encode (a job directory with a
    non-UTF-8 name, a lone surrogate in a rank's `gpu_name`) and on NaN or infinity; this one
    renders such content again with those values escaped or null (`llmmon.textsafe.json_ready`).
    The common case pays nothing: the walk runs only after the plain rendering failed.
    """

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except (UnicodeEncodeError, ValueError):  # ValueError: NaN or infinity
            return super().render(json_ready(content))


TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def qualities(header: str) -> dict[str, float]:
    """Each token an Accept or Accept-Encoding header lists (lower case) with its quality
    (RFC 9110 12.4.2): `q=0` means "not acceptable", and a q that is not a number in [0, 1]
    counts as 0, so a garbled preference falls back to the default instead of opting in."""
    found: dict[str, float] = {}
    for part in header.split(","):
        token, *params = (piece.strip() for piece in part.split(";"))
        if not token:
            continue
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
                if not 0.0 <= quality <= 1.0:  # also NaN
                    quality = 0.0
        found[token.lower()] = max(quality, found.get(token.lower(), 0.0))
    return found


def wants_openmetrics(accept: str) -> bool:
    """True when the scraper lists OpenMetrics among the media types it accepts (q > 0)."""
    return qualities(accept).get("application/openmetrics-text", 0.0) > 0.0


def wants_gzip(accept_encoding: str) -> bool:
    """True when the scraper lists gzip with q > 0; identity is always acceptable."""
    return qualities(accept_encoding).get("gzip", 0.0) > 0.0


class Exposition(Protocol):
    """What the app serves from: the sampler itself, or the supervisor of a collector process."""

    def body(self, openmetrics: bool, compressed: bool) -> bytes | None: ...

    def wait_body(self, openmetrics: bool, compressed: bool) -> bytes | None: ...

    def snapshot_json(self) -> list[dict[str, Any]]: ...


MAX_HEADER_BYTES = 16 << 10


class HeaderLimit:
    """Answers 431 to a request whose header block passes MAX_HEADER_BYTES: h11 bounds only a
    head still arriving, and one that arrives whole in a read is parsed at any size."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]],
                       send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] == "http" and sum(
                len(name) + len(value) + 4 for name, value in scope["headers"]) \
                > MAX_HEADER_BYTES:
            await PlainTextResponse(f"request headers over {MAX_HEADER_BYTES} bytes\n",
                                    status_code=431)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_app(sampler: Exposition, routes: Routes, telemetry_path: str = "/metrics",
               incidents: Store | None = None) -> FastAPI:
    """`incidents`: the incident directory, served from disk by this process (so while the
    collector process is down too); None: no incident routes."""
    app = FastAPI(title="llmmon", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url="/api/v1/openapi.json")

    @app.get(telemetry_path, include_in_schema=False)
    async def metrics(request: Request) -> Response:
        openmetrics = wants_openmetrics(request.headers.get("accept", ""))
        gzipped = wants_gzip(request.headers.get("accept-encoding", ""))
        headers = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} if gzipped else {}
        body = sampler.body(openmetrics, gzipped)
        if body is None:  # a format nobody scraped lately: rendered now, off the event loop
            body = await run_in_threadpool(sampler.wait_body, openmetrics, gzipped)
        if body is None:
            return PlainTextResponse(
                "the collector process has not rendered this exposition format yet (it is not "
                "answering: see the exporter log); retry\n", status_code=503,
                headers={"Retry-After": "5"})
        return Response(body, headers=headers,
                        media_type=OPENMETRICS_TYPE if openmetrics else TEXT_TYPE)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok\n"

    @app.get("/api/v1/collectors")
    async def collectors_json() -> JSONResponse:
        return JSONResponse({"version": __version__, "collectors": sampler.snapshot_json()})

    @app.get("/", response_class=HTMLResponse)
    async def landing() -> HTMLResponse:
        ranks, diagnosis, gpus, listing = await asyncio.gather(
            run_in_threadpool(_answer, routes, "ranks"),
            run_in_threadpool(_answer, routes, "diagnose"),
            run_in_threadpool(_answer, routes, "gpu"),
            run_in_threadpool(lambda: None if incidents is None else incidents.listing()))
        body = sampler.body(False, False)
        ports = Answer(missing=True) if body is None else Answer(body.decode("utf-8", "replace"))
        return _page(status_page(NodeStatus(__version__, telemetry_path,
                                             sampler.snapshot_json(), ranks, diagnosis, gpus,
                                             listing, ports)))

    if incidents is not None:
        _mount_incidents(app, incidents)
    for key, handler in routes.get.items():
        _mount(app, f"/api/v1/{key}", "GET", lambda _query, handler=handler: handler())
    for key, action in routes.post.items():
        _mount(app, f"/api/v1/{key}", "POST", action)
    app.add_middleware(HeaderLimit)
    return app


def _mount(app: FastAPI, path: str, method: str,
           handler: Callable[[dict[str, str]], Any]) -> None:
    def endpoint(request: Request) -> JSONResponse:  # sync: run in a thread, off the loop
        try:
            return JSONResponse(handler(dict(request.query_params)))
        except RouteError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)

    app.add_api_route(path, endpoint, methods=[method])


# No script runs on these pages, nothing loads from elsewhere: a hostile string that escaped
# escaping could still not run.
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
                "X-Content-Type-Options": "nosniff"}
FILE_TYPES = {".json": "application/json", ".txt": "text/plain; charset=utf-8"}
CHUNK = 1 << 16


def _page(text: str, status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status_code, headers=PAGE_HEADERS)


def _answer(routes: Routes, key: str) -> Answer:
    """A GET route's document for the status page, or why not: the page renders whatever the
    collector process could answer, and says why for the rest."""
    handler = routes.get.get(key)
    if handler is None:
        return Answer(missing=True)
    try:
        return Answer(handler())
    except RouteError as exc:
        return Answer(error=f"{exc} ({exc.status})")
    except Exception as exc:  # an in-process route's own failure: one section, not the page
        return Answer(error=f"{type(exc).__name__}: {exc}")


def _mount_incidents(app: FastAPI, store: Store) -> None:
    """The contract's routes: JSON and files under /api/v1/incidents, pages under /incidents.
    Sync endpoints: each reads the disk in a thread, off the event loop."""

    def failed(exc: IncidentError, page: bool) -> Response:
        if page:
            return _page(error_page(str(exc)), exc.status)
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.get("/api/v1/incidents")
    def incidents_json(job_id: str | None = None) -> JSONResponse:
        listing = store.listing(job_id)
        return JSONResponse({"incidents": listing.incidents, "unreadable": listing.unreadable})

    @app.get("/api/v1/incidents/{incident_id}")
    def incident_json(incident_id: str) -> Response:
        try:
            return JSONResponse(store.summary(incident_id))
        except IncidentError as exc:
            return failed(exc, page=False)

    @app.get("/api/v1/incidents/{incident_id}/files/{name:path}")
    def incident_file(incident_id: str, name: str) -> Response:
        try:
            file = store.open(incident_id, name)
        except IncidentError as exc:
            return failed(exc, page=False)

        def chunks() -> Iterator[bytes]:
            with file:
                while block := file.read(CHUNK):
                    yield block

        kind = FILE_TYPES.get(os.path.splitext(name)[1], "application/octet-stream")
        return StreamingResponse(chunks(), media_type=kind,
                                 headers={"X-Content-Type-Options": "nosniff"})

    @app.get("/incidents", response_class=HTMLResponse)
    def incidents_page(job_id: str | None = None) -> HTMLResponse:
        return _page(list_page(store.listing(job_id), job_id))

    @app.get("/incidents/latest")
    def latest(job_id: str | None = None) -> Response:
        newest = store.listing(job_id).incidents
        if not newest:
            of = f" of job {job_id}" if job_id else ""
            return failed(UnknownIncident(f"no incident{of} here"), page=True)
        return RedirectResponse(f"/incidents/{newest[0]['id']}", status_code=302)

    @app.get("/incidents/{incident_id}", response_class=HTMLResponse)
    def incident_html(incident_id: str) -> Response:
        try:
            return _page(incident_page(Incident.read(store, incident_id)))
        except IncidentError as exc:
            return failed(exc, page=True)
