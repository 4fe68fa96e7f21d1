"""The collector process: `llmmon serve`'s collectors, sampler and diagnoser in a child.

What they parse and render (spool files, netlink dumps, the exposition) holds this
interpreter's GIL, never the one that answers scrapes: the server only copies bytes this process
publishes (docs/design.md#processes). Started by `llmmon.serve.supervisor` as
`python -m llmmon.serve.child FD`; FD is one end of a socket pair on which the server sends
the settings first, then calls and the exposition formats scraped lately; this side answers
`ready` (or `error`), then snapshots (a format not rendered is None) and replies. It exits
when the server says stop or goes away.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable

from llmmon import logs
from llmmon.config import ConfigError
from llmmon.serve.assembly import build
from llmmon.collector import RouteError
from llmmon.serve.routes import Routes
from llmmon.sampler import Sampler

log = logging.getLogger("llmmon.serve.child")
PUBLISH_GAP = 0.1  # seconds: a burst of collector runs is published as one snapshot


def main(fd: int) -> int:
    # The server decides when this process stops: Ctrl-C, `timeout` and systemd signal the
    # whole process group, and the server still has requests to finish.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(fd)
    settings, restarts = conn.recv()
    logs.setup(settings["log.level"], settings["log.format"])
    try:
        daemon = build(settings, restarts)
    except (ConfigError, ValueError) as exc:
        conn.send(("error", str(exc)))
        return 2
    routes = daemon.routes()
    lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with lock:
            conn.send(message)

    send(("ready", sorted(routes.get), sorted(routes.post),
          [c.name for c in daemon.collectors]))
    daemon.sampler.start()
    daemon.diagnoser.start()
    threading.Thread(target=_publish, args=(daemon.sampler, send), name="publish",
                     daemon=True).start()
    try:
        while True:
            message = conn.recv()
            if message[0] == "stop":
                break
            if message[0] == "formats":  # the formats scraped lately (llmmon.serve.supervisor)
                daemon.sampler.set_formats(frozenset(message[1]))
                continue
            if message[0] == "web_refused":  # the server's refused web config reloads
                daemon.sampler.set_web_refused(message[1])
                continue
            threading.Thread(target=_answer, args=(routes, send, *message[1:]),
                             name="call", daemon=True).start()
    except (EOFError, OSError):
        log.warning("the server went away; the collector process stops")
    finally:
        daemon.diagnoser.stop()
        daemon.sampler.stop()
    return 0


def _publish(sampler: Sampler, send: Callable[[tuple[Any, ...]], None]) -> None:
    """Each new snapshot to the server, bursts coalesced; ends when the server is gone."""
    generation = -1
    while True:
        generation, text, openmetrics = sampler.exposition()
        try:
            send(("snapshot", text, openmetrics, sampler.snapshot_json()))
        except OSError:
            return
        time.sleep(PUBLISH_GAP)
        sampler.wait_change(generation, timeout=3600.0)


def _answer(routes: Routes, send: Callable[[tuple[Any, ...]], None], call_id: int,
            method: str, key: str, query: dict[str, str]) -> None:
    try:
        if method == "GET":
            reply: tuple[Any, ...] = ("reply", call_id, 200, routes.get[key]())
        else:
            reply = ("reply", call_id, 200, routes.post[key](query))
    except RouteError as exc:
        reply = ("reply", call_id, exc.status, str(exc))
    except ValueError as exc:
        reply = ("reply", call_id, 400, str(exc))
    except Exception as exc:  # a bug met by one call costs that call
        log.error("%s /api/v1/%s failed:\n%s", method, key, traceback.format_exc())
        reply = ("reply", call_id, 500, f"{type(exc).__name__}: {exc}")
    try:
        send(reply)
    except OSError:
        pass  # the server is gone; the main loop sees it too
    except Exception as exc:  # an answer pickle cannot carry
        send(("reply", call_id, 500, f"the answer could not be sent: {exc}"))


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
