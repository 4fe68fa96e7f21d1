"""Logging in node_exporter's shapes: logfmt (default) or JSON lines on stderr."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time

from llmmon.textsafe import printable

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "warn": logging.WARNING, "error": logging.ERROR}


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + \
        f".{int(record.msecs):03d}Z"


def _message(formatter: logging.Formatter, record: logging.LogRecord) -> str:
    """The message, its traceback if any, and nothing UTF-8 cannot write."""
    message = record.getMessage()
    if record.exc_info:
        message += "\n" + formatter.formatException(record.exc_info)
    return printable(message)


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        # JSON string quoting escapes backslashes, quotes and control characters, which is
        # what logfmt parsers unquote: a file name holding `\"` cannot add fields to the line.
        message = json.dumps(_message(self, record), ensure_ascii=False)
        return (f'ts={_timestamp(record)} level={record.levelname.lower()} '
                f'logger={record.name} msg={message}')


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"ts": _timestamp(record), "level": record.levelname.lower(),
                           "logger": record.name, "msg": _message(self, record)})


# Libraries that log a line per connection or request, which a client can repeat at will.
NOISY_LOGGERS = ("asyncio", "uvicorn.error")
RATE_LIMIT_PERIOD = 10.0


class RateLimit(logging.Filter):
    """At most one record per message and period; the next one says how many were dropped."""

    def __init__(self, period: float = RATE_LIMIT_PERIOD) -> None:
        super().__init__()
        self.period = period
        self._seen: dict[str, tuple[float, int]] = {}  # message -> (last emitted, dropped since)
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)[:200]
        now = time.monotonic()
        with self._lock:
            last, dropped = self._seen.get(key, (float("-inf"), 0))
            if now - last < self.period:
                self._seen[key] = (last, dropped + 1)
                return False
            if len(self._seen) > 256:
                self._seen.clear()
            self._seen[key] = (now, 0)
        if dropped:
            record.msg = f"{record.getMessage()} ({dropped} more like it in {self.period:g}s)"
            record.args = None
        return True


def setup(level: str, fmt: str) -> None:
    if level.lower() not in LEVELS:
        raise ValueError(f"log level {level!r}: use one of debug, info, warning, error")
    if fmt not in ("logfmt", "json"):
        raise ValueError(f"log format {fmt!r}: use logfmt or json")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter() if fmt == "logfmt" else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LEVELS[level.lower()])
    for name in NOISY_LOGGERS:
        noisy = logging.getLogger(name)
        noisy.filters[:] = [RateLimit()]
