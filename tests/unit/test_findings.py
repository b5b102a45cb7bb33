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
    volume_findings,
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
             "slowdown_ci_low": lo, "slowdown_ci_high": hi, "model": "m", "nodes": 2,
             "ranks_per_node": 1, "steps": 4, "cc": "cubic", "repeats": 3}
            for s, d, v, lo, hi in [
                ("tp", 5, 2.0, 1.9, 2.1), ("tp", 20, 6.0, 5.5, 6.6),
                ("ddp", 20, 2.5, None, None), ("pp", 20, 3.0, 2.0, 4.0),
            ]
        ]
    )  # fmt: skip
    (finding,) = sensitivity_findings(StudyResults.of(slowdown=slowdown))
    assert finding.anchor == SENSITIVITY
    assert (finding.question, finding.source) == ("sensitivity", "measured")
    assert finding.text.startswith(
        "Most sensitive to latency (m on 2 nodes, 1 rank each): tp, whose step takes 6.00x "
        "(95 % CI 5.50-6.60x)"
    )
    assert "one-way delay of 20 ms (round trip +40 ms)" in finding.text
    # Without an interval on a side: the value alone, and the order is not established.
    assert finding.text.endswith(
        "ddp 2.50x, the least of 3 strategies; not established: 3 runs, no interval (at least "
        "2 runs of each setting and of its baseline are needed)."
    )
    # Separate intervals: the order is stated.
    apart = slowdown.assign(slowdown_ci_low=[1.9, 5.5, 2.2, 2.0], slowdown_ci_high=[2.1, 6.6, 3, 4])
    (finding,) = sensitivity_findings(StudyResults.of(slowdown=apart))
    assert finding.text.endswith("ddp 2.50x (95 % CI 2.20-3.00x), the least of 3 strategies.")
    # The order established end to end, but the second's interval reaches the leader's: the
    # lead at the top is not established, and it says so.
    tie = apart.copy()
    tie.loc[3, ["slowdown_mean", "slowdown_ci_low", "slowdown_ci_high"]] = [5.8, 5.0, 6.7]
    (finding,) = sensitivity_findings(StudyResults.of(slowdown=tie))
    assert finding.text.startswith(
        "Most sensitive to latency (m on 2 nodes, 1 rank each): tp, whose step takes 6.00x "
    )
    assert (
        ", though its lead over pp (5.80x (95 % CI 5.00-6.70x)) is not established (their 95 % "
        "intervals overlap); ddp 2.50x"
    ) in finding.text
    assert finding.text.endswith("the least of 3 strategies.")
    # Another setup at the same delay is not averaged in: only the setup with most strategies.
    other = slowdown.iloc[[1]].assign(nodes=4, slowdown_mean=60.0)
    (finding,) = sensitivity_findings(StudyResults.of(slowdown=pd.concat([slowdown, other])))
    assert "tp, whose step takes 6.00x" in finding.text
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
    assert placed.text.startswith("Placement (m on 2 nodes, 1 rank each, unshaped)")
    assert placed.question == "placement and scale"
    assert placed.text.endswith(
        "750.0 ms (one run) against 500.0 ms (one run), 1.50x; not established: one run each, "
        "no interval (at least 2 runs each are needed)."
    )
    # One sentence per larger node count, every strategy that ran both, largest growth first.
    four, eight = scale_findings(StudyResults.of(summary=summary))
    assert four.text == (
        "From 2 to 4 nodes (m, 1 rank per node, unshaped), the step grows by: ddp 3.00x, pp "
        "1.20x; the order of the first two is not established (no interval: fewer than 2 runs "
        "on a side)."
    )
    assert (
        eight.text
        == "From 2 to 8 nodes (m, 1 rank per node, unshaped), the step grows by: ddp 5.00x."
    )
    # Repeats whose intervals separate: the order is stated, with the intervals.
    again = pd.DataFrame(
        [
            _summary_row(strategy, nodes, step + jitter, 1e6)
            for strategy, nodes, step in [("ddp", 2, 0.1), ("ddp", 4, 0.3), ("pp", 2, 0.1),
                                          ("pp", 4, 0.12)]
            for jitter in (0.0, 0.001, 0.002)
        ]
    )  # fmt: skip
    (four,) = scale_findings(StudyResults.of(summary=again))
    assert (
        "ddp 2.98x (95 % CI 2.90-3.06x), pp 1.20x (95 % CI 1.17-1.23x)." in four.text
        and "not established" not in four.text
    )


