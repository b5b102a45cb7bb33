"""Step times and the training window, from ``steps.parquet``."""

from __future__ import annotations

import pandas as pd

from commscope.metrics._common import _groupby, _param_cols
from commscope.units import NS_PER_S

STEP_TIME_COLUMNS = [
    "step",
    "t_start_ns",
    "t_end_ns",
    "duration_s",
    "n_ranks",
    "start_spread_s",
    "warmup",
]


def step_times(steps: pd.DataFrame, warmup_steps: int) -> pd.DataFrame:
    """Wall-clock extent of each training step across all ranks.

    A step starts when the first rank enters it and ends when the last rank leaves it (the
    ``step`` phase rows of ``steps.parquet``), because the slowest rank sets the pace of a
    synchronous job. ``start_spread_s`` is how far apart the ranks entered the step (a measure
    of skew). Steps numbered below ``warmup_steps`` are flagged ``warmup`` so summaries can
    exclude them (first steps pay for allocator warm-up, gloo connection setup, DDP bucket
    rebuilds).

    Columns: cell params, step, t_start_ns, t_end_ns, duration_s, n_ranks, start_spread_s,
    warmup.
    """
    if steps.empty:
        return pd.DataFrame(columns=[*_param_cols(steps), *STEP_TIME_COLUMNS])
    rows = steps[steps["phase"] == "step"]
    keys = [*_param_cols(rows), "step"]
    g = _groupby(rows, keys)
    out = g.agg(
        t_start_ns=("t_start_ns", "min"),
        t_end_ns=("t_end_ns", "max"),
        last_start_ns=("t_start_ns", "max"),
        n_ranks=("rank", "nunique"),
    ).reset_index()
    out["duration_s"] = (out["t_end_ns"] - out["t_start_ns"]) / NS_PER_S
    out["start_spread_s"] = (out["last_start_ns"] - out["t_start_ns"]) / NS_PER_S
    out["warmup"] = out["step"] < warmup_steps
    return out[[*_param_cols(rows), *STEP_TIME_COLUMNS]]


def training_window(step_table: pd.DataFrame) -> tuple[int, int]:
    """``(start_ns, end_ns)`` from the first measured step's start to the last step's end.

    ``step_table`` is the output of :func:`step_times` for one cell. If every step is a
    warm-up step the window covers all steps, so short runs still get a window.
    """
    if step_table.empty:
        raise ValueError("no steps recorded: cannot define the training window")
    measured = step_table[~step_table["warmup"].astype(bool)]
    if measured.empty:
        measured = step_table
    return int(measured["t_start_ns"].min()), int(measured["t_end_ns"].max())


def zoom_window(step_table: pd.DataFrame) -> tuple[int, int]:
    """``(start_ns, end_ns)`` of the step the cell figure and the op timeline zoom into: the
    typical measured step, the one whose duration is closest to the median of the measured
    steps (the latest of those equally close; every step when all are warm-up steps), inside
    :func:`training_window`. Not the last step: it may be the one a stall stretched.

    The throughput table has its rows finer than 1 ms only around this step
    (:func:`~commscope.metrics.counters.throughput_specs`): at 100 µs the whole window is ten
    rows per node and millisecond, and the zoom is the only reader of them. ``step_table`` is
    the output of :func:`step_times` for one cell.
    """
    window = training_window(step_table)
    measured = step_table[~step_table["warmup"].astype(bool)]
    if measured.empty:
        measured = step_table
    measured = measured.sort_values("t_start_ns", kind="stable")
    duration = (measured["t_end_ns"] - measured["t_start_ns"]).astype("float64")
    off = (duration - duration.median()).abs().to_numpy()
    typical = measured.iloc[len(off) - 1 - int(off[::-1].argmin())]  # the latest of the closest
    return max(int(typical["t_start_ns"]), window[0]), min(int(typical["t_end_ns"]), window[1])
