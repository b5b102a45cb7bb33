"""The report's findings: each sentence computed from tables with a known answer."""

from __future__ import annotations

import pandas as pd

from commscope.metrics.study import unshaped_rows
from commscope.report import StudyResults
from commscope.report.findings import (
    PREDICTIONS,
    SENSITIVITY,
    SYNC,
    TEMPORAL,
    congestion_findings,
    link_findings,
    mapping_findings,
    placement_findings,
    scale_findings,
    sensitivity_findings,
    structure_findings,
    study_findings,
)

LINK = {"bw": "none", "delay": "0ms", "loss": "0pct"}


def _summary_row(strategy: str, nodes: int, step_s: float, inter: float) -> dict:
    return {
        "strategy": strategy, "model": "m", "nodes": nodes, "ranks_per_node": 1, "cc": "cubic",
        **LINK, "bw_bps": float("nan"), "delay_ms": 0.0, "jitter_ms": 0.0, "loss_pct": 0.0,
        "step_time_mean_s": step_s, "internode_bytes_per_step": inter, "messages_per_step": 2.0,
    }  # fmt: skip


def _structure(sync: pd.DataFrame, temporal: pd.DataFrame) -> StudyResults:
    """The aggregate's synchronization and temporal tables, by the names the rule declares."""
    return StudyResults.of(sync_summary=sync, temporal_onoff=temporal)


def test_delay_sensitivity_names_the_most_and_least_sensitive_at_the_largest_delay() -> None:
    slowdown = pd.DataFrame(
        [
            {"strategy": s, "varied": "delay", "delay_ms": d, "slowdown_mean": v, "bw_bps": None,
             "slowdown_ci_low": lo, "slowdown_ci_high": hi}
            for s, d, v, lo, hi in [
                ("tp", 5, 2.0, 1.9, 2.1), ("tp", 20, 6.0, 5.5, 6.6),
                ("ddp", 20, 2.5, None, None), ("pp", 20, 3.0, 2.0, 4.0),
            ]
        ]
    )  # fmt: skip
    (finding,) = sensitivity_findings(StudyResults.of(slowdown=slowdown))
    assert finding.anchor == SENSITIVITY
    assert finding.text.startswith(
        "Most sensitive to latency: tp, whose step takes 6.00x (95 % CI 5.50-6.60x)"
    )
    assert "one-way delay of 20 ms (round trip +40 ms)" in finding.text
    # Without an interval (one repeat on a side), the value alone.
    assert finding.text.endswith("ddp 2.50x, the least of 3 strategies.")
    # Intervals on both ends that overlap: the order is not established, and it says so.
    close = slowdown.assign(slowdown_ci_low=[1.9, 2.0, 2.2, 2.0], slowdown_ci_high=[2.1, 7, 3, 4])
    (finding,) = sensitivity_findings(StudyResults.of(slowdown=close))
    assert finding.text.endswith(
        "ddp 2.50x (95 % CI 2.20-3.00x), the least of 3 strategies; their 95 % intervals "
        "overlap, so this order is not established."
    )


def test_placement_and_scale() -> None:
    summary = pd.DataFrame(
        [
            _summary_row("dp-tp", 2, 0.5, 10e6),
            _summary_row("dp-tp-across", 2, 0.75, 25e6),
            _summary_row("ddp", 2, 0.1, 1e6),
            _summary_row("ddp", 4, 0.3, 3e6),
            _summary_row("pp", 2, 0.1, 1e6),
            _summary_row("pp", 4, 0.12, 1e6),
            _summary_row("ddp", 8, 0.5, 7e6),
        ]
    )
    (placed,) = placement_findings(StudyResults.of(summary=summary))
    assert "dp-tp-across" in placed.text and "25.00 MB" in placed.text and "10.00 MB" in placed.text
    assert "(1.50x)" in placed.text
    # One sentence per larger node count, every strategy that ran both, largest growth first.
    four, eight = scale_findings(StudyResults.of(summary=summary))
    assert four.text == "From 2 to 4 nodes (m, unshaped), the step grows by: ddp 3.00x, pp 1.20x."
    assert eight.text == "From 2 to 8 nodes (m, unshaped), the step grows by: ddp 5.00x."


