"""Incident directories as the format (v1) lays them out, and a node that serves them.

`write_incident` writes one under a root as the daemon does (marker, summary.json, files);
`NodeServer` is a stdlib ThreadingHTTPServer with the three incident routes of the contract
(and a /metrics, for Prometheus to find it): the node side the fetch talks to, until the
daemon's own routes exist.  The builders make the job of the fast tests: four ranks of a
2x2 mesh on two nodes (a: ranks 0-1, b: ranks 2-3), rank 3 stuck, the real Flight Recorder
dumps of tests/fixtures/incidents/fr/mesh.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from llmmon.incidents import layout

FIXTURES = Path(__file__).parents[1] / "fixtures" / "incidents"
MESH = FIXTURES / "fr" / "mesh"
JOB = "team-a.llama"
T0 = 1796000000.0


def write_incident(root: Path, summary: dict[str, Any], files: dict[str, bytes]) -> Path:
    """`root/<id>/` with the marker, summary.json (its `files` filled in) and `files`."""
    path = root / summary["id"]
    (path / layout.FR_DIR).mkdir(parents=True)
    (path / layout.MARKER).touch()
    for name, data in files.items():
        (path / name).write_bytes(data)
    summary = {**summary, "files": {n: len(d) for n, d in files.items()},
               "bytes": sum(map(len, files.values()))}
    (path / layout.SUMMARY).write_text(json.dumps(summary))
    return path


def stack(*functions: str) -> dict[str, Any]:
    frames = [{"file": f"/app/{f}.py", "line": 10 + i, "function": f, "module": f}
              for i, f in enumerate(functions)]
    return {"source": "reporter", "state": "S (sleeping)",
            "where": f"{functions[0]} (/app/{functions[0]}.py:10)", "frames": frames,
            "blocked": []}


def network(**during: float) -> dict[str, Any]:
    """One RDMA port whose counters rose by `during` over the stall (before: 1 each)."""
    return {"spans": {"before": [T0 - 60, T0], "during": [T0, T0 + 15]},
            "ports": [{"kind": "rdma", "device": "mlx5_0", "port": "1", "netdev": "",
                       "counters": {m: {"before": 1.0, "during": v} for m, v in during.items()}}]}


def summary(node: str, ranks: list[int], culprit: list[int], cause: str, **extra: Any
            ) -> dict[str, Any]:
    slug = layout.slug(JOB)
    doc = {"schema": 1, "id": f"20261207T120102Z-{slug}-{hashlib.sha1(node.encode()).hexdigest()[:6]}",
           "job_id": JOB, "node": node, "trigger": "stalled", "onset": T0,
           "declared": T0 + 15, "completed": T0 + 23,
           "verdict": f"job {JOB}: as {node} sees it",
           "culprit": {"ranks": culprit, "cause": cause, "text": f"{node} says {culprit}"},
           "local_ranks": ranks, "stalled_groups": [], "end": None,
           "dumps": {str(r): "collected" for r in ranks}, "left_out": [], "errors": []}
    doc.update(extra)
    return doc


def ranks_doc() -> dict[str, Any]:
    groups = [{"pg": "1", "pg_desc": "mesh_dp", "ranks": "0,2"},
              {"pg": "2", "pg_desc": "mesh_dp", "ranks": "1,3"},
              {"pg": "3", "pg_desc": "mesh_tp", "ranks": "0-1"},
              {"pg": "4", "pg_desc": "mesh_tp", "ranks": "2-3"}]
    return {"job_id": JOB, "ranks": [], "groups": groups}


def node_files(ranks: list[int], stacks: dict[int, dict[str, Any]],
               net: dict[str, Any] | None = None) -> dict[str, bytes]:
    files = {layout.RANKS: json.dumps(ranks_doc()).encode(),
             layout.STACKS: json.dumps({"ranks": {str(r): s for r, s in stacks.items()}}).encode()}
    files.update({f"fr/rank_{r}.json": (MESH / f"rank_{r}.json").read_bytes() for r in ranks})
    if net is not None:
        files[layout.NETWORK] = json.dumps(net).encode()
    return files


WAIT = ("wait", "all_gather", "train_step", "main")


def node_a() -> tuple[dict[str, Any], dict[str, bytes]]:
    """Ranks 0-1, waiting on ranks of node b: can only say "remote"."""
    return (summary("node-a", [0, 1], [2, 3], "remote", onset=T0 + 2.5),
            node_files([0, 1], {0: stack(*WAIT), 1: stack(*WAIT)},
                       network(llmmon_rdma_out_of_sequence_total=12,
                               llmmon_rdma_roce_adp_retransmits_total=20)))


def node_b() -> tuple[dict[str, Any], dict[str, bytes]]:
    """Ranks 2-3: rank 3 is in stuck_forever, its own root."""
    return (summary("node-b", [2, 3], [3], "stack_root"),
            node_files([2, 3], {2: stack(*WAIT), 3: stack("stuck_forever", "main")},
                       network(llmmon_rdma_out_of_sequence_total=5000,
                               llmmon_rdma_roce_adp_retransmits_total=150)))


@dataclass
class NodeServer:
    """A node's incident routes over `root`, on 127.0.0.1 (use as a context manager).
    `metrics`: the exposition its /metrics serves; `auth`: "user:password" it demands."""

    root: Path
    metrics: str = ""
    auth: str = ""
    requests: list[str] = field(default_factory=list)

    def __enter__(self) -> NodeServer:
        node = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                node.requests.append(self.path)
                if node.auth and self.headers.get("Authorization") != \
                        "Basic " + base64.b64encode(node.auth.encode()).decode():
                    return self._send(401, b"{}")
                url = urllib.parse.urlsplit(self.path)
                parts = [urllib.parse.unquote(p) for p in url.path.split("/")[1:]]
                if url.path == "/metrics":
                    return self._send(200, node.metrics.encode(), "text/plain; version=0.0.4")
                if parts[:3] != ["api", "v1", "incidents"]:
                    return self._send(404, b"{}")
                if len(parts) == 3:
                    job = urllib.parse.parse_qs(url.query).get("job_id", [None])[0]
                    return self._json({"incidents": node.listing(job)})
                ident = parts[3]
                path = node.root / ident
                if not layout.ID.match(ident) or not (path / layout.MARKER).exists():
                    return self._send(404, b"{}")
                if len(parts) == 4:
                    return self._json(json.loads((path / layout.SUMMARY).read_text()))
                name = "/".join(parts[5:])
                if parts[4] != "files" or not layout.allowed(name) or not (path / name).is_file():
                    return self._send(404, b"{}")
                return self._send(200, (path / name).read_bytes(), "application/octet-stream")

            def _json(self, doc: Any) -> None:
                self._send(200, json.dumps(doc).encode())

            def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def listing(self, job: str | None) -> list[dict[str, Any]]:
        """Every incident here (of `job`), newest first."""
        docs = [json.loads((p / layout.SUMMARY).read_text()) for p in self.root.iterdir()
                if (p / layout.MARKER).exists()]
        docs = [d for d in docs if job is None or d["job_id"] == job]
        return sorted(docs, key=lambda d: d["completed"], reverse=True)
