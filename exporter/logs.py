"""Logging in node_exporter's shapes: logfmt (default) or JSON lines on stderr."""

from __future__ import annotations

import json
import logging
import sys
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
