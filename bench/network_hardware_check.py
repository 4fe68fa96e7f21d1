"""On a real node: run the network collectors against the live /sys, rtnetlink and ethtool, and
compare the topology collector's GPUs with NVML's and `nvidia-smi topo -m`.

Writes into DIR (default: the current directory): `collectors.prom` (every family), and
`check.json` (per collector status, errors and watched count; sysfs vs NVML GPU addresses; the
peer-memory modules loaded; the cost of one run of each collector).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmmon.collector import Context  # noqa: E402
from llmmon.collectors.netdev import NetdevCollector  # noqa: E402
from llmmon.collectors.nic import NicCollector  # noqa: E402
from llmmon.collectors.rdma import RdmaCollector  # noqa: E402
from llmmon.collectors.topology import PEER_MEMORY_MODULES, TopologyCollector  # noqa: E402
from llmmon.exposition import render  # noqa: E402
from llmmon.sources import pci  # noqa: E402
from llmmon.sources.fs import RootedFS  # noqa: E402
from llmmon.sources.nvml import NvmlUnavailable, list_gpus  # noqa: E402
from llmmon.sources.nvml_open import open_nvml  # noqa: E402
from tests.core.helpers import make_collector  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    report: dict[str, object] = {}
    texts = []
    for cls in (RdmaCollector, NicCollector, NetdevCollector, TopologyCollector):
        collector = make_collector(cls, Path("/proc"), Path("/sys"))
        ctx = Context()
        started = time.perf_counter()
        families = list(collector.collect(ctx))
        elapsed = (time.perf_counter() - started) * 1000
        texts.append(render(families)[0].decode())
        report[cls.name] = {"ms": round(elapsed, 2), "watched": ctx.watched,
                            "what": ctx.watched_what, "errors": ctx.errors,
                            "series": sum(len(f.samples) for f in families)}
        collector.close()
    sysfs = RootedFS("/sys")
    nvml = open_nvml("")
    try:
        report["nvml_gpus"] = [(g.index, g.uuid, g.pci_bus_id, g.sysfs_pci_address)
                               for g in list_gpus(nvml)]
    except NvmlUnavailable as exc:
        report["nvml_gpus"] = f"unavailable: {exc}"
    finally:
        nvml.close()
    report["sysfs_gpus"] = pci.nvidia_gpus(sysfs)
    report["peer_memory_modules"] = [m for m in PEER_MEMORY_MODULES if sysfs.exists("module", m)]
    try:
        report["nvidia_smi_topo"] = subprocess.run(["nvidia-smi", "topo", "-m"], text=True,
                                                   capture_output=True, timeout=60).stdout
    except OSError as exc:
        report["nvidia_smi_topo"] = f"not run: {exc}"
    (out / "collectors.prom").write_text("".join(texts))
    (out / "check.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "nvidia_smi_topo"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
