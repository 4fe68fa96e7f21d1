"""The spool half of the adversarial soak: hostile spools against a real `llmmon serve`.

Two runs in one invocation, each a fresh `llmmon serve` with only the ranks collector (every
second) over its own spool, scraped twice a second on one keep-alive connection:
- idle: a normal spool, a healthy 4-rank job whose state files are rewritten every second;
- hostile: the same job, plus what other users wrote (tests/ranks/hostile.py), scaled down:
  512 junk rank files in a directory that sorts first; 12 state files of 20k in-flight entries
  each; a rank rewriting its files with 10k new process-group names every 2 s; a group of
  400k rank spans; FIFOs at rank-file names; 8 empty `dump-9999999N` directories beside the
  real job's kept dump sets; and, before the daemon starts, 64 ranks of processes that do not
  exist (two jobs of 32, the rank budget's worth) in directories that sort first.
The real job's ranks are processes that run (`sleep`), as a trainer's are.
Reports RSS (end, peak), open file descriptors, scrape p50/p99 and body size, whether the
real job's four ranks stayed fresh (llmmon_rank_up 1 in every scrape after the first minute's
first 5 s), whether its dump sets survived, and how many distinct series the scrapes held in
all (what the group churn costs Prometheus); prints a table and writes
bench/results/adversarial_spool.json.

    PYTHONPATH=exporter:reporter python bench/adversarial_spool.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import free_port, rss_mib, stop, wait_http, write_json

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.ranks import hostile  # noqa: E402 (after the checkout is on the path)

SETTLE = 5.0  # seconds before the real job must show up
REAL_RANKS = 4


def plant(spool: Path, fr: Path) -> None:
    """Everything the hostile run adds once; the group churn goes on during the run."""
    hostile.junk_dir(spool, 512)
    hostile.inflight_flood(spool, files=12, count=20_000)
    hostile.wide_group(spool, 400_000)
    hostile.group_churn(spool, 0, 10_000)
    hostile.fake_ranks(spool, jobs=2, ranks=32)
    fifos = spool / "fifos"
    fifos.mkdir()
    for rank in range(8):
        os.mkfifo(fifos / f"rank_{rank}.{rank + 1}.json")
    hostile.fake_dump_sets(fr, 8)


def start_ticks(pid: int) -> int:
    """/proc/<pid>/stat's starttime, as the reporter writes it for its own process."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rfind(")") + 2:].split()[19])


def scrape(conn: http.client.HTTPConnection) -> bytes:
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"scrape answered {response.status}")
    return body


def real_job_state(text: str, seen: set[int]) -> tuple[bool, bool, int]:
    """Whether all the real job's ranks are up in a scrape, whether the collector's last run
    succeeded, and the series count; adds each series' hash to `seen`."""
    up, count, success = {}, 0, False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            count += 1
            seen.add(hash((sample.name, tuple(sorted(sample.labels.items())))))
            if sample.name == "llmmon_rank_up" and sample.labels.get("job_id") == "real-job":
                up[sample.labels["rank"]] = sample.value
            elif sample.name == "llmmon_exporter_collector_success":
                success = sample.value == 1
    return len(up) == REAL_RANKS and all(v == 1 for v in up.values()), success, count


