"""Study-level tables derived from the aggregated metric tables, for the figures and the report.

Each is a pure DataFrame -> DataFrame function over tables of many cells (the concatenations
:func:`commscope.metrics.aggregate_cells` writes), so a figure only draws what they return. The
aggregate job writes :data:`STUDY_TABLES` (:func:`derive_study_tables`) beside the concatenated
tables; the small helpers at the end are the arithmetic the figures' titles and fit lines show.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from commscope.collectives.ring import bench_wire_bytes
from commscope.metrics.volume import size_cdf

# Parameters that, besides strategy and model, tell series apart in sweep plots.
SERIES_AXES = ("nodes", "ranks_per_node", "delay", "jitter", "loss", "cc")
# The aggregated metric tables they are derived from.
STUDY_SOURCES: tuple[str, ...] = ("msg_sizes", "summary", "op_volume", "step_times")


def measured_size_cdf(msgs: pd.DataFrame) -> pd.DataFrame:
    """Message-size CDF per (model, strategy) over all cells, of the measured steps' messages
    (all messages when none is flagged ``measured``); see :func:`~commscope.metrics.size_cdf`.

    Columns: model, strategy, bytes, count, cum_fraction (no columns when ``msgs`` is empty).
    """
    if "measured" in msgs and bool(msgs["measured"].any()):
        msgs = msgs[msgs["measured"].astype(bool)]
    return size_cdf(msgs, by=["model", "strategy"]) if not msgs.empty else pd.DataFrame()


def step_time_over_repeats(summary: pd.DataFrame) -> pd.DataFrame:
    """Mean step time per series and bandwidth cap: mean, standard deviation and number of the
    cells' ``step_time_mean_s`` over repeats.

    A series is a (model, strategy) plus whichever of :data:`SERIES_AXES` vary in ``summary``.
    ``std`` is 0 for a single repeat (no spread to show). ``bw_bps`` is the cap in bit/s as a
    float, NaN for uncapped cells.

    Columns: model, strategy, the varying series axes, bw, bw_bps, mean, std, repeats.
    """
    varying = [c for c in SERIES_AXES if c in summary and summary[c].nunique(dropna=False) > 1]
    keys = ["model", "strategy", *varying, "bw", "bw_bps"]
    if summary.empty:
        return pd.DataFrame(columns=[*keys, "mean", "std", "repeats"])
    df = summary.assign(bw_bps=summary["bw_bps"].astype("float64"))
    agg = (
        df.groupby(keys, sort=True, dropna=False)["step_time_mean_s"]
        .agg(mean="mean", std="std", repeats="count")
        .reset_index()
    )
    agg["std"] = agg["std"].fillna(0.0)  # a single repeat has no spread to show
    return agg


def bytes_per_step_by_op(op_volume: pd.DataFrame, step_table: pd.DataFrame) -> pd.DataFrame:
    """Mean framework bytes per measured step, per (model, strategy, op), over cells.

    Steps in which an op did not occur count as zero, by dividing each cell's total by its
    number of measured steps. Columns: model, strategy, op, bytes_per_step, cells.
    """
    cols = ["model", "strategy", "op", "bytes_per_step", "cells"]
    if op_volume.empty or step_table.empty:
        return pd.DataFrame(columns=cols)
    measured = step_table[~step_table["warmup"].astype(bool)][["cell", "step"]]
    n_steps = measured.groupby("cell").size().rename("n_steps")
    vol = op_volume.merge(measured, on=["cell", "step"], how="inner")
    per_cell = vol.groupby(["cell", "model", "strategy", "op"], sort=True)["bytes"].sum()
    per_cell = per_cell.reset_index().join(n_steps, on="cell")
    per_cell["bytes_per_step"] = per_cell["bytes"] / per_cell["n_steps"]
    out = (
        per_cell.groupby(["model", "strategy", "op"], sort=True)
        .agg(bytes_per_step=("bytes_per_step", "mean"), cells=("cell", "nunique"))
        .reset_index()
    )
    return out[cols]


def derive_study_tables(tables: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Every table of :data:`STUDY_TABLES`, by name, from the aggregated metric tables
    ``tables`` (at least :data:`STUDY_SOURCES`): :func:`measured_size_cdf`,
    :func:`step_time_over_repeats` and :func:`bytes_per_step_by_op`."""
    return {
        "msg_size_cdf": measured_size_cdf(tables["msg_sizes"]),
        "step_time_over_repeats": step_time_over_repeats(tables["summary"]),
        "bytes_per_step_by_op": bytes_per_step_by_op(tables["op_volume"], tables["step_times"]),
    }


def cross_node_share(grid: pd.DataFrame) -> float | None:
    """Share of the bytes of a square node x node matrix (sender rows, receiver columns, same
    node order on both axes) that cross nodes: everything off the diagonal over the total;
    None when the matrix carries no bytes."""
    diagonal = float(np.trace(grid.to_numpy())) if len(grid) else 0.0
    total = float(grid.to_numpy().sum())
    return (total - diagonal) / total if total > 0 else None


def alpha_beta_curve(
    fit: Mapping[str, object], op: str, lo: float, hi: float, points: int = 50
) -> tuple[np.ndarray, list[float]]:
    """The times ``t = alpha + wire / beta`` an alpha-beta ``fit`` row (alpha_s, beta_Bps,
    group_size, backend; :func:`commscope.bench.analysis.fit_table`) predicts for benchmark
    ``op`` at ``points`` sizes spaced evenly on a log scale from ``lo`` to ``hi`` (nccl-tests
    size convention), wire bytes from :func:`commscope.collectives.ring.bench_wire_bytes`.
    Returns (sizes, times)."""
    sizes = np.geomspace(lo, hi, points)
    n = int(fit["group_size"])
    backend = fit["backend"]
    return sizes, [
        fit["alpha_s"] + bench_wire_bytes(op, s, n, backend) / fit["beta_Bps"] for s in sizes
    ]


def crosscheck_per_cell(check: pd.DataFrame, matrix: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: does the wire agree with the recorded ops?

    From the aggregated ``crosscheck`` table (per node and direction) and ``matrix_check``
    table (per node pair, from packet headers; empty without a capture): the wire/framework
    ratio of the cell's tx bytes (headers included, column ``wire/ops``), the largest
    unexplained share on any node and direction, how many node pairs of the wire matrix agree
    with the framework matrix, and whether everything passed (``agree``). Empty when
    ``check`` is."""
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
