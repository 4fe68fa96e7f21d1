"""Run the matmul load, scrape `llmmon serve` and query nvidia-smi at the same moments, compare.

Used by gpu_check.sh on a real GPU.  Once a second it takes one scrape and one
`nvidia-smi --query-gpu=power.draw,clocks.sm,clocks_event_reasons.active,temperature.gpu,
memory.used` (plus power.draw.instant), tags the moment with the load's phase, and at the end
prints what matched, the dips counted per phase, the collector's cost per run, the sampler's
achieved rate, the exporter's CPU use and the matmul's share of llmmon_gpu_peak_flops.
Writes samples.jsonl, smi.csv, scrape_final.prom, api.json and summary.txt to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from llmmon.gpu.clock_events import REASONS

SMI_FIELDS = "power.draw,clocks.sm,clocks_event_reasons.active,temperature.gpu,memory.used"
BITS = {name: bit for bit, name in REASONS.items()}
STEADY_AFTER_S = 2.5  # exporter values lag by up to a collector interval plus the 1 s average
MIB = 1 << 20


def get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def exporter_view(samples: dict[tuple[str, frozenset], float], gpu: str = "0") -> dict[str, Any]:
    """The values of GPU `gpu` this check compares, by short name."""
    def value(name: str, **labels: str) -> float | None:
        for (sample, pairs), v in samples.items():
            d = dict(pairs)
            if sample == name and d.get("gpu", gpu) == gpu and all(
                    d.get(k) == want for k, want in labels.items()):
                return v
        return None

    mask = 0
    for (sample, pairs), v in samples.items():
        d = dict(pairs)
        if sample == "llmmon_gpu_clock_event_active" and d.get("gpu") == gpu and v == 1:
            reason = d["reason"]
            mask |= BITS.get(reason) or (1 << int(reason.removeprefix("bit_")))
    return {
        "power_w": value("llmmon_gpu_power_watts"),
        "sm_mhz": (value("llmmon_gpu_clock_hertz", clock="sm") or 0) / 1e6,
        "reasons": mask,
        "temp_c": value("llmmon_gpu_temperature_celsius", sensor="gpu"),
        "mem_used_mib": (value("llmmon_gpu_memory_bytes", state="used") or 0) / MIB,
        "instant_w": value("llmmon_gpu_power_instant_watts"),
        "instant_min_w": value("llmmon_gpu_power_instant_min_watts"),
        "instant_mean_w": value("llmmon_gpu_power_instant_mean_watts"),
        "instant_max_w": value("llmmon_gpu_power_instant_max_watts"),
        "dips": value("llmmon_gpu_power_dips_total"),
        "low_s": value("llmmon_gpu_power_low_seconds_total"),
        "samples": value("llmmon_gpu_power_instant_samples_total"),
        "up": value("llmmon_gpu_up"),
        "peak_bf16": value("llmmon_gpu_peak_flops", dtype="bf16"),
        "collector_s": value("llmmon_exporter_collector_duration_seconds", collector="gpu"),
        "collector_ok": value("llmmon_exporter_collector_success", collector="gpu"),
    }


def smi(command: str, fields: str) -> list[str] | None:
    """First GPU's row of an nvidia-smi CSV query, or None if the query failed."""
    try:
        result = subprocess.run([*shlex.split(command), f"--query-gpu={fields}",
                                 "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0 or not result.stdout.strip():
        return None
    return [part.strip() for part in result.stdout.splitlines()[0].split(",")]


def number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_ready(base: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            states = json.loads(get(base + "/api/v1/collectors", 2))["collectors"]
            if all(s["status"] != "pending" for s in states):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"llmmon serve not ready after {timeout:.0f}s")


def phase_at(phases: list[dict[str, Any]], t: float) -> tuple[str, float]:
    """The load's phase at wall time t, and seconds since it began."""
    current, since = "before", t
    for entry in phases:
        if entry["t"] <= t:
            current, since = entry["phase"], entry["t"]
    return current, t - since


def agreement(moments: list[dict[str, Any]], check) -> str:
    pairs = [m for m in moments if check(m) is not None]
    good = sum(1 for m in pairs if check(m))
    return f"{good}/{len(pairs)}"


def summarise(moments: list[dict[str, Any]], phases: list[dict[str, Any]], extra: dict) -> str:
    steady = [m for m in moments if m["since_s"] >= STEADY_AFTER_S and m["phase"] != "starved"
              and m["smi"] is not None]
    lines = [f"{len(moments)} moments, {len(steady)} steady (>= {STEADY_AFTER_S}s into an idle "
             "or matmul phase; starved flips every 0.4/0.6 s, faster than the two readers agree)"]

    def within(key: str, smi_key: str, tolerance) -> Any:
        return lambda m: (None if m["exp"][key] is None or m["smi"][smi_key] is None
                          else abs(m["exp"][key] - m["smi"][smi_key]) <= tolerance(m))

    checks = {
        "power 1 s avg vs power.draw (<= max(10 W, 5 %))":
            within("power_w", "power_w", lambda m: max(10.0, 0.05 * m["smi"]["power_w"])),
        "SM clock vs clocks.sm (<= 5 %)":
            within("sm_mhz", "sm_mhz", lambda m: 0.05 * max(m["smi"]["sm_mhz"], 1)),
        "clock-event reasons vs clocks_event_reasons.active (equal)":
            within("reasons", "reasons", lambda m: 0),
        "temperature vs temperature.gpu (<= 1 C)": within("temp_c", "temp_c", lambda m: 1),
        "memory used (v2) vs memory.used (<= 4 MiB)":
            within("mem_used_mib", "mem_used_mib", lambda m: 4),
    }
    for label, check in checks.items():
        lines.append(f"  {label:<62} {agreement(steady, check)}")
    mismatches = [m for m in steady if not all(c(m) in (True, None) for c in checks.values())]
    for m in mismatches[:4]:
        exporter = {key: m["exp"][key] for key in m["smi"]}
        lines.append(f"    mismatch at {m['phase']}+{m['since_s']:.1f}s: exporter "
                     f"{json.dumps(exporter)} smi {json.dumps(m['smi'])}")

    lines.append("dips / low seconds per phase (counter increase over the phase):")
    names = [p["phase"] for p in phases if p["phase"] != "end"]
    for name in names:
        inside = [m for m in moments if m["phase"] == name and m["exp"]["dips"] is not None]
        after = [m for m in moments if m["t"] > (inside[-1]["t"] if inside else 0)
                 and m["exp"]["dips"] is not None]
        if not inside:
            continue
        last = after[0] if after else inside[-1]
        instant = [m["exp"]["instant_max_w"] for m in inside if m["exp"]["instant_max_w"]]
        lows = [m["exp"]["instant_min_w"] for m in inside if m["exp"]["instant_min_w"]]
        smi_power = [m["smi"]["power_w"] for m in inside if m["smi"] and m["smi"]["power_w"]]
        lines.append(
            f"  {name:<13} dips {last['exp']['dips'] - inside[0]['exp']['dips']:>4.0f}   low "
            f"{last['exp']['low_s'] - inside[0]['exp']['low_s']:>5.1f}s   instant window "
            f"{min(lows, default=0):>4.0f}-{max(instant, default=0):>4.0f} W   "
            f"power.draw {min(smi_power, default=0):>4.0f}-{max(smi_power, default=0):>4.0f} W")

    durations = sorted({m["exp"]["collector_s"] for m in moments if m["exp"]["collector_s"]})
    sampled = [m for m in moments if m["exp"]["samples"] is not None]
    rate = ((sampled[-1]["exp"]["samples"] - sampled[0]["exp"]["samples"])
            / max(sampled[-1]["t"] - sampled[0]["t"], 1e-9)) if len(sampled) > 1 else 0.0
    latest = moments[-1]["exp"]
    lines += [
        f"collector run: median {1000 * statistics.median(durations or [0]):.2f} ms, max "
        f"{1000 * max(durations or [0]):.2f} ms over {len(durations)} distinct runs seen "
        "(interval 1 s, slow calls every 5 s); success "
        f"{agreement(moments, lambda m: m['exp']['collector_ok'] == 1)}",
        f"power sampler: {rate:.1f} Hz achieved; exporter process CPU "
        f"{extra['cpu_percent']:.2f} % of one core over {extra['wall_s']:.0f} s",
    ]
    if extra.get("tflops") and latest["peak_bf16"]:
        lines.append(f"matmul: {extra['tflops']:.0f} TFLOP/s bf16 = "
                     f"{100 * extra['tflops'] * 1e12 / latest['peak_bf16']:.0f} % of "
                     f"llmmon_gpu_peak_flops{{dtype=\"bf16\"}} {latest['peak_bf16'] / 1e12:.1f} T")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--serve-pid", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--load", required=True, help="command; the phases file is appended")
    parser.add_argument("--smi", default="nvidia-smi")
    parser.add_argument("--period", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=110.0)
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    wait_ready(base, 30)

    handle, name = tempfile.mkstemp(suffix=".jsonl", prefix="phases-")
    os.close(handle)
    phases_path = Path(name)
    load_log = open(args.out / "load.log", "wb")
    load = subprocess.Popen([*shlex.split(args.load), str(phases_path)], stdout=load_log,
                            stderr=subprocess.STDOUT)
    started, cpu_start = time.monotonic(), cpu_seconds(args.serve_pid)
    moments: list[dict[str, Any]] = []
    with open(args.out / "smi.csv", "w") as raw:
        raw.write(f"unix_time, {SMI_FIELDS}, power.draw.instant\n")
        while load.poll() is None and time.monotonic() - started < args.timeout:
            tick = time.monotonic()
            t = time.time()
            exp = exporter_view(parse(get(base + "/metrics")))
            row = smi(args.smi, SMI_FIELDS)
            instant = smi(args.smi, "power.draw.instant")
            raw.write(f"{t:.3f}, {', '.join(row or ['?'])}, {(instant or ['?'])[0]}\n")
            smi_view = None if row is None or len(row) < 5 else {
                "power_w": number(row[0]), "sm_mhz": number(row[1]),
                "reasons": int(row[2], 16) if row[2].startswith("0x") else None,
                "temp_c": number(row[3]), "mem_used_mib": number(row[4]),
                "instant_w": number((instant or [None])[0])}
            moments.append({"t": t, "exp": exp, "smi": smi_view})
            time.sleep(max(0.0, args.period - (time.monotonic() - tick)))
    if load.poll() is None:
        print(f"load still running after {args.timeout:.0f}s: killing pid {load.pid}")
        load.kill()
    load.wait(10)
    load_log.close()
    wall = time.monotonic() - started
    cpu_percent = 100 * (cpu_seconds(args.serve_pid) - cpu_start) / wall

    final = get(base + "/metrics")
    (args.out / "scrape_final.prom").write_text(final)
    (args.out / "api.json").write_text(json.dumps({
        "collectors": json.loads(get(base + "/api/v1/collectors")),
        "gpu": json.loads(get(base + "/api/v1/gpu"))}, indent=1))

    phases = [json.loads(line) for line in phases_path.read_text().splitlines()]
    phases_path.unlink()
    if len(moments) < 2 or not phases:
        print(f"the load ran {wall:.0f}s and logged {len(phases)} phases; load.log:\n"
              + (args.out / "load.log").read_text()[-2000:])
        return 1
    for m in moments:
        m["phase"], m["since_s"] = phase_at(phases, m["t"])
    with open(args.out / "samples.jsonl", "w") as out:
        for m in moments:
            out.write(json.dumps(m) + "\n")
    tflops = [json.loads(line)["bf16_tflops"] for line in
              (args.out / "load.log").read_text().splitlines()
              if line.startswith("{") and '"matmul"' in line]
    info = [line for line in final.splitlines() if line.startswith("llmmon_gpu_info{")]
    summary = "\n".join(info[:1]) + "\n" + summarise(
        moments, phases, {"cpu_percent": cpu_percent, "wall_s": wall,
                          "tflops": tflops[0] if tflops else None})
    print(summary)
    (args.out / "summary.txt").write_text(summary + "\n")
    return 0 if load.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
