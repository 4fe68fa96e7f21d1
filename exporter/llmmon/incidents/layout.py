"""The incident directory: its name, its files, and the marker that makes it the daemon's.

`<dir>/<id>/`, id `<UTC time>-<job slug>-<6 hex>`, written under `<dir>/.tmp-<id>/` and renamed
into place once complete, so a listed incident is always whole. Only directories whose MARKER
and directory belong to the daemon's user are listed or removed: other users may write under
the same root.
"""

from __future__ import annotations

import re

DEFAULT_DIR = "/var/lib/llmmon/incidents"
SCHEMA = 1
MARKER = ".llmmon-incident"
TMP_PREFIX = ".tmp-"
ID = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[A-Za-z0-9._-]{1,48}-[0-9a-f]{6}$")
SUMMARY = "summary.json"
RANKS = "ranks.json"
STACKS = "stacks.json"
COLLECTIVES = "collectives.json"
ENV = "env.json"
GPUS = "gpus.json"
NETWORK = "network.json"
KMSG = "kmsg.txt"
FILES = (SUMMARY, RANKS, STACKS, COLLECTIVES, ENV, GPUS, NETWORK, KMSG)
FR_DIR = "fr"
FR_FILE = re.compile(r"^rank_\d{1,7}(\.json)?$")
TRIGGERS = ("stalled", "waiting", "ended")


def slug(job_id: str) -> str:
    """The job id as it may appear in a directory name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", job_id)[:48] or "_"


def allowed(name: str) -> bool:
    """A file name an incident may hold: one of FILES, or `fr/<dump>`."""
    if name in FILES:
        return True
    head, _, tail = name.partition("/")
    return head == FR_DIR and bool(FR_FILE.match(tail))
