"""Helpers shared by the temporal tables' modules (:mod:`commscope.metrics.temporal`,
:mod:`commscope.metrics.periodicity`, :mod:`commscope.metrics.cadence`): the cell parameters
leading each table, the measured steps, the wire's bytes per bin and the summary statistics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from commscope.contracts import with_params
from commscope.metrics._common import _param_cols
from commscope.metrics.counter_series import CounterSeries
from commscope.metrics.counters import DEFAULT_BIN_MS, bin_width_ns

# Bins computed per piece, so the temporaries stay small beside a long run's series.
_CHUNK = 1 << 20
_DIRECTIONS = ("tx", "rx")


def _params(params: Mapping[str, Any] | None, *frames: pd.DataFrame) -> dict[str, Any]:
    """``params`` when given, else the parameter columns of the first non-empty frame."""
    if params is not None:
        return dict(params)
    for df in frames:
        if not df.empty and _param_cols(df):
            return {c: df[c].iloc[0] for c in _param_cols(df)}
    return {}


def _finish(
    params: dict[str, Any], records: list[dict[str, Any]], columns: list[str]
) -> pd.DataFrame:
    """The records as a frame led by the cell parameters; the documented columns when empty."""
    if not records:
        return pd.DataFrame(columns=[*params, *columns])
    return with_params(params, pd.DataFrame(records, columns=columns))


def _measured(step_table: pd.DataFrame) -> pd.DataFrame:
    """The measured (non warm-up) steps of :func:`~commscope.metrics.steps.step_times`, or all
    of them when every step is a warm-up step (as :func:`training_window` does)."""
    if step_table.empty:
        return step_table
    measured = step_table[~step_table["warmup"].astype(bool)]
    return step_table if measured.empty else measured


def _binned_bytes(
    series: CounterSeries, col: str, bin_ns: int, k_first: int, k_last: int
) -> np.ndarray:
    """Bytes of ``col`` in each bin ``[k*bin, (k+1)*bin)`` for k from ``k_first`` to
    ``k_last`` (exclusive): the cumulative counter interpolated at the edges and differenced,
    like :meth:`CounterSeries.rates` but in bytes, exact for an in-kernel series (edges
    relative to the first sample are whole numbers below 2**53, exact in float64)."""
    n = k_last - k_first
    out = np.empty(n, dtype="float64")
    t_rel = (series.t_ns - series.t_ns[0]).astype("float64")
    cum = series.cum[col]
    first = k_first * bin_ns - int(series.t_ns[0])
    for a in range(0, n, _CHUNK):
        b = min(a + _CHUNK, n)
        edges = np.arange(a, b + 1, dtype="float64")
        edges *= bin_ns
        edges += first
        at = np.interp(edges, t_rel, cum)
        np.subtract(at[1:], at[:-1], out=out[a:b])
    return out


def _resolved_width(series: CounterSeries, bin_ms: float) -> tuple[float, int] | None:
    """``(bin_ms, bin_ns)``: ``bin_ms`` when the series resolves it, else the finest coarser
    width of :data:`DEFAULT_BIN_MS` it resolves (a 1 kHz sampler: 1 ms); None if none."""
    for width in sorted({float(bin_ms), *(b for b in DEFAULT_BIN_MS if b > bin_ms)}):
        ns = bin_width_ns(width)
        if series.resolved(ns):
            return width, ns
    return None


def _stats(values: np.ndarray) -> tuple[float, float, float]:
    """(median, p90, max) of ``values`` (numpy's linear interpolation); NaN when empty."""
    if len(values) == 0:
        return (float("nan"),) * 3
    median, p90 = np.percentile(values, [50, 90])
    return float(median), float(p90), float(values.max())


def _cov(values: np.ndarray) -> float:
    """Population standard deviation / mean; NaN when empty or the mean is 0."""
    if len(values) == 0:
        return float("nan")
    mean = float(values.mean())
    return float(values.std(ddof=0)) / mean if mean > 0 else float("nan")