def test_host_limited_cells_are_left_out_and_counted() -> None:
    rows = [
        _summary_row("dp-tp", 2, 0.5, 10e6) | {"cell": "a", "host_limited": False},
        _summary_row("dp-tp-across", 2, 0.75, 25e6) | {"cell": "b", "host_limited": False},
        _summary_row("dp-tp-across", 2, 9.0, 25e6) | {"cell": "c", "host_limited": True},
    ]
    (placed,) = placement_findings(StudyResults.of(summary=pd.DataFrame(rows)))
    assert "750.0 ms (one run)" in placed.text
    assert placed.text.endswith("(1 host-limited cell left out).")
    # Without the column (not monitored) nothing is left out and nothing is said.
    plain = pd.DataFrame(rows[:2]).drop(columns="host_limited")
    (placed,) = placement_findings(StudyResults.of(summary=plain))
    assert "host-limited" not in placed.text


def test_structure_findings_on_off_critical_path_overlap_and_bubble() -> None:
    summary = pd.DataFrame(
        [
            _summary_row("ddp", 2, 0.1, 1e6) | {"cell": "d1"},
            _summary_row("ddp", 2, 0.1, 1e6) | {"cell": "d2"},
            _summary_row("pp", 2, 0.1, 1e6) | {"cell": "p1"},
            _summary_row("pp", 2, 0.1, 1e6) | {"cell": "p2"},
            _summary_row("pp", 4, 0.1, 1e6) | {"cell": "p4"},  # another setup: not compared
        ]
    )
    bursts = pd.DataFrame(
        [
            {"cell": c, "strategy": st, "model": "m", "nodes": 2, "ranks_per_node": 1,
             "node": 0, "direction": "tx", "bin_ms": 1.0, "resolved": True,
             "peak_to_mean": ptm, "on_fraction": on, "on_ms_median": 2.0, "on_ms_p90": 3.0,
             "off_ms_median": 8.0, "off_ms_p90": 9.0, "burst_byte_share": 0.5, **LINK}
            for c, st, ptm, on in [("d1", "ddp", 4.0, 0.2), ("d2", "ddp", 4.2, 0.4),
                                   ("p1", "pp", 8.0, 0.1), ("p2", "pp", 8.2, 0.1)]
        ]
    )  # fmt: skip
    sync = pd.DataFrame(
        [
            {"cell": c, "strategy": st, "model": "m", "nodes": n, "ranks_per_node": 1,
             "critical_comm_share": share, "comm_overlap": ov, "exposed_source": "waits",
             "bubble_measured_fwd_bwd": bub, "bubble_analytic": ana, **LINK}
            for c, st, n, share, ov, bub, ana in [
                ("d1", "ddp", 2, 0.60, 0.30, None, None), ("d2", "ddp", 2, 0.62, 0.32, None, None),
                ("p1", "pp", 2, 0.20, 0.05, 0.227, 0.2), ("p2", "pp", 2, 0.22, 0.07, 0.233, 0.2),
                ("p4", "pp", 4, 0.99, 0.99, None, None),
            ]
        ]
    )  # fmt: skip
    results = StudyResults.of(summary=summary, sync_summary=sync, temporal_bursts=bursts)
    onoff, comm, overlap, bubble = structure_findings(results)
    assert (onoff.anchor, onoff.question) == (TEMPORAL, "temporal structure")
    assert "ddp on 30 % of bins in periods of 2 ms (p90 3), off 8 ms (p90 9)" in onoff.text
    assert "m on 2 nodes, 1 rank each" in onoff.text and "(mean of up to 2 runs)" in onoff.text
    assert (comm.anchor, comm.question) == (SYNC, "synchronisation")
    # 60 and 62 %: t(1) = 12.71 x 0.01414 / sqrt(2) = 0.127 either side.
    assert comm.text == (
        "Communication is 61 % of ddp's critical path (95 % CI 48-74 %, 2 runs) and 21 % of "
        "pp's (95 % CI 8-34 %, 2 runs; steady step, m on 2 nodes, 1 rank each, unshaped)."
    )
    assert overlap.text.startswith("Overlap measured")
    # pp's t interval reaches -7 %: a share's interval is shown within 0-100 %.
    assert "ddp 31 % (95 % CI 18-44 %, 2 runs), pp 6 % (95 % CI 0-19 %, 2 runs)" in overlap.text
    assert overlap.text.endswith(
        "not established: their 95 % intervals overlap (2 and 2 runs); about 3 runs each "
        "would settle it."
    )
    assert bubble.text.endswith(
        "forward/backward phase, unshaped): pp (m) on 2x1 23 % (analytic 20 %)."
    )
    # Cells recorded before the capture kept waits: their exposed time is an upper bound.
    old = sync.assign(exposed_source=["waits", "upper_bound", "upper_bound", "waits", "waits"])
    results = StudyResults.of(summary=summary, sync_summary=old, temporal_bursts=bursts)
    comm = structure_findings(results)[1]
    assert "unshaped; upper bound: traces without waits)" in comm.text