def run(work: Path, hostile_run: bool, seconds: float) -> dict:
    spool, fr = work / "spool", work / "fr"
    spool.mkdir(parents=True)
    workers = [subprocess.Popen(["sleep", str(int(seconds) + 120)]) for _ in range(REAL_RANKS)]
    processes = [(w.pid, start_ticks(w.pid)) for w in workers]
    hostile.real_job(spool, processes=processes)
    hostile.dump_files(fr, "real-job", REAL_RANKS, time.time() - 60)  # the daemon keeps a set
    if hostile_run:
        plant(spool, fr)
    port = free_port()
    log = open(work / "serve.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmmon", "serve", f"--web.listen-address=127.0.0.1:{port}",
         "--collector.disable-defaults", "--collector.ranks", f"--spool.dir={spool}",
         f"--collector.ranks.fr-dir={fr}", f"--collector.ranks.pipe-dir={work / 'pipe'}",
         "--collector.ranks.interval=1s", "--collector.ranks.stale-after=10s",
         "--log.level=warning"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    timings, fresh, sizes, fds, series, failed = [], [], [], [], 0, 0
    seen: set[int] = set()
    try:
        wait_http(port, "/healthz", 60)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        started = time.monotonic()
        next_write = next_churn = next_scrape = started
        churn, second_dump = 1, True
        while (now := time.monotonic()) < started + seconds:
            if now >= next_write:
                hostile.real_job(spool, processes=processes)
                next_write += 1.0
            if second_dump and now >= started + seconds / 2:  # and a second one
                hostile.dump_files(fr, "real-job", REAL_RANKS, time.time() - 60)
                second_dump = False
            if hostile_run and now >= next_churn:
                hostile.group_churn(spool, churn, 10_000)
                churn += 1
                next_churn += 2.0
            if now >= next_scrape:
                begun = time.perf_counter()
                try:
                    body = scrape(conn)
                except (http.client.RemoteDisconnected, ConnectionError):
                    # idle past uvicorn's keep-alive (this process was busy writing): reconnect
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    begun = time.perf_counter()
                    body = scrape(conn)
                timings.append((time.perf_counter() - begun) * 1000)
                sizes.append(len(body))
                ok, success, series = real_job_state(body.decode(), seen)
                failed += not success
                if now - started >= SETTLE:
                    fresh.append(ok)
                fds.append(len(os.listdir(f"/proc/{proc.pid}/fd")))
                next_scrape += 0.5
            time.sleep(max(min(next_write, next_scrape) - time.monotonic(), 0.01))
        conn.request("GET", "/api/v1/collectors")
        (ranks,) = json.loads(conn.getresponse().read())["collectors"]
        conn.close()
        rss, peak = rss_mib(proc.pid)
        kept = sorted(p.name for p in (fr / "real-job").glob("dump-*"))
    finally:
        stop(proc)
        log.close()
        for worker in workers:
            worker.kill()
            worker.wait()
    timings.sort()
    return {"run": "hostile" if hostile_run else "idle", "seconds": seconds,
            "scrapes": len(timings),
            "scrape_ms": {"p50": round(statistics.median(timings), 2),
                          "p99": round(timings[max(int(len(timings) * 0.99) - 1, 0)], 2)},
            "body_bytes_max": max(sizes), "series_last": series, "series_seen": len(seen),
            "rss_mib": {"end": round(rss, 1), "peak": round(peak, 1)},
            "open_fds_max": max(fds),
            "scrapes_after_a_failed_run": failed,
            "real_job_fresh": bool(fresh) and all(fresh),
            "real_job_fresh_scrapes": f"{sum(fresh)}/{len(fresh)}",
            "real_job_dump_sets": kept,
            "collector": {k: ranks.get(k) for k in ("status", "last_duration_seconds",
                                                    "errors_total", "message")}, "group_rewrites": churn - 1 if hostile_run else 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each run")
    args = parser.parse_args()
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    results = []
    for hostile_run in (False, True):
        work = Path(tempfile.mkdtemp(prefix="llmmon-adversarial-", dir=shm))
        try:
            results.append(run(work, hostile_run, args.seconds))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{'run':<9}{'RSS end/peak MiB':>18}{'fds max':>9}{'scrape p50/p99 ms':>19}"
          f"{'body kB':>9}{'real job fresh':>16}{'dump sets':>11}{'series seen':>13}")
    for r in results:
        print(f"{r['run']:<9}{r['rss_mib']['end']:>9.1f} / {r['rss_mib']['peak']:<6.1f}"
              f"{r['open_fds_max']:>9}{r['scrape_ms']['p50']:>10.2f} / "
              f"{r['scrape_ms']['p99']:<6.2f}"
              f"{r['body_bytes_max'] / 1000:>9.1f}"
              f"{('yes' if r['real_job_fresh'] else 'no') + ' ' + r['real_job_fresh_scrapes']:>16}"
              f"{len(r['real_job_dump_sets']):>11}{r['series_seen']:>13}")
    write_json("adversarial_spool", results)
    return 0 if all(r["real_job_fresh"] and len(r["real_job_dump_sets"]) == 2
                    for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
