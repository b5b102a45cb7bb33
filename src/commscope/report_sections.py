"""The report's table sections, each computed from the study's result files.

Every function returns a tidy DataFrame for :func:`commscope.report.render_report`'s ``tables``;
none holds a number of its own. Missing inputs (a stage turned off) give empty frames, which the
report shows as "no rows".
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from commscope.metrics import crosscheck_by_strategy


def _read(path: Path) -> pd.DataFrame:
    path = Path(path)
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def crosscheck_cells(aggregate_dir: Path) -> pd.DataFrame:
    """One row per cell: does the wire agree with the recorded ops?

    From ``crosscheck.parquet`` (per node and direction) and ``matrix_check.parquet`` (per node
    pair, from packet headers): the wire/framework ratio of the cell's tx bytes (headers
    included), the largest unexplained share on any node and direction, how many node pairs of
    the wire matrix agree with the framework matrix, and whether everything passed."""
    check = _read(Path(aggregate_dir) / "crosscheck.parquet")
    if check.empty:
        return pd.DataFrame()
    keys = ["cell", "strategy", "model", "nodes", "ranks_per_node", "bw"]
    tx = check[check["direction"] == "tx"]
    per_cell = tx.groupby(keys, as_index=False).agg(
        wire_bytes=("wire_bytes", "sum"), framework_bytes=("framework_bytes", "sum")
    )
    per_cell["wire/ops"] = per_cell["wire_bytes"] / per_cell["framework_bytes"]
    check = check.assign(edge_share=check["edge_bytes"] / check["framework_bytes"])
    worst = check.groupby("cell", as_index=False).agg(
        unexplained_max_pct=("unexplained_fraction", lambda s: 100 * s.abs().max()),
        unresolved_max_pct=("edge_share", lambda s: 100 * s.max()),
        nodes_passed=("passed", "all"),
    )
    table = per_cell.merge(worst, on="cell")
    matrix = _read(Path(aggregate_dir) / "matrix_check.parquet")
    if not matrix.empty:
        pairs = matrix.groupby("cell", as_index=False).agg(
            pairs=("passed", "size"),
            pairs_passed=("passed", "sum"),
            matrix_ratio_min=("ratio", "min"),
            matrix_ratio_max=("ratio", "max"),
        )
        table = table.merge(pairs, on="cell", how="left")
        table["matrix_passed"] = table["pairs"].notna() & (table["pairs_passed"] == table["pairs"])
    else:
        table["matrix_passed"] = True  # no packet capture: nothing to compare
    table["agree"] = table["nodes_passed"] & table["matrix_passed"]
    table = table.drop(columns=["cell"]).sort_values(keys[1:]).reset_index(drop=True)
    return table


def crosscheck_strategies(aggregate_dir: Path) -> pd.DataFrame:
    """Per strategy: cells that passed the cross-validation and the spread of their ratios."""
    path = Path(aggregate_dir) / "crosscheck.parquet"
    return crosscheck_by_strategy(path) if path.exists() else pd.DataFrame()


def predictions_section(table_path: Path) -> pd.DataFrame:
    """Beyond the cluster: per scenario and traffic type, rank 0's messages and bytes and the
    whole job's bytes with the share that crosses nodes (``results/predictions/table.parquet``
    of :func:`commscope.predict.scenarios.scenario_tables`)."""
    table = _read(table_path)
    if table.empty:
        return table
    table = table.assign(
        ptd=lambda t: (
            "(" + t.pp.astype(str) + "," + t.tp.astype(str) + "," + t.dp.astype(str) + ")"
        ),
        gpus=lambda t: t.world_size.astype(str) + " (" + t.gpus_per_node.astype(str) + "/node)",
        rank0_GB=lambda t: t.rank0_bytes / 1e9,
        job_GB=lambda t: t.bytes / 1e9,
        inter_node_pct=lambda t: 100 * t.inter_node_share,
    )
    cols = ["scenario", "model", "gpus", "ptd", "mapping", "traffic", "rank0_messages"]
    return table[[*cols, "rank0_GB", "job_GB", "inter_node_pct", "predict_seconds"]]


def timing_section(timing: list[Path]) -> pd.DataFrame:
    """Predicted vs measured step time per cell (``predict/timing.parquet`` of every cell)."""
    from commscope.predict.pipeline import timing_table

    table = timing_table(timing)
    if table.empty:
        return table
    cols = ["strategy", "model", "nodes", "ranks_per_node", "bw", "bandwidth_source"]
    cols += ["predicted_step_s", "measured_step_s", "time_error", "predicted_comm_ratio"]
    cols += ["measured_comm_ratio", "predicted_bubble_ratio"]
    return table[cols].sort_values(cols[:5]).reset_index(drop=True)


def microbench_utilization(summary_path: Path) -> pd.DataFrame:
    """Bus bandwidth at the largest size measured per link and op, and its share of the cap."""
    summary = _read(summary_path)
    if summary.empty:
        return summary
    largest = summary.loc[summary.groupby(["link", "op"])["bytes"].idxmax()]
    table = largest.assign(
        size_MiB=lambda t: t.bytes / 2**20,
        busbw_Mbit_s=lambda t: t.busbw_Bps * 8 / 1e6,
        cap_Mbit_s=lambda t: t.cap_Bps * 8 / 1e6,
    )
    cols = ["bw", "delay", "loss", "op", "group_size", "size_MiB", "iterations"]
    cols += ["busbw_Mbit_s", "cap_Mbit_s", "utilization"]
    return table[cols].sort_values(["bw", "op"]).reset_index(drop=True)


def microbench_fits(fit_path: Path) -> pd.DataFrame:
    """The alpha-beta fit per link and op (``t = alpha + wire bytes / beta``)."""
    fit = _read(fit_path)
    if fit.empty:
        return fit
    table = fit.assign(
        alpha_ms=lambda t: t.alpha_s * 1e3,
        beta_Mbit_s=lambda t: t.beta_Bps * 8 / 1e6,
    )
    cols = ["bw", "delay", "loss", "op", "points", "fit_min_bytes", "alpha_ms", "beta_Mbit_s"]
    cols += ["beta_over_cap", "median_rel_error"]
    return table[cols].sort_values(["bw", "op"]).reset_index(drop=True)


def study_tables(
    aggregate_dir: Path,
    compare: list[Path],
    learning: tuple[Path, Path],
    imports: list[Path],
    timing: list[Path] = (),
    microbench: tuple[Path, Path] | None = None,
    predictions: Path | None = None,
) -> list[dict]:
    """The report's table sections in order: title, intro (how to read it), frame.
    ``microbench`` is the (summary, fit) pair of the microbenchmark stage, ``predictions``
    the scenario table; either may be absent (stage turned off)."""
    from commscope.learning import learning_table
    from commscope.predict.pipeline import comparison_table

    bench_sections = []
    if microbench:
        bench_sections = [
            {
                "title": "Collective microbenchmarks: bandwidth at the largest size",
                "intro": "Each collective alone between 2 nodes (1 rank each) on every link "
                "setting of the study, message sizes from 1 KiB upward by x4 (docs/microbench.md)."
                " busbw uses nccl-tests' definitions (allreduce algbw x 2(n-1)/n; allgather, "
                "reduce_scatter, alltoall x (n-1)/n; broadcast, sendrecv x 1); utilization = "
                "busbw / cap. A size whose one iteration would exceed run time limits is "
                "skipped, so the largest size can be below 64 MiB on slow links. gloo runs "
                "reduce_scatter as a full all-reduce (half the rate) and moves the two directions "
                "of allgather/alltoall one after the other; sendrecv is one-way with a 4-byte "
                "acknowledgement (as osu_bw).",
                "frame": microbench_utilization(microbench[0]),
            },
            {
                "title": "Collective microbenchmarks: alpha-beta fits",
                "intro": "t = alpha + wire bytes / beta per op and link, wire bytes per rank as "
                "the traffic model counts them, least squares on relative error; on capped links "
                "only sizes >= fit_min_bytes (tbf's 64 KB bucket lets smaller messages pass at "
                "line rate). These alphas and betas feed the predicted step times below.",
                "frame": microbench_fits(microbench[1]),
            },
        ]
    return [
        {
            "title": "Wire vs recorded ops, per strategy",
            "intro": "Cross-validation of the two measurement levels (docs/crossvalidation.md). "
            "For every cell, the bytes each node's interface counted during the training window "
            "against the bytes its recorded ops imply under the algorithms the backend really "
            "runs (gloo: all-reduce rings, reduce-scatter as a full all-reduce, binomial "
            "broadcast, pairwise all-to-all), plus 66 B of headers per counted packet and gloo's "
            "48 B message preambles. A cell passes when the unexplained rest is at most 2 % of "
            "the ops' bytes (or 4 KB per step) on every node and direction. ratio = wire / ops, "
            "headers included.",
            "frame": crosscheck_strategies(aggregate_dir),
        },
        {
            "title": "Wire vs recorded ops, per cell",
            "intro": "wire/ops: the cell's transmitted bytes on the wire over the bytes its ops "
            "imply (headers included, so slightly above 1). unexplained_max_pct: the largest "
            "share left unexplained on any node and direction. unresolved_max_pct: the largest "
            "share the 1 kHz counters saw inside a sample interval straddling a window edge, "
            "which counts on either side (large only where the sampler was descheduled across "
            "a burst). pairs_passed: node pairs whose "
            "bytes in the packet-header capture (the wire node x node matrix) agree with the "
            "framework node x node matrix within the same tolerance. agree = both checks pass.",
            "frame": crosscheck_cells(aggregate_dir),
        },
        {
            "title": "Predicted vs measured traffic",
            "intro": "The analytical model (commscope predict) against the trace: bytes and "
            "messages of one steady step summed over ranks, per traffic type. exact = every "
            "rank and measured step matched in bytes and message count. MoE token all-to-alls "
            "depend on routing: the model predicts balanced experts.",
            "frame": comparison_table(list(compare)),
        },
        *bench_sections,
        {
            "title": "Predicted vs measured step time",
            "intro": "The alpha-beta model per op (bandwidth_source: the microbenchmark fit of "
            "the cell's link, or the trace's own rate) on the predicted ops, compute time from "
            "the cell's trace (time outside communication), the pipeline bubble from the "
            "schedule; time_error = predicted / measured - 1 on the median steady step. DDP "
            "overlaps its all-reduce with backward, which the model does not, so it predicts "
            "an upper bound there.",
            "frame": timing_section(list(timing)),
        },
        {
            "title": "Beyond the cluster: predicted traffic of large GPT jobs",
            "intro": "Seed 002's settings (config predictions:), predicted analytically in "
            "seconds: per scenario and traffic type, rank 0's messages and volume per step, the "
            "whole job's volume, and the share of it that crosses nodes. Default mapping "
            "pp-dp-tp (stages across nodes) vs customized dp-pp-tp (DP across nodes): the same "
            "bytes on other links. Node x node heatmaps are among the figures.",
            "frame": predictions_section(predictions) if predictions else pd.DataFrame(),
        },
        {
            "title": "Learning runs",
            "intro": "Training loss at the first and last step (mean over ranks) and, for MoE "
            "cells, the all-to-all non-uniform factor ((max - min) / mean tokens received per "
            "EP rank) at the first and last step.",
            "frame": learning_table(*learning),
        },
        {
            "title": "Imported traces",
            "intro": "Traces recorded by others on GPU clusters (config imports:), loaded into "
            "the same ops table: per-step volume and op mix. Their op tables, message sizes "
            "and communication matrices are under results/imports/.",
            "frame": pd.concat(map(pd.read_parquet, imports)) if imports else pd.DataFrame(),
        },
    ]
