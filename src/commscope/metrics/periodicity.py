"""Periodicity of one cell's wire traffic (issue 13, item 1; definitions in docs/temporal.md).

:func:`periodicity`: per node and direction, the dominant period and the iteration period (the
autocorrelation's peak near the measured median step time) of the binned bytes over the
training window (:func:`~commscope.metrics.steps.training_window`), and the correlation of
consecutive measured steps' bytes. One of the tables of
:func:`~commscope.metrics.temporal.temporal_tables`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from commscope.metrics._temporal_common import (
    _DIRECTIONS,
    _binned_bytes,
    _finish,
    _measured,
    _params,
    _resolved_width,
)
from commscope.metrics.counter_series import counter_series
from commscope.metrics.steps import training_window
from commscope.units import NS_PER_MS

# The autocorrelation and the per-step byte series use 1 ms bins (a 1 % resolution
# on a 100 ms step; 100 µs would make the FFT 10x longer for nothing the period needs).
PERIOD_BIN_MS = 1.0
# Step-to-step correlation of the bytes: 10 ms bins, so a burst that moves by a few ms from one
# step to the next (thread scheduling, the 5 ms GIL switch interval that delays op stamps) still
# falls in the same bin; at 1 ms such steps read as unrelated (docs/temporal.md).
STEP_CORR_BIN_MS = 10.0
# The iteration period is searched between these multiples of the median step time: a step's
# duration varies by far less, and the range holds no multiple of the step.
ITERATION_SEARCH = (0.5, 1.5)

PERIODICITY_COLUMNS = [
    "node",
    "iface",
    "direction",
    "bin_ms",
    "n_bins",
    "acf_period_ms",
    "acf_peak",
    "step_ms_median",
    "iteration_period_ms",
    "iteration_acf",
    "period_over_step",
    "step_bin_ms",
    "n_step_pairs",
    "step_corr_median",
    "step_corr_min",
]


def _autocorrelation(x: np.ndarray) -> np.ndarray:
    """The biased autocorrelation of ``x`` (mean removed, divided by n at every lag, so
    r(0) = 1), lags 0..n-1, by FFT; zeros when ``x`` is constant."""
    n = len(x)
    centred = x - x.mean()
    size = 1 << int(2 * n - 1).bit_length()
    spectrum = np.fft.rfft(centred, size)
    acov = np.fft.irfft(spectrum.real**2 + spectrum.imag**2, size)[:n]
    return acov / acov[0] if acov[0] > 0 else np.zeros(n)


def _acf_peak(acf: np.ndarray, lo: int, hi: int) -> tuple[float, float]:
    """``(lag in bins, acf there)`` of the highest autocorrelation at lags ``lo..hi``, the
    lag refined by a parabola through the peak and its neighbours; NaN when the range is
    empty or the peak is not positive."""
    lo, hi = max(lo, 1), min(hi, len(acf) - 1)
    if hi < lo:
        return float("nan"), float("nan")
    k = lo + int(np.argmax(acf[lo : hi + 1]))
    peak = float(acf[k])
    if peak <= 0:
        return float("nan"), float("nan")
    shift = 0.0
    if k < len(acf) - 1:
        left, right = float(acf[k - 1]), float(acf[k + 1])
        curve = left - 2 * peak + right
        if curve < 0:
            shift = 0.5 * (left - right) / curve
    return k + shift, peak


def _acf_period(acf: np.ndarray) -> tuple[float, float]:
    """``(period in bins, acf there)``: the dominant period, the highest autocorrelation at a
    lag between its first non-positive value and half the series (two periods at least);
    NaN where the acf never dips. The biased estimate falls with the lag, so a fundamental
    beats its multiples."""
    half = len(acf) // 2
    dips = np.flatnonzero(acf[1 : half + 1] <= 0)
    if len(dips) == 0:
        return float("nan"), float("nan")
    return _acf_peak(acf, int(dips[0]) + 1, half)


def _iteration_period(acf: np.ndarray, step_bins: float) -> tuple[float, float]:
    """``(period in bins, acf there)``: the highest autocorrelation at a lag within
    :data:`ITERATION_SEARCH` of the median step (``step_bins``, in bins) and at most half
    the series: the iteration period even where a shorter one (ops inside a step) dominates."""
    if not np.isfinite(step_bins) or step_bins <= 0:
        return float("nan"), float("nan")
    low, high = ITERATION_SEARCH
    lo, hi = int(np.ceil(low * step_bins)), int(np.floor(high * step_bins))
    return _acf_peak(acf, lo, min(hi, len(acf) // 2))


def _step_correlations(
    binned: np.ndarray, k_first: int, bin_ns: int, steps: pd.DataFrame
) -> np.ndarray:
    """Pearson correlation of the bytes per bin of consecutive measured steps, each step's
    series starting at the bin holding its start and as long as the shortest step (whole
    bins); NaN for a pair where either series is constant."""
    starts = steps["t_start_ns"].to_numpy(dtype="int64") // bin_ns - k_first
    durations = steps["t_end_ns"].to_numpy(dtype="int64") - steps["t_start_ns"].to_numpy(
        dtype="int64"
    )
    length = int(durations.min() // bin_ns) if len(durations) else 0
    inside = (starts >= 0) & (starts + length <= len(binned))
    starts = starts[inside]
    if length < 2 or len(starts) < 2:
        return np.empty(0)
    matrix = binned[starts[:, None] + np.arange(length)]
    matrix = matrix - matrix.mean(axis=1, keepdims=True)
    norms = np.sqrt((matrix * matrix).sum(axis=1))
    products = (matrix[:-1] * matrix[1:]).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return products / (norms[:-1] * norms[1:])


def periodicity(
    counters: pd.DataFrame,
    step_table: pd.DataFrame,
    bin_ms: float = PERIOD_BIN_MS,
    step_bin_ms: float = STEP_CORR_BIN_MS,
    params: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """The iteration period of each node's traffic and how alike its steps are.

    The bytes per bin of ``bin_ms`` (1 ms; a coarser width where the source does not resolve
    it) inside the training window give the biased autocorrelation r(k) (:func:`_autocorrelation`).
    ``acf_period_ms`` is the dominant period: the lag of its highest value between its first
    non-positive value and half the window (:func:`_acf_period`, parabola-refined),
    ``acf_peak`` r there; it can be shorter than a step where ops inside a step repeat (a ring's
    chunks, a pipeline's micro-batches). ``iteration_period_ms`` is the lag of the highest r
    within 0.5-1.5x ``step_ms_median`` (the median duration of the measured steps;
    :func:`_iteration_period`), ``iteration_acf`` r there, ``period_over_step`` =
    ``iteration_period_ms / step_ms_median`` (1 when the traffic repeats with the steps). Step to
    step similarity of the bytes: the Pearson correlation of the bytes per bin of
    ``step_bin_ms`` (10 ms, or the finest coarser width the source resolves) of consecutive
    measured steps, each from the bin of its start and as long as the shortest step
    (:func:`_step_correlations`): ``step_corr_median`` and ``step_corr_min`` over the
    ``n_step_pairs`` pairs (NaN for a pair with a constant series; none when the shortest step
    holds fewer than two bins).

    Columns: cell params, then :data:`PERIODICITY_COLUMNS`.
    """
    out_params = _params(params, counters, step_table)
    if counters.empty or step_table.empty:
        return _finish(out_params, [], PERIODICITY_COLUMNS)
    window = training_window(step_table)
    steps = _measured(step_table).sort_values("t_start_ns", kind="stable")
    durations_ms = (steps["t_end_ns"] - steps["t_start_ns"]).to_numpy(dtype="float64") / NS_PER_MS
    step_ms = float(np.median(durations_ms)) if len(durations_ms) else float("nan")
    records = []
    for node, iface, series in counter_series(counters):
        width = _resolved_width(series, bin_ms)
        k = None if width is None else series.bin_range(0, width[1], *window)
        if width is None or k is None:
            continue
        width_ms, width_ns = width
        step_width = _resolved_width(series, step_bin_ms) or width
        step_k = series.bin_range(0, step_width[1], *window)
        for direction in _DIRECTIONS:
            col = f"{direction}_bytes"
            binned = _binned_bytes(series, col, width_ns, *k)
            acf = _autocorrelation(binned)
            period_bins, peak = _acf_period(acf)
            iteration_bins, iteration_acf = _iteration_period(acf, step_ms / width_ms)
            iteration_ms = iteration_bins * width_ms
            corr = np.empty(0)
            if step_k is not None:
                per_step = _binned_bytes(series, col, step_width[1], *step_k)
                corr = _step_correlations(per_step, step_k[0], step_width[1], steps)
            finite = corr[np.isfinite(corr)]
            records.append(
                {
                    "node": node,
                    "iface": iface,
                    "direction": direction,
                    "bin_ms": width_ms,
                    "n_bins": len(binned),
                    "acf_period_ms": period_bins * width_ms,
                    "acf_peak": peak,
                    "step_ms_median": step_ms,
                    "iteration_period_ms": iteration_ms,
                    "iteration_acf": iteration_acf,
                    "period_over_step": iteration_ms / step_ms if step_ms > 0 else float("nan"),
                    "step_bin_ms": step_width[0],
                    "n_step_pairs": len(corr),
                    "step_corr_median": float(np.median(finite)) if len(finite) else float("nan"),
                    "step_corr_min": float(finite.min()) if len(finite) else float("nan"),
                }
            )
    return _finish(out_params, records, PERIODICITY_COLUMNS)


__all__ = [
    "ITERATION_SEARCH",
    "PERIOD_BIN_MS",
    "PERIODICITY_COLUMNS",
    "STEP_CORR_BIN_MS",
    "periodicity",
]
