"""Several nodes' incidents of one job merged into one report."""

from __future__ import annotations

import json

import pytest

from llmmon.incidents import layout
from llmmon.incidents.merge import Missing, NodeIncident, merge
from llmmon.incidents.outliers import node_deltas, outliers
from tests.incidents.nodes import JOB, T0, network, node_a, node_b, summary


def incident(made: tuple[dict, dict[str, bytes]], source: str = "") -> NodeIncident:
    doc, files = made
    return NodeIncident(source or f"http://{doc['node']}:9476", doc, files)


def test_the_node_holding_the_culprit_outvotes_the_node_that_sees_remote_waits() -> None:
    report = merge(JOB, [incident(node_a()), incident(node_b())])
    c = report.culprit
    assert (c.ranks, c.cause, c.named_by, c.agreed) == ((3,), "stack_root", ("node-b",), True)
    assert c.notes == ("node-a sees its ranks wait for remote ranks 2-3",)
    assert report.fr.culprits == (3,) and len(report.fr.findings) == 3
    assert report.fr.ranks == (0, 1, 2, 3)


def test_nodes_that_each_name_roots_among_their_own_ranks_blame_them_all() -> None:
    # every rank stuck before its next collective (a file system dead under all of them)
    a_doc, a_files = node_a()
    a_doc["culprit"] = {"ranks": [0, 1], "cause": "root", "text": "node-a says [0, 1]"}
    b_doc, b_files = node_b()
    b_doc["culprit"] = {"ranks": [2, 3], "cause": "root", "text": "node-b says [2, 3]"}
    c = merge(JOB, [incident((a_doc, a_files)), incident((b_doc, b_files))]).culprit
    assert (c.ranks, c.cause, c.named_by, c.agreed) == ((0, 1, 2, 3), "root",
                                                        ("node-a", "node-b"), True)
    assert c.text == "node-a says [0, 1]; node-b says [2, 3]"
    # a node that names a rank it does not hold competes instead
    a_doc["culprit"] = {"ranks": [3], "cause": "root", "text": "node-a says [3]"}
    c = merge(JOB, [incident((a_doc, a_files)), incident((b_doc, b_files))]).culprit
    assert not c.agreed and c.notes[0].startswith("nodes disagree")


def test_stacks_are_grouped_across_nodes_by_identical_frames() -> None:
    report = merge(JOB, [incident(node_a()), incident(node_b())])
    assert [(g.ranks, g.nodes) for g in report.stacks] == [
        ((3,), ("node-b",)), ((0, 1, 2), ("node-a", "node-b"))]
    assert report.stacks[0].frames == ("stuck_forever (/app/stuck_forever.py:10)",
                                       "main (/app/main.py:11)")


def test_the_timeline_runs_across_nodes_in_time_order() -> None:
    a_doc, a_files = node_a()
    a_doc["end"] = {"ended": False, "first": [1], "summary": "", "ranks": [
        {"rank": 1, "how": "exception", "code": 1, "error": "RuntimeError: timed out",
         "earliest": T0 + 20, "latest": T0 + 20.5}]}
    report = merge(JOB, [incident((a_doc, a_files)), incident(node_b())])
    assert [(e.at - T0, e.node, e.what.split(":")[0]) for e in report.timeline] == [
        (0.0, "node-b", "stall began, as this node saw it"),
        (2.5, "node-a", "stall began, as this node saw it"),
        (15.0, "node-a", "verdict declared"), (15.0, "node-b", "verdict declared"),
        (20.0, "node-a", "rank 1 ended (exception 1)"),
        (23.0, "node-a", "incident written"), (23.0, "node-a", "Flight Recorder dumps"),
        (23.0, "node-b", "incident written"), (23.0, "node-b", "Flight Recorder dumps")]


def test_a_missing_node_is_reported_and_the_others_still_merge() -> None:
    report = merge(JOB, [incident(node_a())], [Missing("http://node-b:9476", "timed out")])
    assert report.missing == (Missing("http://node-b:9476", "timed out"),)
    c = report.culprit
    assert (c.ranks, c.cause, c.named_by) == ((2, 3), "remote", ("node-a",))
    assert c.notes == ("no node that answered holds ranks 2-3",)
    # no dump of rank 2 or 3 was read: the dp waits are said, nobody is blamed by the dumps
    assert [f.kind for f in report.fr.findings] == ["unread", "unread"]
    assert report.fr.culprits == ()
    text = report.text()
    assert "missing: http://node-b:9476: timed out" in text
    assert "no dump of rank 2 was read" in text


