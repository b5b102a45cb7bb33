"""The report's cross-validation sections, computed from a synthetic study's metric tables."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from synthetic import make_ddp_cell

from commscope import metrics
from commscope.report import StudyResults
from commscope.report.sections.bench import busbw_factor_forms, busbw_text
from commscope.report.sections.crosscheck import crosscheck_cells, crosscheck_strategies
from commscope.report.sections.structure import _STRUCTURE_KEYS, sync_section, temporal_section
from commscope.report.sections.wire import wire_cells, wire_intro
from commscope.units import fmt_ratio


def _results(agg: Path) -> StudyResults:
    """The aggregate's cross-validation tables, as the report rule declares them."""
    names = ("crosscheck", "matrix_check")
    return StudyResults({name: agg / f"{name}.parquet" for name in names})


def _study(root: Path, wire_flows: bool) -> Path:
    dirs = []
    for bw in ("10mbit", "none"):
        cell = make_ddp_cell(root / "runs", bw=bw, bucket_bytes=(4000, 2000))
        if wire_flows:
            # The packet capture saw exactly the framework matrix plus one header per packet.
            traces = metrics.load_cell(cell)
            nodes = metrics.node_matrix(metrics.comm_matrix(traces.ops, backend=traces.backend))
            window = metrics.training_window(metrics.step_times(traces.steps, 1))
            flows = nodes[nodes.src_node != nodes.dst_node].assign(t_ns=window[0], packets=1)
            flows["bytes"] = flows["bytes"].astype(int) + 66
            flows[["t_ns", "src_node", "dst_node", "bytes", "packets"]].to_parquet(
                cell / "wire_flows.parquet"
            )
        out = root / "metrics" / cell.relative_to(root / "runs")
        metrics.compute_cell_metrics(cell, out)
        dirs.append(out)
    metrics.aggregate_cells(dirs, root / "agg")
    return root / "agg"


def test_crosscheck_sections_one_row_per_cell_and_strategy(tmp_path: Path) -> None:
    agg = _study(tmp_path, wire_flows=False)
    cells = crosscheck_cells(_results(agg))
    check = pd.read_parquet(agg / "crosscheck.parquet")
    assert len(cells) == check["cell"].nunique() == 2
    tx = check[check.direction == "tx"]
    for _, row in cells.iterrows():
        mine = tx[tx.bw == row.bw]
        assert row["wire/ops"] == mine.wire_bytes.sum() / mine.framework_bytes.sum()
        assert row["agree"] == bool(check[check.bw == row.bw].passed.all())
    per_strategy = crosscheck_strategies(_results(agg))
    assert per_strategy["cells"].tolist() == [2]
    assert per_strategy["cells_passed"].tolist() == [int(cells["agree"].sum())]


def test_crosscheck_cells_counts_matrix_pairs_from_the_capture(tmp_path: Path) -> None:
    agg = _study(tmp_path, wire_flows=True)
    cells = crosscheck_cells(_results(agg))
    matrix = pd.read_parquet(agg / "matrix_check.parquet")
    assert not matrix.empty
    assert cells["pairs"].tolist() == matrix.groupby("cell").size().tolist()
    assert cells["pairs_passed"].tolist() == matrix.groupby("cell").passed.sum().tolist()
    assert cells["matrix_passed"].tolist() == matrix.groupby("cell").passed.all().tolist()


def test_sections_are_empty_without_inputs(tmp_path: Path) -> None:
    missing = _results(tmp_path)
    assert crosscheck_cells(missing).empty and crosscheck_strategies(missing).empty
    assert crosscheck_cells(StudyResults()).empty


def test_microbenchmark_text_names_the_factors_the_code_uses() -> None:
    # The report's busbw definitions come from collectives.ring, per backend.
    nccl, gloo = busbw_factor_forms("nccl"), busbw_factor_forms("gloo")
    assert nccl["allreduce"] == gloo["allreduce"] == "2(n-1)/n"
    assert nccl["reduce_scatter"] == "(n-1)/n" and gloo["reduce_scatter"] == "2(n-1)/n"
    assert nccl["broadcast"] == "1" and gloo["broadcast"] == "ceil(log2 n)"
    text = busbw_text()
    assert "reduce_scatter x 2(n-1)/n (a full all-reduce)" in text
    assert "broadcast x ceil(log2 n)" in text


