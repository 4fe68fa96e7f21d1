"""A healthy 3-rank gloo job with the reporter on: sequences advance, every number adds up."""

from __future__ import annotations

from pathlib import Path

import requests

from tests.helpers import wait_for
from tests.ranks.jobs import Job, base_env, by_rank, make_collector, scrape, series

STEPS = 30
GRAD_ELEMENTS = 64 * 64 + 64  # Linear(64, 64) weight and bias, all-reduced in bf16
NAN_STEP = 5


def test_sequences_advance_on_every_rank_and_the_metrics_are_consistent(
        tmp_path: Path, serve) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    collector = make_collector(spool, tmp_path)
    args = ["--steps", str(STEPS), "--compute", "0.05", "--nan-at", str(NAN_STEP),
            "--hold", "600"]  # alive until the test kills them: a slow read never meets an exit
    with Job(tmp_path, 3, args, base_env(LLMMON_SPOOL=str(spool))) as job:
        def completed() -> dict[int, float]:
            return by_rank(scrape(collector)[0], "llmmon_nccl_last_completed_seq", pg="0")

        def moved_on(before: dict[int, float]) -> dict[int, float] | None:
            now = completed()
            return now if all(now[r] > before[r] for r in range(3)) else None

        # While it trains: every rank's completed sequence number moves between two reads.
        first = wait_for(lambda: seen if len(seen := completed()) == 3 else None, 180,
                         "all three ranks in the spool")
        wait_for(lambda: moved_on(first), 180, f"every rank to progress beyond {first}")

        results = [job.result(rank) for rank in range(3)]
        final = 2 * STEPS  # two all_reduces (weight, bias) per step

        seen: dict = {}

        def settled() -> dict | None:
            samples = scrape(collector)[0]
            seen["completed"] = done = by_rank(samples, "llmmon_nccl_last_completed_seq", pg="0")
            # the bytes follow the completions by up to an entries tick (records ship when final)
            seen["series"] = len(series(samples, "llmmon_nccl_collective_bytes_total", pg="0"))
            seen["bytes"] = by_rank(samples, "llmmon_nccl_collective_bytes_total", pg="0",
                                    coll="all_reduce", dtype="BFloat16")
            ok = done == {0: final, 1: final, 2: final} and seen["series"] == 3
            return samples if ok and seen["bytes"] == {r: STEPS * GRAD_ELEMENTS * 2
                                                       for r in range(3)} else None

        try:
            samples = wait_for(settled, 120, "every rank to report the last collective")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last read {seen}\n{job.logs()}") from None
        server = serve("--collector.disable-defaults", "--collector.ranks",
                       f"--spool.dir={spool}", "--collector.ranks.interval=0.2s",
                       f"--collector.ranks.fr-dir={tmp_path / 'fr'}")
        server.wait_collected()
        api = requests.get(server.url + "/api/v1/ranks", timeout=5).json()
        metrics = requests.get(server.url + "/metrics", timeout=5).text

    assert {r["checksum"] for r in results} == {results[0]["checksum"]}  # ranks agree
    assert all(r["health"]["errors_total"] == 0 and r["health"]["fr_api"] ==
               "_dump_fr_trace_json" for r in results)
    job_id = results[0]["env"]["LLMMON_JOB"] or \
        dict(next(iter(series(samples, "llmmon_rank_info"))))["job_id"]
    assert by_rank(samples, "llmmon_nccl_last_enqueued_seq", pg="0") == {0: final, 1: final,
                                                                          2: final}
    assert by_rank(samples, "llmmon_nccl_last_completed_seq", pg="1") == {0: STEPS, 1: STEPS}
    assert by_rank(samples, "llmmon_nccl_collective_bytes_total", pg="0", coll="all_reduce",
                   dtype="BFloat16") == {r: STEPS * GRAD_ELEMENTS * 2 for r in range(3)}
    assert by_rank(samples, "llmmon_nccl_collective_bytes_total", pg="1", coll="all_gather",
                   dtype="Float") == {r: STEPS * 2 * 16 * 4 for r in (0, 1)}
    assert by_rank(samples, "llmmon_rank_up") == {0: 1, 1: 1, 2: 1}
    assert by_rank(samples, "llmmon_reporter_disabled") == {0: 0, 1: 0, 2: 0}
    assert by_rank(samples, "llmmon_training_steps_total") == {r: STEPS for r in range(3)}
    assert by_rank(samples, "llmmon_training_tokens_total") == {r: 32 * STEPS for r in range(3)}
    assert by_rank(samples, "llmmon_training_model_flops_total") == \
        {r: STEPS * 6 * 64 * 64 * 32 for r in range(3)}
    assert by_rank(samples, "llmmon_training_loss_nonfinite_total") == {0: 1, 1: 1, 2: 1}
    assert by_rank(samples, "llmmon_training_step_seconds_count") == \
        {r: STEPS - 1 for r in range(3)}
    info = {int(dict(k)["rank"]): dict(k) for k in series(samples, "llmmon_rank_info")}
    assert {r: (i["world_size"], i["pid"], i["job_id"]) for r, i in info.items()} == \
        {r: ("3", str(results[r]["pid"]), job_id) for r in range(3)}
    groups = {dict(k)["pg"]: dict(k) for k in series(samples, "llmmon_nccl_pg_info")}
    assert (groups["0"]["size"], groups["0"]["ranks"], groups["0"]["pg_desc"]) == \
        ("3", "0-2", "default_pg")
    assert (groups["1"]["size"], groups["1"]["ranks"], groups["1"]["pg_desc"]) == \
        ("2", "0-1", "pair")
    lag = by_rank(samples, "llmmon_nccl_enqueue_lag_seconds", pg="0")
    assert sorted(lag) == [0, 1, 2] and sorted(lag.values())[1] == 0.0  # the median rank is 0
    # gloo records no durations, so no histogram and no bus bytes
    assert not series(samples, "llmmon_nccl_collective_duration_seconds_count")
    assert not series(samples, "llmmon_nccl_bus_bytes_total")

    # The daemon's own view over HTTP agrees: one job, nobody waits or is behind.  (Its ranks
    # sleep in --hold after training, outside any collective: past the learned threshold that
    # is the quiet stall of a job whose every rank is stuck before its next collective.)
    assert [j["job_id"] for j in api["jobs"]] == [job_id]
    assert [g["pg"] for g in api["jobs"][0]["groups"] if g["stalled"] and (
        g["op"] is not None or g["quiet_ranks"] != [0, 1, 2])] == []
    assert [r["rank"] for r in api["jobs"][0]["ranks"]] == [0, 1, 2]
    assert all(not g["behind"] for g in api["jobs"][0]["groups"])
    assert f'llmmon_nccl_last_enqueued_seq{{job_id="{job_id}",pg="0",rank="2"}} {final}.0' \
        in metrics
