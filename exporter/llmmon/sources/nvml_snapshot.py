"""Capture NVML snapshots in the replay format: one file per GPU, loadable by `--fake-nvml`.

    python -m llmmon.sources.nvml_snapshot OUTDIR [--fake-nvml PATH]

Every call of the vocabulary is recorded with its result or its NVML error, so a snapshot of
a real node replays its quirks too (unsupported calls, units, value types).  This reads the
20 ms PCIe throughput call and takes two GPM samples a second apart: run it by hand, not
from a collector.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from llmmon.sources.nvml import (
    DEVICE_CALLS,
    NVLINK_MAX_LINKS,
    SYSTEM_CALLS,
    VIOLATION_POLICIES,
    NvmlError,
    NvmlSource,
    NvmlUnavailable,
)
from llmmon.sources.nvml_open import open_nvml

GPM_INTERVAL_S = 1.0


def _entry(read: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"ok": read()}
    except NvmlError as exc:
        return {"nvml_error": str(exc), "code": exc.code}


def snapshot(source: NvmlSource, gpu: int) -> dict[str, Any]:
    """Everything the source answers about one GPU, shaped like the H200 capture."""
    device: dict[str, Any] = {name: _entry(lambda n=name: source.call(gpu, n))
                              for name in DEVICE_CALLS}
    device["violation_status"] = {
        policy: _entry(lambda p=policy: source.call(gpu, "violation_status", p))
        for policy in VIOLATION_POLICIES}
    device["nvlink"] = {
        str(link): {what: _entry(lambda w=what, n=link: source.call(gpu, "nvlink", str(n), w))
                    for what in ("state", "version")}
        for link in range(NVLINK_MAX_LINKS)}
    fields = {name: asdict(value)
              for name, value in source.field_values(gpu, source.field_names()).items()}
    gpm: dict[str, Any]
    try:
        metrics = source.gpm(gpu, source.gpm_names())
        if not metrics:  # real hardware: the first call only took the first sample
            time.sleep(GPM_INTERVAL_S)
            metrics = source.gpm(gpu, source.gpm_names())
        gpm = {"supported": 1, **{name: {"ret": m.ret, "value": m.value}
                                  for name, m in metrics.items()}}
    except NvmlError:
        gpm = {"supported": 0}
    return {"system": {name: _entry(lambda n=name: source.system(n)) for name in SYSTEM_CALLS},
            "device0": device, "field_values": fields, "gpm": gpm}


def write_snapshots(source: NvmlSource, outdir: Path) -> list[Path]:
    """gpu00.json, gpu01.json, ... in `outdir`, each written atomically."""
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for gpu in range(source.device_count()):
        path = outdir / f"gpu{gpu:02d}.json"
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(snapshot(source, gpu), indent=1) + "\n",
                             encoding="utf-8")
        os.replace(temporary, path)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--fake-nvml", default="", metavar="PATH",
                        help="re-snapshot replay files instead of the real library")
    args = parser.parse_args(argv)
    try:
        source = open_nvml(args.fake_nvml)
        for path in write_snapshots(source, args.outdir):
            print(f"wrote {path}")
    except (NvmlUnavailable, NvmlError, ValueError) as exc:
        print(f"nvml_snapshot: {exc}", file=sys.stderr)
        return 1
    source.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