def test_nodes_that_disagree_are_said_to_and_the_flight_recorder_breaks_the_tie() -> None:
    b_doc, b_files = node_b()
    c_doc = summary("node-c", [4, 5], [5], "rank_not_enqueued")
    c_doc["id"] = c_doc["id"][:-6] + "c0ffee"
    report = merge(JOB, [incident(node_a()), incident((c_doc, {})), incident((b_doc, b_files))])
    c = report.culprit
    assert (c.ranks, c.agreed, c.named_by) == ((3,), False, ("node-b",))
    assert c.notes[0] == ("nodes disagree: node-b names rank 3 (stack_root); "
                          "node-c names rank 5 (rank_not_enqueued)")
    # without dumps, the node named by the most wins, and the tie goes to the lowest rank
    bare = merge(JOB, [incident((b_doc, {})), incident((c_doc, {}))])
    assert bare.culprit.ranks == (3,) and not bare.culprit.agreed


def test_the_flight_recorder_is_noted_when_it_points_elsewhere() -> None:
    b_doc, b_files = node_b()
    b_doc["culprit"] = {"ranks": [2], "cause": "stack_symmetric", "text": "rank 2"}
    report = merge(JOB, [incident(node_a()), incident((b_doc, b_files))])
    assert report.culprit.ranks == (2,)
    assert "the Flight Recorder dumps point at rank 3" in report.culprit.notes


def test_without_any_node_naming_one_the_dumps_name_the_culprit() -> None:
    made = [node_a(), node_b()]
    for doc, _ in made:
        doc["culprit"] = {"ranks": [], "cause": "", "text": ""}
    report = merge(JOB, [incident(m) for m in made])
    assert (report.culprit.ranks, report.culprit.cause) == ((3,), "flight_recorder")


def test_the_node_whose_counters_rose_far_more_stands_out() -> None:
    report = merge(JOB, [incident(node_a()), incident(node_b())])
    # out-of-sequence: 5000 against 12 (> 10x, over 100); retransmits 150 against 20: 7.5x
    assert [(o.node, o.metric) for o in report.outliers] == [
        ("node-b", "llmmon_rdma_out_of_sequence_total")]
    assert report.outliers[0].text == (
        "node-b: llmmon_rdma_out_of_sequence_total rose by 5000 during the stall, 1 before "
        "it; the other node's 12")


DELTAS = {"n1": 10.0, "n2": 12.0, "n3": 8.0}


@pytest.mark.parametrize("metric,value,stands_out", [
    ("llmmon_rdma_out_of_sequence_total", 121.0, True),  # > 10 x 10 (the median), > 100
    ("llmmon_rdma_out_of_sequence_total", 100.0, False),  # exactly 10x the median
    ("llmmon_rdma_cnp_sent_total", 999.0, False),  # > 10x but under the CNP floor (1000)
    ("llmmon_rdma_cnp_sent_total", 1000.0, True),
    ("llmmon_nic_pfc_pause_frames_total", 5000.0, True),
    ("llmmon_tcp_segments_retransmitted_total", 99.0, False),  # under the floor
    ("llmmon_rdma_rx_bytes_total", 1e12, False),  # not a counter the rule judges
])
def test_the_outlier_rule_and_its_near_misses(metric: str, value: float,
                                              stands_out: bool) -> None:
    deltas = {n: {metric: (v, None)} for n, v in DELTAS.items()}
    deltas["bad"] = {metric: (value, None)}
    found = outliers(deltas)
    assert [(o.node, o.metric) for o in found] == ([("bad", metric)] if stands_out else [])


def test_xids_and_gpu_counters_are_summed_over_the_node_and_judged() -> None:
    gpus = {"gpus": [{"gpu": "0", "values": {"llmmon_gpu_throttle_seconds_total":
                                             {"before": 0, "during": 4.0}},
                      "xids": [{"xid": 79, "count": 1}]},
                     {"gpu": "1", "values": {"llmmon_gpu_throttle_seconds_total":
                                             {"before": 0, "during": 2.0}}, "xids": []}]}
    quiet = {"gpus": [{"gpu": "0", "values": {"llmmon_gpu_throttle_seconds_total":
                                              {"before": 0, "during": 0.1}}, "xids": []}]}
    bad = node_deltas(None, gpus)
    assert bad == {"llmmon_gpu_throttle_seconds_total": (6.0, 0.0), "xid": (1.0, None)}
    found = outliers({"bad": bad, "ok1": node_deltas(None, quiet),
                      "ok2": node_deltas(None, quiet)})
    assert [(o.node, o.metric) for o in found] == [
        ("bad", "llmmon_gpu_throttle_seconds_total")]  # xids: read on one node only