def test_burstiness_over_timescales_names_the_burstiest_at_each() -> None:
    summary = pd.DataFrame(
        [
            _summary_row("ddp", 2, 0.1, 1e6) | {"cell": "d"},
            _summary_row("pp", 2, 0.1, 1e6) | {"cell": "p"},
        ]
    )
    bursts = pd.DataFrame(
        [
            {"cell": c, "strategy": st, "model": "m", "nodes": 2, "ranks_per_node": 1,
             "node": node, "direction": "tx", "bin_ms": w, "resolved": True, "peak_to_mean": v}
            for c, st, node, w, v in [
                ("d", "ddp", 0, 0.1, 30.0), ("d", "ddp", 1, 0.1, 40.0), ("d", "ddp", 0, 1.0, 5.0),
                ("p", "pp", 0, 0.1, 20.0), ("p", "pp", 0, 1.0, 9.0),
            ]
        ]
    )  # fmt: skip
    findings = volume_findings(StudyResults.of(summary=summary, temporal_bursts=bursts))
    (burst,) = [f for f in findings if f.question == "temporal structure"]
    assert burst.text == (
        "Burstiness over timescales (peak/mean of a node's transmitted payload per bin, the "
        "burstier node; m on 2 nodes, 1 rank each, unshaped): 100 µs: ddp 40.0x, pp 20.0x; "
        "1 ms: pp 9.0x, ddp 5.0x. The burstiest strategy changes with the timescale (ddp at "
        "100 µs, pp at 1 ms); at 100 µs, 1 ms the lead is not established (one run each)."
    )


def test_no_data_no_findings() -> None:
    empty = pd.DataFrame()
    assert study_findings(StudyResults.of(summary=empty, slowdown=empty)) == []
    assert study_findings(StudyResults()) == []


def test_knee_and_crossover_over_the_cap() -> None:
    rows = []
    # a: 100 ms unshaped, 105 ms at 100 Mbit/s, 150 ms at 50 -> knee 1/(1/100M + 0.05 / 0.45 x
    # 1/100M) = 90 Mbit/s; b: 200 ms unshaped, 205 and 210 ms: below 50 Mbit/s.
    for strategy, steps in (("a", (0.1, 0.105, 0.15)), ("b", (0.2, 0.205, 0.21))):
        for bw_bps, step in zip((float("nan"), 100e6, 50e6), steps, strict=True):
            row = _summary_row(strategy, 2, step, 1e6) | {"steps": 4, "jitter": "0ms"}
            bw = "none" if bw_bps != bw_bps else f"{bw_bps / 1e6:g}mbit"
            rows.append(row | {"bw_bps": bw_bps, "bw": bw, "wire_tx_bytes_per_step_per_node": 1e6})
    knee, fastest = link_findings(StudyResults.of(summary=pd.DataFrame(rows)))
    assert knee.question == "sensitivity"
    assert "a 90 Mbit/s (between 50 Mbit/s, 1.50x, and 100 Mbit/s, 1.05x)" in knee.text
    assert (
        "b below 50 Mbit/s (1.05x there, the lowest cap run: the caps do not bracket it)"
        in knee.text
    )
    assert "(bytes rate): a 80 Mbit/s, b 40 Mbit/s" in knee.text
    assert fastest.text == (
        "No crossover over the cap: a has the shortest step at every cap, from unshaped down to "
        "50 Mbit/s (2 strategies, m on 2 nodes, 1 rank each; the fastest is not established at "
        "any cap (one run each))."
    )