def test_structure_findings_classify_and_compare_the_bubble() -> None:
    temporal = pd.DataFrame(
        [
            {"strategy": "ddp", "node": 0, "direction": "tx", "pattern": "bursty", **LINK},
            {"strategy": "tp", "node": 0, "direction": "tx", "pattern": "bursty", **LINK},
            {"strategy": "fsdp", "node": 0, "direction": "tx", "pattern": "streaming", **LINK},
            {"strategy": "ddp", "node": 0, "direction": "tx", "pattern": "streaming",
             "bw": "50mbit", "delay": "0ms", "loss": "0pct"},  # shaped: not counted
            {"strategy": "ddp", "node": 1, "direction": "tx", "pattern": "streaming", **LINK},
        ]
    )  # fmt: skip
    sync = pd.DataFrame(
        [
            {"strategy": "ddp", "critical_comm_share": 0.15, "bubble_measured_fwd_bwd": None,
             "bubble_analytic": None, **LINK},
            {"strategy": "pp", "critical_comm_share": 0.25, "bubble_measured_fwd_bwd": 0.227,
             "bubble_analytic": 0.2, **LINK},
            # A repeat of the same cell: one entry, the mean (22.7 and 23.3: 23 %).
            {"strategy": "pp", "critical_comm_share": 0.25, "bubble_measured_fwd_bwd": 0.233,
             "bubble_analytic": 0.2, **LINK},
        ]
    )  # fmt: skip
    classes, comm, bubble = structure_findings(_structure(sync, temporal))
    assert classes.anchor == TEMPORAL
    assert classes.text.endswith("bursty: ddp, tp; streaming: fsdp.")
    assert comm.anchor == SYNC
    assert comm.text == (
        "Communication is 25 % of pp's critical path and 15 % of ddp's (steady step, unshaped "
        "link)."
    )
    assert bubble.text.endswith("forward/backward phase): pp 23 % (analytic 20 %).")
    # Cells recorded before the capture kept waits: their exposed time is an upper bound.
    old = sync.assign(exposed_source=["waits", "upper_bound", "upper_bound"])
    (_, comm, _) = structure_findings(_structure(old, temporal))
    assert comm.text.endswith("(steady step, unshaped link; upper bound: traces without waits).")
    exact = sync.assign(exposed_source="waits")
    (_, comm, _) = structure_findings(_structure(exact, temporal))
    assert comm.text.endswith("(steady step, unshaped link).")


def test_no_data_no_findings() -> None:
    empty = pd.DataFrame()
    assert study_findings(StudyResults.of(summary=empty, slowdown=empty)) == []
    assert study_findings(StudyResults()) == []


def test_knee_and_crossover_over_the_cap() -> None:
    rows = []
    # a: 1 MB per node and step, 100 ms unshaped -> knee 80 Mbit/s; b: 0.1 MB, 200 ms -> 4.
    for strategy, step_none, step_cap, tx in (("a", 0.1, 0.5, 1e6), ("b", 0.2, 0.25, 1e5)):
        for bw_bps, step in ((float("nan"), step_none), (20e6, step_cap)):
            row = _summary_row(strategy, 2, step, tx)
            row |= {"bw_bps": bw_bps, "bw": "none" if bw_bps != bw_bps else "20mbit"}
            rows.append(row | {"wire_tx_bytes_per_step_per_node": tx})
    knee, fastest = link_findings(StudyResults.of(summary=pd.DataFrame(rows)))
    assert "a 80 Mbit/s, b 4 Mbit/s" in knee.text
    assert fastest.text.startswith("Fastest by cap: a unshaped; b at 20 Mbit/s")
    assert "the fastest strategy changes 1 time" in fastest.text


def test_a_strategy_without_wire_bytes_has_no_knee() -> None:
    rows = [
        _summary_row("a", 2, 0.1, 1e6) | {"wire_tx_bytes_per_step_per_node": 1e6},
        _summary_row("b", 2, 0.2, 1e6) | {"wire_tx_bytes_per_step_per_node": float("nan")},
    ]
    # One knee only: nothing to compare.
    assert link_findings(StudyResults.of(summary=pd.DataFrame(rows))) == []


def test_no_crossover_is_said_as_such() -> None:
    rows = []
    for strategy, steps in (("a", (0.1, 0.2)), ("b", (0.3, 0.9))):
        for bw_bps, step in zip((float("nan"), 20e6), steps, strict=True):
            row = _summary_row(strategy, 2, step, 1e6) | {"wire_tx_bytes_per_step_per_node": 1e6}
            bw = "none" if bw_bps != bw_bps else "20mbit"  # the text axis and its number agree
            rows.append(row | {"bw_bps": bw_bps, "bw": bw})
    fastest = link_findings(StudyResults.of(summary=pd.DataFrame(rows)))[-1]
    assert fastest.text.startswith("No crossover over the cap: a has the shortest step at every")
    assert "down to 20 Mbit/s (2 strategies" in fastest.text


def test_a_jittered_cell_is_not_unshaped() -> None:
    table = pd.DataFrame(
        [
            {"strategy": "a", **LINK, "jitter": "0ms"},
            {"strategy": "b", **LINK, "jitter": "2ms", "delay": "5ms"},
            {"strategy": "c", **LINK},  # no jitter column value: its default, 0ms
            {"strategy": "d", **LINK, "jitter": "0ms", "bw": "50mbit"},
        ]
    )
    assert list(unshaped_rows(table)["strategy"]) == ["a", "c"]