def test_hostile_counter_files_are_read_as_far_as_they_make_sense() -> None:
    doc = network(llmmon_rdma_out_of_sequence_total=float("nan"))
    doc["ports"] += ["x", {"counters": {"llmmon_rdma_cnp_sent_total": {"during": True}}},
                     {"counters": {"llmmon_rdma_cnp_sent_total": [1]}}]
    assert node_deltas(doc, {"gpus": "many"}) == {}


def test_the_report_is_json_and_text_with_every_part() -> None:
    b_doc, b_files = node_b()
    b_files[layout.GPUS] = b"{not json"
    report = merge(JOB, [incident(node_a()), incident((b_doc, b_files))],
                   [Missing("http://node-c:9476", "connection refused")])
    doc = json.loads(json.dumps(report.json()))
    assert doc["culprit"]["ranks"] == [3] and doc["fr"]["culprits"] == [3]
    assert doc["errors"][0].startswith("node-b: gpus.json: not read")
    text = report.text()
    for line in ("job team-a.llama: incidents from 2 node(s): node-a, node-b",
                 "culprit: rank 3 (stack_root), named by node-b",
                 "rank 3 never entered all_reduce #6 of group mesh_tp (ranks 2-3); rank 2 "
                 "waits in it", "ranks 0-2 on node-a, node-b: wait (/app/wait.py:10)",
                 "node-b: llmmon_rdma_out_of_sequence_total rose by 5000",
                 "timeline (UTC, 2026-11-30):"):
        assert line in text, text
    assert text.index("culprit:") < text.index("Flight Recorder") < text.index("timeline")


def test_a_hostile_summary_does_not_break_the_report() -> None:
    docs = [{"node": 7, "culprit": "x", "local_ranks": "0-3", "onset": "now", "end": [],
             "dumps": [], "left_out": "x", "errors": [1, "e"]},
            {"node": "n", "culprit": {"ranks": ["3"], "cause": 1}, "end": {"ranks": [None]}}]
    report = merge(JOB, [NodeIncident("http://x:1", d, {"fr/rank_0.json": b"[]",
                                                         layout.STACKS: b'{"ranks": []}'})
                         for d in docs])
    assert report.culprit.ranks == ()
    assert "http://x:1: fr/rank_0.json: not a Flight Recorder dump" in report.fr.errors[0]
    assert report.text()


def test_two_nodes_that_give_the_same_name_are_told_apart() -> None:
    a_doc, a_files = node_a()
    b_doc, b_files = node_b()
    b_doc["node"] = "node-a"
    report = merge(JOB, [incident((a_doc, a_files), "http://10.0.0.1:9476"),
                         incident((b_doc, b_files), "http://10.0.0.2:9476")])
    assert [v.node for v in report.nodes] == ["node-a (http://10.0.0.1:9476)",
                                              "node-a (http://10.0.0.2:9476)"]
    assert report.fr.ranks == (0, 1, 2, 3)
    assert report.culprit.named_by == ("node-a (http://10.0.0.2:9476)",)


def test_what_nodes_send_reaches_a_terminal_and_a_json_reader_harmless() -> None:
    b_doc, b_files = node_b()
    b_doc["verdict"] = "rank 3\x1b[2J\nculprit: rank 0 \ud800"
    b_doc["onset"] = float("nan")
    b_doc["culprit"]["weight"] = float("inf")
    report = merge(JOB, [incident((b_doc, b_files))])
    text = report.text()
    assert "rank 3\\x1b[2J\\x0aculprit: rank 0 \\ud800" in text
    assert "\x1b" not in text and "\nculprit: rank 0" not in text
    text.encode("utf-8")
    doc = json.loads(json.dumps(report.json(), allow_nan=False))
    assert doc["nodes"][0]["culprit"]["weight"] is None
