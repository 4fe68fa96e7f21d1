"""Runs collectors on their own cadences and keeps pre-rendered snapshots for /metrics.

Each collector gets a driver thread and a worker thread.  The driver hands the worker one
run at a time and waits at most the collector's timeout; a run that hangs (a wedged NVML
call, a stuck NFS read) marks the collector failed while the worker stays blocked, and no new
run is started until it returns.  Scrapes only concatenate bytes rendered here: they never
wait on hardware and never render.

Each run is rendered in the formats that are scraped (`set_formats`; both until told): a node
scraped by Prometheus alone is rendered in OpenMetrics only, half the rendering, so that the
daemon stays within its CPU target (docs/benchmarks/2026-12-05-soak.md).  A format
asked for again is rendered from each collector's last good run at once, without waiting for
the next runs.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from prometheus_client.core import Metric

from llmmon.collector import Collector, Context, ErrorLog
from llmmon.exposition import FORMATS, OM_EOF, OPENMETRICS, TEXT, finish, render_format
from llmmon.metrics import Families, MetricSpec, checked

log = logging.getLogger("llmmon.sampler")

SUCCESS = MetricSpec(
    "llmmon_exporter_collector_success", "gauge",
    "1 if the collector's last run finished within its timeout without failing.", ("collector",))
DURATION = MetricSpec(
    "llmmon_exporter_collector_duration_seconds", "gauge",
    "Wall time of the collector's last finished run (or of the run still hanging).",
    ("collector",))
ERRORS = MetricSpec(
    "llmmon_exporter_collector_errors_total", "counter",
    "Problems met by the collector: skipped series, failed or timed-out runs.", ("collector",))
LAST_SUCCESS = MetricSpec(
    "llmmon_exporter_collector_last_success_timestamp_seconds", "gauge",
    "Unix time of the collector's last successful run.", ("collector",))
WATCHED = MetricSpec(
    "llmmon_exporter_collector_watched", "gauge",
    "How many devices, files or ranks the collector found to watch (0: nothing here).",
    ("collector",))
BUILD = MetricSpec(
    "llmmon_exporter_build_info", "info", "Version of the running llmmon exporter.",
    ("version",))
SERIES = MetricSpec(
    "llmmon_exporter_collector_series", "gauge",
    "Series in the collector's last snapshot: what it adds to every scrape.", ("collector",))
SERIES_TOTAL = MetricSpec(
    "llmmon_exporter_series", "gauge",
    "Series of the whole exposition: every collector's plus these self-metrics.")
BUDGET = MetricSpec(
    "llmmon_exporter_series_budget", "gauge",
    "The node's series budget (--sampler.series-budget; 0: no budget).")
OVER_BUDGET = MetricSpec(
    "llmmon_exporter_series_budget_exceeded", "gauge",
    "1 while llmmon_exporter_series exceeds a non-zero --sampler.series-budget: a collector "
    "(llmmon_exporter_collector_series says which) grew the node past what capacity planning "
    "assumed. Nothing is dropped; the flags in docs/capacity.md trim it.")
RESTARTS = MetricSpec(
    "llmmon_exporter_collector_process_restarts_total", "counter",
    "Times `llmmon serve` started its collector process again since it started: the process "
    "died, was killed, or grew past --sampler.max-rss-mib (the log says which).")
WEB_REFUSED = MetricSpec(
    "llmmon_exporter_web_config_reloads_refused_total", "counter",
    "Changes of --web.config.file not applied because they would turn TLS or basic "
    "authentication off (the last good config stays; turning them off takes a restart). "
    "Exported only with a web config.")
SPECS = (SUCCESS, DURATION, ERRORS, LAST_SUCCESS, WATCHED, BUILD, SERIES, SERIES_TOTAL, BUDGET,
         OVER_BUDGET, RESTARTS, WEB_REFUSED)

@dataclass
class CollectorState:
    """What the exporter knows about one collector; read by /api/v1/collectors."""

    name: str
    interval: float
    timeout: float
    status: str = "pending"  # pending | ok | empty | failed
    message: str = ""
    last_success: float | None = None  # Unix time, for the metric
    last_success_monotonic: float | None = None  # for staleness: a wall-clock step is no age
    last_duration: float | None = None
    last_error: str | None = None
    errors_total: int = 0
    # CPU time (not wall time) of its runs: collecting, in its worker thread, then checking and
    # rendering; threads it keeps between runs (20 Hz power, XID and PID watches) are not in it.
    # Served by /api/v1/collectors, not as a series: the fat node's budget has no room for one
    # per collector.
    cpu_seconds: float = 0.0
    watched: int | None = None
    series: int = 0
    # The last good run while it is served (None: nothing to serve), and its fragments; a
    # fragment is None while its format is not rendered (see Sampler.set_formats).
    families: list[Metric] | None = None
    text: bytes | None = b""
    openmetrics: bytes | None = b""
    digest: Any = None  # what `Sampler.digest` made of the last good run, while it is served

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "message": self.message,
            "interval_seconds": self.interval,
            "timeout_seconds": self.timeout,
            "last_success": self.last_success,
            "last_duration_seconds": self.last_duration,
            "last_error": self.last_error,
            "errors_total": self.errors_total,
            "cpu_seconds": self.cpu_seconds,
            "watched": self.watched,
            "series": self.series,
            "formats": [fmt for fmt in (TEXT, OPENMETRICS)
                        if self.families is not None and getattr(self, fmt) is not None],
        }


class _Worker:
    """A daemon thread that runs one job at a time for a driver; it may hang forever."""

    def __init__(self, name: str) -> None:
        self._job: Callable[[], None] | None = None
        self._ready = threading.Event()
        self.done = threading.Event()
        self.done.set()
        threading.Thread(target=self._loop, name=f"collect-{name}", daemon=True).start()

    def submit(self, job: Callable[[], None]) -> None:
        self.done.clear()
        self._job = job
        self._ready.set()

    def _loop(self) -> None:
        while True:
            self._ready.wait()
            self._ready.clear()
            job, self._job = self._job, None
            try:
                if job is not None:
                    job()
            finally:
                self.done.set()


class Sampler:
    """Owns the collectors, their threads and the rendered exposition."""

    def __init__(self, collectors: list[Collector], version: str,
                 max_staleness: float = 60.0, series_budget: int = 0,
                 restarts: int | None = None,
                 digest: Callable[[list[Metric], Any], Any] | None = None) -> None:
        self.collectors = collectors
        # A reader of the exposition (llmmon.diagnose): called with each good run's families and
        # its previous result, so that the reader takes what it needs as the run is rendered
        # instead of parsing the rendered bytes back.
        self.digest = digest
        self.max_staleness = max_staleness
        self.series_budget = series_budget
        self.restarts = restarts  # of the collector process this sampler runs in, if any
        self.web_refused: int | None = None  # told by the server when it has a web config
        self._over_budget = False
        self.states = {
            c.name: CollectorState(c.name, c.config["interval"], c.config["timeout"])
            for c in collectors
        }
        self._version = version
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._generation = 0
        self._formats = FORMATS
        self._bodies: dict[tuple[str, bool], tuple[int, bytes]] = {}
        self._threads: list[threading.Thread] = []
        self._self: dict[str, bytes | None] = dict.fromkeys(FORMATS)  # fmt -> its own series
        self._render_self()

    # lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        for collector in self.collectors:
            try:
                collector.start()
            except Exception as exc:  # a collector that cannot start must not stop the others
                self._finish(collector, None, 0.0, f"start failed: {exc}", Context(), None)
                continue
            thread = threading.Thread(target=self._drive, args=(collector,),
                                      name=f"drive-{collector.name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for collector in self.collectors:
            try:
                collector.close()
            except Exception:
                log.exception("collector=%s close failed", collector.name)

    def wait_first_cycle(self, timeout: float) -> bool:
        """Block until every collector has finished (or failed) once; for tools and tests."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(s.status != "pending" for s in self.states.values()):
                return True
            time.sleep(0.01)
        return False

    # the driver loop -----------------------------------------------------------------
    def _drive(self, collector: Collector) -> None:
        worker = _Worker(collector.name)
        errlog = ErrorLog(collector.name)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if not self._cycle(collector, worker, errlog, started):
                    return
            except Exception as exc:  # a bug met by one run costs that run, never the thread
                log.exception("collector=%s: run failed unexpectedly", collector.name)
                self._finish(collector, None, time.monotonic() - started,
                             f"{type(exc).__name__}: {exc}", Context(), errlog)
            delay = collector.config["interval"] - (time.monotonic() - started)
            self._stop.wait(max(delay, 0.0))

    def _cycle(self, collector: Collector, worker: _Worker, errlog: ErrorLog,
               started: float) -> bool:
        """One run handed to the worker; False when the daemon stopped while it hung."""
        timeout = collector.config["timeout"]
        ctx = Context()
        result: dict[str, Any] = {}

        def job() -> None:
            cpu = time.thread_time()
            try:
                result["families"] = list(collector.collect(ctx))
            except Exception as exc:
                result["error"] = f"{type(exc).__name__}: {exc}"
                log.debug("collector=%s\n%s", collector.name, traceback.format_exc())
            finally:
                result["cpu"] = time.thread_time() - cpu

        worker.submit(job)
        if worker.done.wait(timeout):
            self._finish(collector, result.get("families"), time.monotonic() - started,
                         result.get("error"), ctx, errlog, result["cpu"])
            return True
        self._finish(collector, None, time.monotonic() - started,
                     f"timed out after {timeout:g}s (the read is still blocked)", ctx, errlog)
        while not worker.done.wait(1.0):
            if self._stop.is_set():
                return False
            self._expire(collector.name)
        with self._lock:  # the hung run's CPU, now that it returned
            self.states[collector.name].cpu_seconds += result["cpu"]
        return True

    def run_once(self, collector: Collector) -> None:
        """Run one collector synchronously (used by one-shot tools such as diagnose)."""
        ctx = Context()
        started, cpu = time.monotonic(), time.thread_time()
        try:
            families, error = list(collector.collect(ctx)), None
        except Exception as exc:
            families, error = None, f"{type(exc).__name__}: {exc}"
        self._finish(collector, families, time.monotonic() - started, error, ctx, None,
                     time.thread_time() - cpu)

    def _finish(self, collector: Collector, families: list[Metric] | None, duration: float,
                error: str | None, ctx: Context, errlog: ErrorLog | None,
                cpu: float = 0.0) -> None:
        """Publish a run's outcome; `cpu` is what collecting took, rendering is added here."""
        rendering = time.thread_time()
        fragments: dict[str, bytes] | None = None
        digest = None
        if families is not None:
            formats = self._formats
            try:
                families = checked(families, ctx.error)
                fragments = {fmt: render_format(families, fmt) for fmt in formats}
            except Exception as exc:  # the run is lost, not the driver thread
                log.debug("collector=%s render\n%s", collector.name, traceback.format_exc())
                error = f"rendering failed: {type(exc).__name__}: {exc}"
        if fragments is not None and self.digest is not None:
            try:
                digest = self.digest(families, self.states[collector.name].digest)
            except Exception as exc:  # its reader misses this run; the scrapes do not
                log.debug("collector=%s digest\n%s", collector.name, traceback.format_exc())
                ctx.error("digest", f"digest for /api/v1/diagnose failed: "
                                    f"{type(exc).__name__}: {exc}")
        if fragments is not None and ctx.watched == 0:
            wrong_roots = collector.env.root_problems(collector.roots)
            if wrong_roots:  # not "this node has none": the daemon looks in the wrong place
                fragments = None
                error = f"nothing to watch: {ctx.watched_what}; " + "; ".join(wrong_roots)
        cpu += time.thread_time() - rendering
        with self._lock:
            state = self.states[collector.name]
            previous_status = state.status
            state.cpu_seconds += cpu
            state.last_duration = duration
            state.errors_total += ctx.error_count
            if fragments is None:
                state.status = "failed"
                state.last_error = error
                state.message = error or "failed"
                state.errors_total += 1
                self._expire_locked(state)
            else:
                state.families = families
                # a format asked for while this run rendered is filled in by exposition()
                for fmt in FORMATS:
                    setattr(state, fmt, fragments.get(fmt) if fmt in self._formats else None)
                state.digest = digest
                state.series = sum(len(f.samples) for f in families or ())
                state.last_success = time.time()
                state.last_success_monotonic = time.monotonic()
                state.last_error = "; ".join(sorted(ctx.errors.values()))[:2000] or None
                state.watched = ctx.watched
                if ctx.watched == 0:
                    state.status = "empty"
                    state.message = f"nothing to watch: {ctx.watched_what}"
                else:
                    state.status = "ok"
                    state.message = (f"watching {ctx.watched} {ctx.watched_what}"
                                     if ctx.watched is not None else "")
            status_changed = previous_status != state.status
        if errlog is not None:
            if fragments is None:
                errlog.fail(state.message)
            else:
                errlog.cycle(ctx.errors)
        if status_changed and state.status == "empty":
            log.info("collector=%s found nothing to watch (%s); not an error",
                     collector.name, ctx.watched_what)
        self._render_self()

    def _expire(self, name: str) -> None:
        with self._lock:
            self._expire_locked(self.states[name])

    def _expire_locked(self, state: CollectorState) -> None:
        """Drop a failing collector's last good snapshot once older than max_staleness."""
        last = state.last_success_monotonic
        stale = last is None or last < time.monotonic() - self.max_staleness
        if state.families is not None and stale:
            state.families = None
            state.text = state.openmetrics = b""
            state.digest = None
            state.series = 0
            self._bump_locked()

    def _bump_locked(self) -> None:
        self._generation += 1
        self._changed.notify_all()

    # rendering -----------------------------------------------------------------------
    def _self_families(self) -> Families:
        families = Families()
        families.add(BUILD, [self._version], 1)
        for state in self.states.values():
            labels = [state.name]
            families.add(SUCCESS, labels, 1 if state.status in ("ok", "empty") else 0)
            families.add(ERRORS, labels, state.errors_total)
            if state.last_duration is not None:
                families.add(DURATION, labels, state.last_duration)
            if state.last_success is not None:
                families.add(LAST_SUCCESS, labels, state.last_success)
            if state.watched is not None:
                families.add(WATCHED, labels, state.watched)
            families.add(SERIES, labels, state.series)
        families.add(BUDGET, [], self.series_budget)
        if self.restarts is not None:
            families.add(RESTARTS, [], self.restarts)
        if self.web_refused is not None:
            families.add(WEB_REFUSED, [], self.web_refused)
        # The total counts itself and the exceeded gauge, added below.
        total = (sum(s.series for s in self.states.values())
                 + sum(len(f.samples) for f in families) + 2)
        families.add(SERIES_TOTAL, [], total)
        over = bool(self.series_budget) and total > self.series_budget
        families.add(OVER_BUDGET, [], int(over))
        if over != self._over_budget:
            self._over_budget = over
            if over:
                largest = max(self.states.values(), key=lambda st: st.series)
                log.warning("series budget exceeded: %d series > --sampler.series-budget=%d "
                            "(largest: collector=%s with %d)", total, self.series_budget,
                            largest.name, largest.series)
        return families

    def _render_self(self) -> None:
        """The sampler's own series, after every run, in the formats scraped only."""
        with self._lock:
            families, formats = self._self_families(), self._formats
        rendered = {fmt: render_format(families, fmt) for fmt in formats}
        with self._lock:  # a format dropped meanwhile stays None, to be filled when asked again
            self._self.update({fmt: data for fmt, data in rendered.items()
                               if fmt in self._formats})
            self._bump_locked()

    def wait_change(self, generation: int, timeout: float) -> int:
        """The snapshot generation once it differs from `generation` (or after `timeout`)."""
        with self._changed:
            self._changed.wait_for(lambda: self._generation != generation, timeout)
            return self._generation

    def set_web_refused(self, count: int) -> None:
        """The server's count of refused web config reloads (it holds the web config)."""
        with self._lock:
            self.web_refused = count
        self._render_self()

    def set_formats(self, formats: frozenset[str]) -> None:
        """Render runs in these formats from now on (the ones scraped); a format dropped is
        forgotten, one added is rendered from each collector's last good run by the next
        exposition()."""
        with self._lock:
            if formats == self._formats:
                return
            for fmt in self._formats - formats:
                self._self[fmt] = None
                for state in self.states.values():
                    if state.families is not None:
                        setattr(state, fmt, None)
            self._formats = frozenset(formats)
            self._bump_locked()

    def _fill(self) -> None:
        """Render the wanted fragments a collector's last good run lacks (a format asked for
        after the run was rendered)."""
        with self._lock:
            missing = [(state, state.families, fmt) for state in self.states.values()
                       for fmt in self._formats
                       if state.families is not None and getattr(state, fmt) is None]
            own = [fmt for fmt in self._formats if self._self[fmt] is None]
        if own:
            self._render_self()
        for state, families, fmt in missing:
            try:
                fragment = render_format(families, fmt)
            except Exception:  # the run rendered in the other format: never expected
                log.exception("collector=%s: rendering %s failed; left out of it", state.name,
                              fmt)
                fragment = b""
            with self._lock:
                if state.families is families and fmt in self._formats:
                    setattr(state, fmt, fragment)

    def exposition(self) -> tuple[int, bytes | None, bytes | None]:
        """Generation, text and OpenMetrics (without its # EOF) of the whole exposition; a
        format not rendered (see set_formats) is None."""
        self._fill()
        with self._lock:
            joined = []
            for fmt in (TEXT, OPENMETRICS):
                parts = [getattr(s, fmt) for s in self.states.values()] + [self._self[fmt]]
                joined.append(b"".join(parts) if fmt in self._formats
                              and None not in parts else None)
            return self._generation, joined[0], joined[1]

    def digests(self) -> list[Any]:
        """Each served collector's digest of its last good run (see `digest`)."""
        with self._lock:
            return [s.digest for s in self.states.values() if s.digest is not None]

    def body(self, openmetrics: bool, compressed: bool) -> bytes:
        """The full exposition, cached per snapshot generation (and gzipped on demand)."""
        key = ("om" if openmetrics else "text", compressed)
        with self._lock:
            cached = self._bodies.get(key)
            if cached and cached[0] == self._generation:
                return cached[1]
        generation, text, om = self.exposition()
        if text is None or om is None:  # set_formats is the collector process' (the relay's)
            raise RuntimeError("an in-process sampler renders both formats")
        data = finish(om + OM_EOF if openmetrics else text, compressed)
        with self._lock:
            self._bodies[key] = (generation, data)
        return data

    wait_body = body  # both formats are always rendered here

    def snapshot_json(self) -> list[dict[str, Any]]:
        with self._lock:
            return [state.as_json() for state in self.states.values()]