def test_congestion_control_compares_cells_that_differ_in_nothing_else() -> None:
    rows = [
        {**_summary_row("ddp", 2, step, 1e6), "bw": "50mbit", "cc": cc, "jitter": "0ms"}
        for cc, step in [("cubic", 0.8), ("cubic", 0.9), ("bbr", 1.02)]
    ]
    # A TP cell under CUBIC only: nothing to compare it with.
    rows.append({**_summary_row("tp", 2, 0.5, 1e6), "bw": "50mbit", "jitter": "0ms"})
    (finding,) = congestion_findings(StudyResults.of(summary=pd.DataFrame(rows)))
    assert finding.text == (
        "Congestion control under a cap of 50 Mbit/s: ddp's step takes 850.0 ms with cubic, "
        "1020.0 ms with bbr (bbr's 1.20x cubic's; m on 2x1)."
    )


def test_mapping_findings_compare_predicted_jobs_that_differ_only_in_mapping() -> None:
    job = {"model": "gpt", "pp": 4, "tp": 2, "dp": 2, "ep": 1, "world_size": 16,
           "gpus_per_node": 8}  # fmt: skip
    rows = []
    for scenario, mapping, kinds in [
        ("default", "pp-dp-tp", {"pp": 6e9, "emb": 1e9, "dp": 0.0}),
        ("custom", "dp-pp-tp", {"pp": 0.0, "emb": 0.0, "dp": 3.5e9}),
    ]:
        for kind, inter in kinds.items():
            rows.append({**job, "scenario": scenario, "mapping": mapping, "traffic": kind,
                         "inter_node_bytes": inter})  # fmt: skip
        rows.append({**job, "scenario": scenario, "mapping": mapping, "traffic": "all",
                     "inter_node_bytes": sum(kinds.values())})  # fmt: skip
    # A job with one mapping only: no finding.
    rows.append({**job, "tp": 8, "scenario": "alone", "mapping": "pp-dp-tp", "traffic": "all",
                 "inter_node_bytes": 1e9})  # fmt: skip
    (finding,) = mapping_findings(StudyResults.of(predictions=pd.DataFrame(rows)))
    assert finding.anchor == PREDICTIONS
    assert finding.text == (
        "The mapping decides what crosses nodes (predicted, gpt on 16 GPUs, 8 per node, "
        "(p, t, d) = (4, 2, 2)): dp-pp-tp sends 3.50 GB across nodes (dp crossing); pp-dp-tp "
        "sends 7.00 GB across nodes (emb, pp crossing) per step; the difference is 2.0x."
    )


def test_replay_findings_say_fidelity_and_compare_sensitivity() -> None:
    from commscope.report.findings import replay_findings

    comparison = pd.DataFrame(
        {
            "cell": ["r1", "r1", "r2", "t1"],
            "strategy": ["replay", "replay", "replay", "ddp"],
            "model": ["ddp-replay", "ddp-replay", "dlrm", "gpt-tiny"],
            "traffic": ["allreduce", "broadcast", "alltoall", "dp"],
            "exact": [True, True, False, True],
        }
    )
    timing = pd.DataFrame(
        {
            "strategy": ["replay", "replay", "ddp"],
            "model": ["ddp-replay", "dlrm", "gpt-tiny"],
            "time_error": [0.04, float("nan"), 0.5],
        }
    )
    slowdown = pd.DataFrame(
        {
            "strategy": ["replay", "replay", "ddp", "tp", "ddp"],
            "model": ["dlrm", "dlrm", "gpt-tiny", "gpt-tiny", "gpt-tiny"],
            "varied": ["bw", "delay", "bw", "bw", "delay"],
            "bw_bps": [50e6, 0.0, 50e6, 50e6, 0.0],
            "delay_ms": [0.0, 20.0, 0.0, 0.0, 20.0],
            "slowdown_mean": [1.5, 3.0, 2.0, 4.0, 1.2],
        }
    )
    results = StudyResults.of(comparison=comparison, timing=timing, slowdown=slowdown)
    texts = [f.text for f in replay_findings(results)]
    assert texts[0].startswith("Replays re-issued their programs message for message")
    assert "in 1 of 2 replay cells" in texts[0] and "ddp-replay 0.96x" in texts[0]
    assert texts[1] == (
        "The replayed trace dlrm takes 1.50x as long under a cap of 50 Mbit/s; our own "
        "workloads at the same setting: ddp 2.00x, tp 4.00x."
    )
    assert texts[2].startswith("The replayed trace dlrm takes 3.00x as long under a one-way")
    assert texts[2].endswith("ddp 1.20x.")
