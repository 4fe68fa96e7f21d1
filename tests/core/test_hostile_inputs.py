"""Inputs that used to kill a collector's thread or answer 500, through a real `llmmon serve`.

A 309-digit number in a counter file, a negative count, a device directory whose name is not
UTF-8, a lone surrogate in a rank's GPU name, a --path.sysfs that is no sysfs: each is
skipped or escaped and counted, the collector keeps running, and fixing the input brings
the series back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import requests

from tests.conftest import FIXTURES
from tests.core.served import collector, runs_after, value
from tests.helpers import wait_for

HUGE = "9" * 309  # float() of it overflows: it used to raise OverflowError while rendering
NOT_UTF8 = os.fsdecode(b"mlx5_\xff")  # os.listdir hands this name over with a lone surrogate
FAST = ("--collector.disable-defaults", "--sampler.max-staleness=1s")


def proc_tree(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc", proc, symlinks=True)
    return proc


def serve_running(serve, name: str, *args: str):  # type: ignore[no-untyped-def]
    """`llmmon serve` running collector `name` alone every 200 ms, once it has run a few
    times; its state must read ok."""
    server = serve(*FAST, f"--collector.{name}", f"--collector.{name}.interval=200ms", *args)
    server.wait_collected()
    runs_after(server, name)
    state = collector(server, name)
    assert state["status"] == "ok", state
    return server, state


def test_counts_beyond_2_64_or_negative_skip_that_disk_count_an_error_and_recover(
        serve, tmp_path: Path) -> None:
    proc = proc_tree(tmp_path)
    good = (proc / "diskstats").read_text()
    (proc / "diskstats").write_text(
        good.replace("sda 25354637", f"sda {HUGE}").replace("sdb 326552", "sdb -326552")
        .replace("sdc 192", f"sdc {2 ** 64 + 1}"))
    server, state = serve_running(serve, "disk", f"--path.procfs={proc}")
    assert state["errors_total"] >= 3  # each bad device, every run
    assert "outside a counter's range (0 to 2^64)" in state["last_error"]
    for device in ("sda", "sdb", "sdc"):
        assert value(server, "llmmon_disk_reads_total", device=device) is None
    assert value(server, "llmmon_disk_reads_total", device="nvme0n1") == 47114

    (proc / "diskstats").write_text(good)
    assert wait_for(lambda: value(server, "llmmon_disk_reads_total", device="sda"), 60,
                    "sda back once its line is sane") == 25354637
    assert collector(server, "disk")["status"] == "ok"
    assert "sda: a value outside a counter's range" in server.log()


def rdma_tree(tmp_path: Path) -> Path:
    """The fixture sysfs, plus an RDMA device whose directory name is not UTF-8."""
    sys_root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "sys", sys_root, symlinks=True)
    port = sys_root / "class" / "infiniband" / NOT_UTF8 / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    for name, text in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"),
                       ("rate", "400 Gb/sec (4X NDR)"), ("link_layer", "InfiniBand")):
        (port / name).write_text(text + "\n")
    (port / "counters" / "port_xmit_data").write_text("1000\n")
    return sys_root


def test_a_huge_infiniband_counter_and_a_non_utf8_device_name_leave_rdma_running(
        serve, tmp_path: Path) -> None:
    sys_root = rdma_tree(tmp_path)
    counter = (sys_root / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters" /
               "port_xmit_data")
    good = counter.read_text()
    counter.write_text(HUGE + "\n")
    server, state = serve_running(serve, "rdma", f"--path.sysfs={sys_root}")
    assert state["errors_total"] >= 2
    assert "mlx5_0/ports/1/counters/port_xmit_data" in state["last_error"]
    # The undecodable byte is written as a visible escape; the exposition stays valid.
    assert value(server, "llmmon_rdma_transmit_bytes_total", device="mlx5_\\xff",
                 port="1") == 4000
    assert value(server, "llmmon_rdma_transmit_bytes_total", device="mlx5_0", port="1") is None
    assert value(server, "llmmon_rdma_transmit_bytes_total", device="mlx5_1",
                 port="1") is not None
    body = requests.get(server.url + "/metrics", timeout=10).content
    lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True,
                          timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert requests.get(server.url + "/", timeout=10).status_code == 200

    counter.write_text(good)
    assert wait_for(lambda: value(server, "llmmon_rdma_transmit_bytes_total", device="mlx5_0",
                                  port="1"), 60, "mlx5_0 port 1 back") == int(good) * 4


def test_failing_runs_drop_the_last_snapshot_after_max_staleness_and_the_next_run_recovers(
        serve, tmp_path: Path) -> None:
    proc = proc_tree(tmp_path)
    good = (proc / "diskstats").read_text()
    server = serve(*FAST, "--collector.disk", "--collector.disk.interval=200ms",
                   f"--path.procfs={proc}")
    server.wait_collected()
    assert value(server, "llmmon_disk_reads_total", device="sda") == 25354637

    (proc / "diskstats").unlink()  # every run now finds nothing under a root with no diskstats
    wait_for(lambda: value(server, "llmmon_exporter_collector_success", collector="disk") == 0, 60,
             "disk failing")
    wait_for(lambda: value(server, "llmmon_disk_reads_total", device="sda") is None, 60,
             "the last good snapshot dropped after --sampler.max-staleness")
    failed = collector(server, "disk")
    assert failed["status"] == "failed"
    assert f"--path.procfs={proc} has no diskstats" in failed["message"]
    errors = failed["errors_total"]
    wait_for(lambda: collector(server, "disk")["errors_total"] > errors, 60,
             "the driver still running: more failed runs counted")

    (proc / "diskstats").write_text(good)
    wait_for(lambda: value(server, "llmmon_disk_reads_total", device="sda"), 60, "disk back")
    assert value(server, "llmmon_exporter_collector_success", collector="disk") == 1


def hostile_spool(tmp_path: Path) -> Path:
    """A rank whose GPU name holds a lone surrogate, and a job directory not named in UTF-8."""
    spool = tmp_path / "spool"
    shutil.copytree(FIXTURES / "spool" / "bad" / "good", spool / "good")
    for path in (spool / "good").iterdir():
        if path.name != "rank_0.1000.json":
            path.unlink()
    state = spool / "good" / "rank_0.1000.json"
    state.write_text(state.read_text().replace('"NVIDIA H200"', '"NVIDIA \\ud800 H200"'))
    bad_job = spool / os.fsdecode(b"job-\xfe\xff")
    bad_job.mkdir()
    (bad_job / "rank_0.2000.json").write_text("{not json")
    now = time.time()
    for path in spool.rglob("*.json"):
        os.utime(path, (now, now))
    return spool


def test_every_json_endpoint_answers_200_with_bad_strings_escaped(serve, tmp_path: Path) -> None:
    spool = hostile_spool(tmp_path)
    server = serve(*FAST, "--collector.ranks", "--collector.gpu", "--collector.disk",
                   f"--spool.dir={spool}", "--collector.ranks.stale-after=1h",
                   f"--collector.ranks.fr-dir={tmp_path / 'fr'}",
                   f"--collector.ranks.pipe-dir={tmp_path / 'pipe'}",
                   f"--path.procfs={proc_tree(tmp_path)}",
                   f"--fake-nvml={FIXTURES / 'nvml' / 'h200x8'}")
    server.wait_collected()
    ranks = wait_for(lambda: collector(server, "ranks")["watched"], 60, "the good rank")
    assert ranks == 1

    api = requests.get(server.url + "/api/v1/ranks", timeout=10)
    assert api.status_code == 200, api.text
    (job,) = api.json()["jobs"]
    assert job["ranks"][0]["gpu_name"] == "NVIDIA \\ud800 H200"

    state = collector(server, "ranks")
    assert "job-\\xfe\\xff" in state["last_error"], state
    for path in ("/api/v1/collectors", "/api/v1/ranks", "/api/v1/gpu", "/api/v1/diagnose",
                 "/api/v1/openapi.json"):
        response = requests.get(server.url + path, timeout=30)
        assert response.status_code == 200, (path, response.text)
        json.loads(response.content.decode("utf-8"))  # strict UTF-8, strict JSON
    dump = requests.post(server.url + "/api/v1/ranks/dump", params={"job_id": "good"},
                         timeout=10)
    assert dump.status_code == 200, dump.text
    assert requests.get(server.url + "/", timeout=10).status_code == 200
    assert "Traceback" not in server.log()


def test_a_wrong_root_is_said_at_start_up_and_fails_what_finds_nothing_unlike_a_node_without_rdma(
        serve, tmp_path: Path) -> None:
    no_rdma = tmp_path / "no-rdma-sys"  # a real sysfs shape, with no RDMA devices
    for directory in ("class/net", "devices/virtual"):
        (no_rdma / directory).mkdir(parents=True)
    empty_dir = tmp_path / "not-a-proc"
    empty_dir.mkdir()
    args = (*FAST, "--collector.rdma", "--collector.topology", "--collector.disk",
            "--collector.topology.nvml=false")

    wrong = serve(*args, f"--path.sysfs={tmp_path / 'sys-typo'}", f"--path.procfs={empty_dir}")
    states = {s["name"]: s for s in wrong.wait_collected()}
    for name in ("rdma", "topology"):
        assert states[name]["status"] == "failed", states[name]
        assert f"--path.sysfs={tmp_path / 'sys-typo'} does not exist: not a sysfs root" in \
            states[name]["message"]
    assert states["disk"]["status"] == "failed"
    assert f"--path.procfs={empty_dir} has no diskstats, self/" in states["disk"]["message"]
    assert value(wrong, "llmmon_exporter_collector_success", collector="rdma") == 0
    log = wrong.log()
    assert (f"level=error logger=llmmon.serve.assembly msg=\"--path.sysfs={tmp_path / 'sys-typo'} "
            "does not exist: not a sysfs root (every Linux sysfs has class/, devices/)") in log
    assert f"--path.procfs={empty_dir} has no diskstats, self/: not a procfs root" in log

    right = serve(*args, f"--path.sysfs={no_rdma}", f"--path.procfs={proc_tree(tmp_path)}")
    states = {s["name"]: s for s in right.wait_collected()}
    assert states["rdma"]["status"] == "empty", states["rdma"]
    assert states["rdma"]["message"] == "nothing to watch: RDMA ports"
    assert value(right, "llmmon_exporter_collector_success", collector="rdma") == 1
    assert "not a sysfs root" not in right.log() and "not a procfs root" not in right.log()
