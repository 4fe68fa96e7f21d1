"""The replay backend: NVML answers read from snapshot files instead of the library.

A replay file is shaped like `fixtures/h200/nvml_snapshot.json` and describes one GPU; a
directory holds one file per GPU, enumerated in file-name order (zero-pad the numbers).  The
H200 capture loads unchanged.  What a file may hold (docs/gpu.md has examples):

- `system`, `device0`: calls by snapshot name, each `{"ok": value}` or
  `{"nvml_error": text, "code": nvmlReturn}`; nested maps select arguments
  (`violation_status/<policy>`, `nvlink/<link>/state`).  A call missing from the file answers
  Not Supported, as an older driver would.
- `field_values`: `NVML_FI_*` name -> `{"id", "ret", "type", "value"}`; `gpm`: `"supported"`
  and `NVML_GPM_METRIC_*` name -> `{"ret", "value"}`.
- `xid_events`: `[{"xid": 79}, ...]`, an append-only log; each event is delivered once.

Any entry may also be `{"sequence": [entry, ...]}` (successive calls take successive entries,
the last repeats), carry `"delay_s": seconds` (the call takes that long, as slow NVML calls
do), or be `{"hang": true}` (the call blocks until the source is closed, as a wedged driver
does).  Files are re-read when they change, so the simulator drives a running exporter by
rewriting them (write a temporary file and rename it over the old one).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from llmmon.sources.nvml import (
    NOT_SUPPORTED,
    SUCCESS,
    UNINITIALIZED,
    EventSet,
    Field,
    NvmlError,
    NvmlSource,
    XidEvent,
)

RESULT_KEYS = ("ok", "code", "ret", "hang", "sequence")
RELOAD_CHECK_S = 0.2


class ReplayFileError(ValueError):
    """A replay file that cannot be used, with its path and the offending key."""


@dataclass
class _Gpu:
    """One replay file: the answers of one GPU."""

    path: Path
    stamp: tuple[int, int]
    device: dict[str, Any]
    system: dict[str, Any]
    fields: dict[str, Any]
    gpm: dict[str, Any]
    xids: list[int] = field(default_factory=list)


def _check_entry(entry: Any, where: str, kind: str) -> None:
    if not isinstance(entry, dict):
        raise ReplayFileError(f"{where}: expected an object, got {type(entry).__name__}")
    if "delay_s" in entry and not (isinstance(entry["delay_s"], (int, float))
                                   and entry["delay_s"] >= 0):
        raise ReplayFileError(f"{where}: delay_s must be a number of seconds >= 0")
    if "sequence" in entry:
        steps = entry["sequence"]
        if not isinstance(steps, list) or not steps:
            raise ReplayFileError(f"{where}: sequence must be a non-empty list")
        for n, step in enumerate(steps):
            if isinstance(step, dict) and "sequence" in step:
                raise ReplayFileError(f"{where}/sequence/{n}: sequences do not nest")
            _check_entry(step, f"{where}/sequence/{n}", kind)
        return
    if entry.get("hang") is True:
        return
    if kind == "call":
        if "ok" in entry:
            return
        if isinstance(entry.get("code"), int):
            return
        raise ReplayFileError(f"{where}: expected {{\"ok\": value}}, "
                              "{\"nvml_error\": text, \"code\": n}, hang or sequence")
    if not isinstance(entry.get("ret"), int):
        raise ReplayFileError(f"{where}: expected an integer \"ret\" (0 for success)")
    if entry["ret"] == SUCCESS and "value" not in entry:
        raise ReplayFileError(f"{where}: ret 0 without a value")


def _check_calls(node: dict[str, Any], where: str) -> None:
    """Device and system maps: entries, or maps of entries keyed by an argument."""
    for key, value in node.items():
        if isinstance(value, dict) and not any(k in value for k in RESULT_KEYS):
            _check_calls(value, f"{where}/{key}")
        else:
            _check_entry(value, f"{where}/{key}", "call")


def _section(doc: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise ReplayFileError(f"{where}: {key} must be an object")
    return value


def load_gpu(path: Path) -> _Gpu:
    """Parse and check one replay file; every problem names the file and the key."""
    try:
        stat = path.stat()
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except OSError as exc:
        raise ReplayFileError(f"{path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ReplayFileError(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ReplayFileError(f"{path}: expected a JSON object at the top level")
    devices = sorted(k for k in doc if k.startswith("device") and k[6:].isdigit())
    if devices != ["device0"]:
        raise ReplayFileError(f"{path}: expected exactly one GPU under \"device0\" "
                              f"(found {devices or 'none'}); use one file per GPU")
    device, system = _section(doc, "device0", str(path)), _section(doc, "system", str(path))
    _check_calls(device, f"{path}: device0")
    _check_calls(system, f"{path}: system")
    fields = _section(doc, "field_values", str(path))
    for name, entry in fields.items():
        _check_entry(entry, f"{path}: field_values/{name}", "field")
    gpm = _section(doc, "gpm", str(path))
    for name, entry in gpm.items():
        if name != "supported":
            _check_entry(entry, f"{path}: gpm/{name}", "field")
    events = doc.get("xid_events", [])
    if not isinstance(events, list) or not all(
            isinstance(e, dict) and isinstance(e.get("xid"), int) for e in events):
        raise ReplayFileError(f"{path}: xid_events must be a list of {{\"xid\": n}}")
    return _Gpu(path, (stat.st_mtime_ns, stat.st_size), device, system, fields, gpm,
                [e["xid"] for e in events])


def replay_files(path: str) -> list[Path]:
    root = Path(path)
    if root.is_dir():
        files = sorted(p for p in root.iterdir() if p.suffix == ".json" and p.is_file())
        if not files:
            raise ReplayFileError(f"{path}: no *.json replay files in this directory")
        return files
    if root.is_file():
        return [root]
    raise ReplayFileError(f"{path}: no such replay file or directory")


class ReplayNvml(NvmlSource):
    def __init__(self, path: str) -> None:
        self.description = f"replay:{path}"
        self._gpus = [load_gpu(p) for p in replay_files(path)]
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._cursors: dict[tuple[int, tuple[str, ...]], int] = {}
        self._delivered = [0] * len(self._gpus)
        self._problems: dict[str, str] = {}
        self._checked = time.monotonic()

    # file changes ----------------------------------------------------------------------
    def _refresh(self) -> None:
        """Re-read files that changed; a bad rewrite keeps the last good answers."""
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_S:
            return
        self._checked = now
        for index, gpu in enumerate(self._gpus):
            try:
                stat = gpu.path.stat()
                if (stat.st_mtime_ns, stat.st_size) == gpu.stamp:
                    continue
                fresh = load_gpu(gpu.path)
            except (OSError, ReplayFileError) as exc:
                self._problems[str(gpu.path)] = str(exc)
                continue
            with self._lock:
                self._gpus[index] = fresh
                self._cursors = {k: v for k, v in self._cursors.items() if k[0] != index}
            self._problems.pop(str(gpu.path), None)

    def problems(self) -> Mapping[str, str]:
        return dict(self._problems)

    # answering -------------------------------------------------------------------------
    def _gpu(self, gpu: int) -> _Gpu:
        self._refresh()
        if not 0 <= gpu < len(self._gpus):
            raise NvmlError(2, f"Invalid Argument: no GPU {gpu} in the replay files")
        return self._gpus[gpu]

    def _answer(self, gpu: int, key: tuple[str, ...], entry: dict[str, Any]) -> dict[str, Any]:
        """The entry this call returns, after stepping a sequence, delaying or hanging."""
        if "sequence" in entry:
            with self._lock:
                step = self._cursors.get((gpu, key), 0)
                self._cursors[(gpu, key)] = step + 1
            entry = entry["sequence"][min(step, len(entry["sequence"]) - 1)]
        if entry.get("delay_s"):
            self._closed.wait(entry["delay_s"])
        if entry.get("hang") is True:
            self._closed.wait()
            raise NvmlError(UNINITIALIZED, "Uninitialized (replay closed during a hung call)")
        return entry

    def _call(self, gpu: int, node: dict[str, Any], key: tuple[str, ...]) -> Any:
        entry: Any = node
        for part in key:
            entry = entry.get(part) if isinstance(entry, dict) else None
        if entry is None:
            raise NvmlError(NOT_SUPPORTED, f"Not Supported ({'/'.join(key)} not in replay file)")
        entry = self._answer(gpu, key, entry)
        if "ok" in entry:
            return entry["ok"]
        raise NvmlError(entry["code"], entry.get("nvml_error", ""))

    def device_count(self) -> int:
        self._refresh()
        return len(self._gpus)

    def system(self, name: str) -> Any:
        return self._call(-1, self._gpu(0).system, (name,))

    def call(self, gpu: int, name: str, *args: str) -> Any:
        return self._call(gpu, self._gpu(gpu).device, (name, *args))

    def _fields(self, gpu: int, table: dict[str, Any], section: str,
                names: Sequence[str]) -> dict[str, Field]:
        result = {}
        for name in names:
            entry = table.get(name)
            if entry is None:
                result[name] = Field(0, NOT_SUPPORTED, 0, None)
                continue
            entry = self._answer(gpu, (section, name), entry)
            result[name] = Field(entry.get("id", 0), entry["ret"], entry.get("type", 0),
                                 entry.get("value"), entry.get("latency_us", 0))
        return result

    def field_values(self, gpu: int, names: Sequence[str]) -> dict[str, Field]:
        return self._fields(gpu, self._gpu(gpu).fields, "field_values", names)

    def gpm(self, gpu: int, names: Sequence[str]) -> dict[str, Field]:
        table = self._gpu(gpu).gpm
        if not table.get("supported"):
            raise NvmlError(NOT_SUPPORTED, "Not Supported (no GPM in replay file)")
        return self._fields(gpu, table, "gpm", names)

    def field_names(self) -> list[str]:
        return sorted({name for gpu in self._gpus for name in gpu.fields})

    def gpm_names(self) -> list[str]:
        return sorted({name for gpu in self._gpus for name in gpu.gpm} - {"supported"})

    def xid_event_set(self, gpus: Sequence[int]) -> EventSet:
        for gpu in gpus:
            self._gpu(gpu)
        return _ReplayEventSet(self, list(gpus))

    def next_xid(self, gpus: Sequence[int]) -> XidEvent | None:
        self._refresh()
        with self._lock:
            for gpu in gpus:
                delivered, log = self._delivered[gpu], self._gpus[gpu].xids
                if delivered < len(log):
                    self._delivered[gpu] = delivered + 1
                    return XidEvent(gpu, log[delivered])
        return None

    def wait_closed(self, timeout: float) -> bool:
        return self._closed.wait(timeout)

    def close(self) -> None:
        self._closed.set()


class _ReplayEventSet(EventSet):
    def __init__(self, source: ReplayNvml, gpus: list[int]) -> None:
        self._source = source
        self._gpus = gpus

    def wait(self, timeout: float) -> XidEvent | None:
        deadline = time.monotonic() + timeout
        while True:
            event = self._source.next_xid(self._gpus)
            remaining = deadline - time.monotonic()
            if event is not None or remaining <= 0:
                return event
            # New events come only with a re-read file, looked for this often: a real event
            # set blocks in the driver, and a 20 Hz poll here cost 0.3 % of a core.
            if self._source.wait_closed(min(remaining, RELOAD_CHECK_S)):
                return None

    def close(self) -> None:
        """Nothing to release: events live in the source."""