def test_a_strategy_without_a_capped_cell_has_no_knee() -> None:
    rows = [
        _summary_row("a", 2, 0.1, 1e6) | {"steps": 4},
        _summary_row("b", 2, 0.2, 1e6) | {"steps": 4},
    ]
    # No cap at all: no knee, no crossover.
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
        "Congestion control under a cap of 50 Mbit/s: ddp's step takes 850.0 ms with cubic "
        "(95 % CI 214.7 ms-1485.3 ms, 2 runs), 1020.0 ms with bbr (one run) (bbr's 1.20x "
        "cubic's; m on 2 nodes, 1 rank each); not established: 1 and 2 runs, no interval (at "
        "least 2 runs each are needed)."
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
        "workloads at the same setting and cluster: ddp (gpt-tiny) 2.00x, tp (gpt-tiny) 4.00x."
    )
    assert texts[2].startswith("The replayed trace dlrm takes 3.00x as long under a one-way")
    assert texts[2].endswith("ddp (gpt-tiny) 1.20x.")


def test_only_the_host_limited_cells_of_a_findings_setup_are_counted() -> None:
    rows = [
        _summary_row("dp-tp", 2, 0.5, 10e6) | {"cell": "a", "host_limited": False},
        _summary_row("dp-tp-across", 2, 0.75, 25e6) | {"cell": "b", "host_limited": False},
        # Host-limited, but on 4 nodes: not a side of the 2-node comparison.
        _summary_row("dp-tp-across", 4, 9.0, 25e6) | {"cell": "c", "host_limited": True},
    ]
    (placed,) = placement_findings(StudyResults.of(summary=pd.DataFrame(rows)))
    assert "host-limited" not in placed.text


def test_a_failed_cell_note_keeps_the_findings_tags() -> None:
    from commscope.report.findings import Finding, lost_sides

    f = Finding("ddp is slow.", SENSITIVITY, question="sensitivity", source="measured")
    cell = "strategy~ddp/model~m/nodes~2/ranks_per_node~1/bw~none/delay~0ms/loss~0pct/repeat~0"
    (noted,) = lost_sides([f], [{"cell": cell}], ["ddp"])
    assert "[Computed without 1 failed cell" in noted.text
    assert (noted.question, noted.source) == ("sensitivity", "measured")


def test_the_knee_order_is_established_only_where_the_knees_intervals_separate() -> None:
    from commscope.report.findings.link import _knee_ties, _knee_words

    nan, inf = float("nan"), float("inf")
    order = pd.DataFrame(
        [  # strategy, knee, its interval: ordered by knee, highest first
            ("fsdp", 700e6, 650e6, 760e6), ("tp", 620e6, 500e6, 700e6),
            ("ddp", 610e6, 560e6, 640e6), ("pp", 140e6, 0.0, 300e6), ("ep", 100e6, nan, nan),
        ],
        columns=["strategy", "knee_bps", "knee_ci_low_bps", "knee_ci_high_bps"],
    ).assign(cap_low_bps=200e6, cap_high_bps=1e9, slowdown_low=1.8, slowdown_high=1.0)  # fmt: skip
    # fsdp's interval reaches tp's, tp's and ddp's overlap; ddp's lies above pp's; ep has none.
    assert _knee_ties(order) == ["fsdp and tp", "tp and ddp", "pp and ep"]
    words = [_knee_words(r) for _, r in order.iterrows()]
    assert words[0].startswith("fsdp 700 Mbit/s, 95 % CI 650-760 Mbit/s (between 200 Mbit/s")
    assert words[3].startswith("pp 140 Mbit/s, 95 % CI up to 300 Mbit/s (between")
    assert words[4].startswith("ep 100 Mbit/s (between")
    high = order.iloc[[0]].assign(knee_ci_high_bps=inf)
    assert ", 95 % CI from 650 Mbit/s up (" in _knee_words(high.iloc[0])