def test_wire_table_says_where_each_cells_bytes_came_from(tmp_path: Path) -> None:
    summary = pd.DataFrame(
        {
            "strategy": ["ddp", "tp"],
            "model": ["m", "m"],
            "nodes": [2, 2],
            "bw": ["50mbit", "none"],
            "wire_source": ["bpf", "counters"],
            "wire_resolution_us": [100.0, 1000.0],
            "wire_fallback": ["", "node1: not root"],
            "peak_to_mean_100us": [1.02, float("nan")],
            "peak_to_mean_1ms": [1.01, 3.0],
            "peak_to_mean_10ms": [1.0, 2.0],
            "peak_to_mean_100ms": [1.0, 1.5],
            "cov_100us": [0.05, float("nan")],
            "cov_10ms": [0.01, 0.8],
            "bw_utilization": [0.97, float("nan")],
        }
    )
    path = tmp_path / "summary.parquet"
    summary.to_parquet(path)
    table = wire_cells(StudyResults({"summary": path}))
    assert table["wire"].tolist() == ["bpf at 100 µs", "counters at 1000 µs"]
    assert table.loc[0, "peak/mean 0.1 ms"] == fmt_ratio(1.02)
    intro = wire_intro(StudyResults.of(summary=summary))
    assert "1 of 2 cells were measured in the kernel (tc BPF, 100 µs bins" in intro
    assert "1 fell back to the 1 kHz /proc sampler and tcpdump because: node1: not root" in intro
    assert wire_cells(StudyResults({"summary": tmp_path / "absent.parquet"})).empty


def test_structure_tables_name_what_tells_their_cells_apart() -> None:
    """Two DDP cells that differ only in congestion control, and a repeat of one: the sync and
    temporal tables grow cc and repeat columns, so no two rows read the same; jitter, constant,
    stays out."""
    keys = {"strategy": "ddp", "model": "gpt-tiny", "nodes": 2, "ranks_per_node": 1,
            "bw": "50mbit", "delay": "0ms", "loss": "0pct", "jitter": "0ms"}  # fmt: skip
    cells = [{**keys, "cc": cc, "repeat": r} for cc, r in [("cubic", 0), ("bbr", 0), ("cubic", 1)]]
    sync = pd.DataFrame(
        [
            {**c, "collectives_per_step": 2.0, "p2p_per_step": 0.0, "sync_skew_mean_s": 0.001,
             "comm_ratio_median": 0.5, "critical_path_s": 0.1, "critical_comm_share": 0.4,
             "bubble_measured_fwd_bwd": float("nan"), "bubble_analytic": float("nan")}
            for c in cells
        ]
    )  # fmt: skip
    table = sync_section(sync)
    assert list(table.columns[:9]) == [*_STRUCTURE_KEYS, "cc", "repeat"]
    assert not table[[*_STRUCTURE_KEYS, "cc", "repeat"]].duplicated().any()
    onoff = pd.DataFrame(
        [
            {**c, "node": 0, "direction": "tx", "on_fraction": 0.5, "n_bursts": 3,
             "burst_bytes_median": 1e5, "burst_ms_median": 2.0, "gap_ms_median": 8.0,
             "pattern": "bursty"}
            for c in cells[:2]
        ]
    )  # fmt: skip
    assert list(temporal_section(onoff).columns[:8]) == [*_STRUCTURE_KEYS, "cc"]


def test_findings_are_written_as_data_in_the_reports_order(tmp_path) -> None:
    """findings.json: what a user quotes and two studies are compared by, one object per
    finding with its question, source, sentence and section."""
    import json

    from commscope.report.findings import Finding
    from commscope.report.render import write_findings

    findings = [
        Finding("fsdp sends the most bytes", "summary", "volume", "measured"),
        Finding("the wire carried what the ranks recorded", "crosscheck", "checks", "check"),
    ]
    path = tmp_path / "findings.json"
    write_findings(findings, path)
    rows = json.loads(path.read_text())
    assert rows == [
        {"question": f.question, "source": f.source, "text": f.text, "anchor": f.anchor}
        for f in findings
    ]
