"""Study-level tables derived from the aggregated metric tables, for the study figures.

Each is a pure DataFrame -> DataFrame function over tables of many cells (the concatenations
:func:`commscope.metrics.aggregate_cells` writes), so a figure only draws what they return.
"""

from __future__ import annotations

import pandas as pd

from commscope.metrics.volume import size_cdf

# Parameters that, besides strategy and model, tell series apart in sweep plots.
SERIES_AXES = ("nodes", "ranks_per_node", "delay", "jitter", "loss")


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
