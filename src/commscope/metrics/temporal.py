"""Temporal structure of one cell's traffic (issue 13, item 1; definitions in docs/temporal.md).

From the wire (the cell's counters, cleaned as :mod:`commscope.metrics.counters` cleans them)
and the ops, per node and direction or per rank:

* :func:`onoff_periods`: on/off periods at the link in bins of 100 µs, bursts (maximal runs of
  "on" bins), their durations, sizes, gaps and cadence, and the bursty/streaming class;
* :func:`dispersion_by_width`: mean, peak/mean and index of dispersion (variance / mean of the
  bytes per bin) at 0.1, 1, 10 and 100 ms;
* :func:`periodicity`: the dominant period and the iteration period (the autocorrelation's
  peak near the measured median step time) of the binned bytes, and the correlation of
  consecutive steps' bytes;
* :func:`op_cadence`: the inter-arrival of op issues per rank and the step-to-step similarity
  of its op sequence;
* :func:`bursts_by_timescale`: peak/mean, the share of payload in bursts and the on/off period
  distributions of the payload bytes at 0.1, 1, 10 and 100 ms (docs/analysis.md).

:func:`temporal_tables` returns the five tables by name. Every function takes one cell's
tables; the wire tables cover the training window (the measured steps,
:func:`~commscope.metrics.steps.training_window`), the op table the measured steps.
Inside :func:`~commscope.metrics._common.shared_results` the cleaned counter series and the
per-width statistics the ``shape`` table computed are reused, not recomputed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from commscope.contracts import GROUP_KIND_COLUMN, with_params
from commscope.contracts import TEMPORAL_TABLES as TEMPORAL_TABLES  # this module's, re-exported
from commscope.metrics._common import _param_cols
from commscope.metrics.counter_series import CounterSeries, counter_series
from commscope.metrics.counters import DEFAULT_BIN_MS, bin_width_ns, shape_stats
from commscope.metrics.steps import training_window
from commscope.units import NS_PER_MS, NS_PER_S

# On/off: the bin width (what the in-kernel accounting resolves on MTU frames) and the share of
# the reference rate (the link cap, else the cell's peak) above which a bin is "on". 10 % keeps
# the ACKs a receiver returns (~2-4 % of the data rate it gets) "off", while one MTU frame in a
# 100 µs bin of a 200 Mbit/s link (2,500 B) is already "on".
ON_BIN_MS = 0.1
ON_THRESHOLD = 0.10

# Payload: a frame's headers (Ethernet 14 + IPv4 20 + TCP 20 with the 12 B timestamp option),
# taken off each counted packet, so a pure ACK (66 B on the wire) carries 0 payload bytes. A
# GSO/TSO super-packet counts once, so its payload is overestimated by a few headers: never an ACK.
HEADER_BYTES = 66
# One full frame's payload at a 1500 B MTU (1500 - 20 - 32): the least a bin must carry to be
# "on" in the bursts table, so a bin holding ACKs or a stray header-sized segment is off.
FRAME_PAYLOAD_BYTES = 1448
# One full frame on the wire (with its Ethernet header): a bin shorter than its serialisation
# time at the cap cannot tell a busy link (one frame every 8 x 1514 / cap) from an idle one.
FRAME_WIRE_BYTES = 1514
# Burst timescales (the literature states burstiness per timescale, e.g. "60:1 at 5 ms").
BURST_BIN_MS: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0)
# A bin is part of a burst when it is on and carries more than this many times the mean payload
# per bin at its width: a constant stream has no burst bin, an on/off source of duty d < 0.5 has
# all its bytes in them (its on bins carry 1/d x the mean).
BURST_OVER_MEAN = 2.0

# Periodicity: the autocorrelation and the per-step byte series use 1 ms bins (a 1 % resolution
# on a 100 ms step; 100 µs would make the FFT 10x longer for nothing the period needs).
PERIOD_BIN_MS = 1.0
# Step-to-step correlation of the bytes: 10 ms bins, so a burst that moves by a few ms from one
# step to the next (thread scheduling, the 5 ms GIL switch interval that delays op stamps) still
# falls in the same bin; at 1 ms such steps read as unrelated (docs/temporal.md).
STEP_CORR_BIN_MS = 10.0
# The iteration period is searched between these multiples of the median step time: a step's
# duration varies by far less, and the range holds no multiple of the step.
ITERATION_SEARCH = (0.5, 1.5)

# Bursty vs streaming: a direction streams when its link is on at least half of the 100 µs bins
# and its 10 ms bins vary little: coefficient of variation <= 0.5, i.e. index of dispersion
# <= 0.25 x the mean bytes per bin (an on/off source of duty d has CoV sqrt((1-d)/d): 0.5 is
# d = 0.8). 10 ms averages out frames and ACK clocking, and stays below the step time.
STREAMING_MIN_ON_FRACTION = 0.5
STREAMING_MAX_COV = 0.5
CLASS_BIN_MS = 10.0

# Bins computed per piece, so the temporaries stay small beside a long run's series.
_CHUNK = 1 << 20
_DIRECTIONS = ("tx", "rx")

ONOFF_COLUMNS = [
    "node",
    "iface",
    "direction",
    "bin_ms",
    "n_bins",
    "reference",
    "reference_bps",
    "threshold_bps",
    "on_fraction",
    "n_bursts",
    "burst_ms_median",
    "burst_ms_p90",
    "burst_ms_max",
    "burst_bytes_median",
    "burst_bytes_p90",
    "burst_bytes_max",
    "gap_ms_median",
    "gap_ms_p90",
    "gap_ms_max",
    "burst_interval_ms_median",
    "burst_interval_cov",
    "cov_10ms",
    "pattern",
]

DISPERSION_COLUMNS = [
    "node",
    "iface",
    "direction",
    "bin_ms",
    "n_bins",
    "mean_bytes",
    "peak_bytes",
    "peak_to_mean",
    "dispersion_bytes",
    "cov",
    "resolved",
]

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

OP_CADENCE_COLUMNS = [
    "rank",
    "n_steps",
    "n_ops",
    "ops_per_step_median",
    "issue_interval_ms_median",
    "issue_interval_ms_mean",
    "issue_interval_cov",
    "seq_distinct",
    "seq_len_modal",
    "seq_modal_share",
]

BURST_COLUMNS = [
    "node",
    "iface",
    "direction",
    "bin_ms",
    "n_bins",
    "resolved",
    "payload",
    "mean_bytes",
    "peak_bytes",
    "peak_to_mean",
    "on_fraction",
    "burst_byte_share",
    "n_on_periods",
    "on_ms_median",
    "on_ms_p90",
    "off_ms_median",
    "off_ms_p90",
]

# Each table's columns after the cell parameters, by name (contracts.TEMPORAL_TABLES, in order).
TEMPORAL_COLUMNS: dict[str, list[str]] = dict(
    zip(
        TEMPORAL_TABLES,
        (ONOFF_COLUMNS, DISPERSION_COLUMNS, PERIODICITY_COLUMNS, OP_CADENCE_COLUMNS, BURST_COLUMNS),
        strict=True,
    )
)


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


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


def _has_packets(series: CounterSeries, direction: str) -> bool:
    """Whether the series counts ``direction``'s packets (a table without packet columns, or
    with all of them 0 as a synthetic one, gives bytes only)."""
    try:
        cum = series.cum[f"{direction}_packets"]
    except KeyError:
        return False
    return bool(len(cum) and cum[-1] > 0)


def _payload_bytes(
    series: CounterSeries, direction: str, bin_ns: int, k_first: int, k_last: int
) -> tuple[np.ndarray, bool]:
    """``(payload bytes per bin, whether packets were counted)``: each bin's bytes less
    :data:`HEADER_BYTES` per packet counted in it, at least 0 (a bin of pure ACKs carries
    none); the bytes as they are where the series counts no packets."""
    binned = _binned_bytes(series, f"{direction}_bytes", bin_ns, k_first, k_last)
    if not _has_packets(series, direction):
        return binned, False
    packets = _binned_bytes(series, f"{direction}_packets", bin_ns, k_first, k_last)
    binned -= HEADER_BYTES * packets
    np.maximum(binned, 0.0, out=binned)
    return binned, True


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


# --------------------------------------------------------------------------------------------
# On/off periods and bursts
# --------------------------------------------------------------------------------------------


def _runs(on: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first bin, one past the last bin) of each maximal run of True in ``on``."""
    edges = np.diff(on.astype("int8"), prepend=np.int8(0), append=np.int8(0))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def _pattern(n_bursts: int, on_fraction: float, cov_10ms: float) -> str:
    """The class of one direction's traffic (docs/temporal.md): ``idle`` (no bin on),
    ``streaming``, ``bursty``, or ``unknown`` where an input is undefined."""
    if n_bursts == 0:
        return "idle"
    if np.isnan(on_fraction) or np.isnan(cov_10ms):
        return "unknown"
    if on_fraction >= STREAMING_MIN_ON_FRACTION and cov_10ms <= STREAMING_MAX_COV:
        return "streaming"
    return "bursty"


def _burst_record(
    bytes_per_bin: np.ndarray, bin_ns: int, threshold_bps: float
) -> dict[str, float | int]:
    """On-fraction, bursts, gaps and burst cadence of one binned series."""
    threshold_bytes = threshold_bps * bin_ns / (8 * NS_PER_S)
    on = bytes_per_bin > threshold_bytes
    starts, ends = _runs(on)
    bin_ms = bin_ns / NS_PER_MS
    cumulative = np.concatenate([[0.0], np.cumsum(bytes_per_bin)])
    durations = (ends - starts) * bin_ms
    sizes = cumulative[ends] - cumulative[starts]
    gaps = (starts[1:] - ends[:-1]) * bin_ms
    intervals = np.diff(starts) * bin_ms
    record: dict[str, float | int] = {
        "on_fraction": float(on.mean()) if len(on) else float("nan"),
        "n_bursts": len(starts),
    }
    for name, values in (("burst_ms", durations), ("burst_bytes", sizes), ("gap_ms", gaps)):
        median, p90, peak = _stats(values)
        record |= {f"{name}_median": median, f"{name}_p90": p90, f"{name}_max": peak}
    record["burst_interval_ms_median"] = _stats(intervals)[0]
    record["burst_interval_cov"] = _cov(intervals)
    return record


def onoff_periods(
    counters: pd.DataFrame,
    step_table: pd.DataFrame,
    link_cap_bps: float | None = None,
    bin_ms: float = ON_BIN_MS,
    threshold: float = ON_THRESHOLD,
    params: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """On/off periods and bursts of each node's traffic inside the training window.

    ``counters`` is one cell's counters table, ``step_table`` its
    :func:`~commscope.metrics.steps.step_times`. The bytes per bin of ``bin_ms`` (edges at
    whole multiples of the width, every bin inside the window, as the ``throughput`` and
    ``shape`` tables) come from the cumulative counters; where the series does not resolve
    ``bin_ms`` (a sampler slower than it), the finest coarser width of 1/10/100 ms it resolves
    is used and recorded in ``bin_ms``. A bin is **on** when its payload rate (its bytes less
    :data:`HEADER_BYTES` per packet counted, so pure ACKs add nothing; the bytes where the
    counters count no packets) exceeds
    ``threshold`` x the reference rate: ``link_cap_bps`` (``reference = "cap"``) when the cell
    has a cap, else the cell's peak (``"peak"``: the highest bin rate of any node and
    direction at its width). A **burst** is a maximal run of on bins: its duration (ms), size
    (B, all bytes of its bins) and the **gap** (ms, off bins) to the next; the burst cadence is
    the interval between consecutive burst starts (median in ms and CoV). Bursts cut by the
    window's edges count as they are seen. ``pattern`` is the class of
    :func:`_pattern` with its inputs ``on_fraction`` and ``cov_10ms`` (CoV of the 10 ms bins).

    Columns: cell params, then :data:`ONOFF_COLUMNS`.
    """
    out_params = _params(params, counters, step_table)
    if counters.empty or step_table.empty:
        return _finish(out_params, [], ONOFF_COLUMNS)
    window = training_window(step_table)
    chosen = []
    for node, iface, series in counter_series(counters):
        width = _resolved_width(series, bin_ms)
        k = None if width is None else series.bin_range(0, width[1], *window)
        if width is not None and k is not None:
            chosen.append((node, iface, series, width, k))
    # The cell's peak: from the per-width statistics the shape table computes (shared).
    peaks = [
        shape_stats(series, f"{d}_bytes", width[1], window, True)["peak_bps"]
        for _, _, series, width, _ in chosen
        for d in _DIRECTIONS
    ]
    peak = float(np.nanmax(peaks)) if peaks and not np.all(np.isnan(peaks)) else float("nan")
    reference, reference_bps = ("cap", float(link_cap_bps)) if link_cap_bps else ("peak", peak)
    threshold_bps = threshold * reference_bps
    class_ns = bin_width_ns(CLASS_BIN_MS)
    records = []
    for node, iface, series, (width_ms, width_ns), (k_first, k_last) in chosen:
        for direction in _DIRECTIONS:
            col = f"{direction}_bytes"
            # Payload bytes: a bin of pure ACKs is off even under a tight cap (issue 25 #6).
            binned = _payload_bytes(series, direction, width_ns, k_first, k_last)[0]
            record = _burst_record(binned, width_ns, threshold_bps)
            del binned
            # NaN without traffic (then nothing is on either: idle) or unresolved 10 ms bins.
            resolved = series.resolved(class_ns)
            cov_10ms = float(shape_stats(series, col, class_ns, window, resolved)["cov"])
            records.append(
                {
                    "node": node,
                    "iface": iface,
                    "direction": direction,
                    "bin_ms": width_ms,
                    "n_bins": k_last - k_first,
                    "reference": reference,
                    "reference_bps": reference_bps,
                    "threshold_bps": threshold_bps,
                    **record,
                    "cov_10ms": cov_10ms,
                    "pattern": _pattern(int(record["n_bursts"]), record["on_fraction"], cov_10ms),
                }
            )
    return _finish(out_params, records, ONOFF_COLUMNS)


# --------------------------------------------------------------------------------------------
# Burstiness over timescales
# --------------------------------------------------------------------------------------------


def _periods(on: np.ndarray, bin_ms: float) -> tuple[np.ndarray, np.ndarray]:
    """(durations of the on periods, durations of the off periods between two on periods), ms.
    On periods cut by the window's edges count as seen; off periods before the first and after
    the last on period are left out (their length is the window's, not the traffic's)."""
    starts, ends = _runs(on)
    return (ends - starts) * bin_ms, (starts[1:] - ends[:-1]) * bin_ms


def _timescale_record(
    payload: np.ndarray, width_ms: float, resolved: bool
) -> dict[str, float | int | bool]:
    """One width's burstiness statistics of the payload bytes per bin (NaN where unresolved)."""
    nan = float("nan")
    mean = float(payload.mean()) if len(payload) else nan
    record: dict[str, float | int | bool] = {"n_bins": len(payload), "resolved": resolved}
    record["mean_bytes"] = mean
    if not resolved or not len(payload):
        names = ("peak_bytes", "peak_to_mean", "on_fraction", "burst_byte_share")
        names += ("on_ms_median", "on_ms_p90", "off_ms_median", "off_ms_p90")
        return record | {n: nan for n in names} | {"n_on_periods": 0}
    peak = float(payload.max())
    on = payload >= FRAME_PAYLOAD_BYTES
    burst = on & (payload > BURST_OVER_MEAN * mean)
    total = float(payload.sum())
    on_ms, off_ms = _periods(on, width_ms)
    on_median, on_p90, _ = _stats(on_ms)
    off_median, off_p90, _ = _stats(off_ms)
    return record | {
        "peak_bytes": peak,
        "peak_to_mean": peak / mean if mean > 0 else nan,
        "on_fraction": float(on.mean()),
        "burst_byte_share": float(payload[burst].sum()) / total if total > 0 else nan,
        "n_on_periods": len(on_ms),
        "on_ms_median": on_median,
        "on_ms_p90": on_p90,
        "off_ms_median": off_median,
        "off_ms_p90": off_p90,
    }


def bursts_by_timescale(
    counters: pd.DataFrame,
    step_table: pd.DataFrame,
    link_cap_bps: float | None = None,
    bin_ms_list: Sequence[float] = BURST_BIN_MS,
    params: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """Burstiness of each node's payload at several timescales, inside the training window
    (definitions and reasons: docs/analysis.md *Burstiness over timescales*).

    Per node, direction and width ``bin_ms`` (0.1, 1, 10, 100 ms; bins at whole multiples of
    the width, as the ``shape`` table): the **payload** bytes per bin (the bytes less
    :data:`HEADER_BYTES` per packet counted in the bin, at least 0; ``payload`` false where the
    counters count no packets and the bytes are taken as they are), their mean and peak and
    ``peak_to_mean``. A bin is **on** when it carries at least one full frame's payload
    (:data:`FRAME_PAYLOAD_BYTES`), so pure ACKs never are; ``on_fraction`` is the share of on
    bins; on periods are maximal runs of on bins and off periods the runs of off bins between
    two of them (ms: ``on_ms_median``/``_p90``, ``off_ms_median``/``_p90``, numpy's linear
    percentiles; ``n_on_periods``). A **burst** bin is on and carries more than
    :data:`BURST_OVER_MEAN` x the mean payload per bin; ``burst_byte_share`` is the share of
    the payload in burst bins (0 for a constant stream at every width, 1 for on/off traffic of
    duty under 1/2 at widths below its on period). A width is ``resolved`` when the series
    resolves it and, with a cap, it is at least one full frame's serialisation time at the cap
    (8 x :data:`FRAME_WIRE_BYTES` / ``link_cap_bps``: 0.6 ms at 20 Mbit/s); elsewhere every
    statistic but ``mean_bytes`` is NaN.

    Columns: cell params, then :data:`BURST_COLUMNS`.
    """
    out_params = _params(params, counters, step_table)
    if counters.empty or step_table.empty:
        return _finish(out_params, [], BURST_COLUMNS)
    window = training_window(step_table)
    frame_ns = 8 * FRAME_WIRE_BYTES * NS_PER_S / link_cap_bps if link_cap_bps else 0.0
    records = []
    for node, iface, series in counter_series(counters):
        for width_ms in bin_ms_list:
            width_ns = bin_width_ns(width_ms)
            k = series.bin_range(0, width_ns, *window)
            if k is None:
                continue
            resolved = series.resolved(width_ns) and width_ns >= frame_ns
            for direction in _DIRECTIONS:
                payload, counted = _payload_bytes(series, direction, width_ns, *k)
                record = _timescale_record(payload, float(width_ms), resolved)
                records.append(
                    {
                        "node": node,
                        "iface": iface,
                        "direction": direction,
                        "bin_ms": float(width_ms),
                        "payload": counted,
                        **record,
                    }
                )
    return _finish(out_params, records, BURST_COLUMNS)


# --------------------------------------------------------------------------------------------
# Peak/mean and index of dispersion across bin widths
# --------------------------------------------------------------------------------------------


def dispersion_by_width(
    counters: pd.DataFrame,
    step_table: pd.DataFrame,
    bin_ms_list: Sequence[float] = DEFAULT_BIN_MS,
    params: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """Peak/mean and index of dispersion of the bytes per bin, per node, direction and width,
    inside the training window (the bins of the ``shape`` table, whose statistics are reused
    inside ``shared_results``).

    With ``X`` the bytes in a bin of width ``bin_ms``: ``mean_bytes`` = mean X,
    ``peak_bytes`` = max X, ``peak_to_mean`` = max X / mean X, ``cov`` = std X / mean X
    (population), ``dispersion_bytes`` = var X / mean X (B; = cov^2 x mean X). A constant
    stream has 0 at every width, a Poisson stream of frames of s bytes ~ s, on/off traffic of
    duty d and on-rate R, with bins inside the on and off periods, (1 - d) R x width: the
    index grows with the width up to the period and falls to 0 at widths that are multiples of
    it. Where the width is finer than the source resolves (``resolved`` false) peak, peak/mean,
    cov and dispersion are NaN (:func:`~commscope.metrics.counters.traffic_shape`).

    Columns: cell params, then :data:`DISPERSION_COLUMNS`.
    """
    out_params = _params(params, counters, step_table)
    if counters.empty or step_table.empty:
        return _finish(out_params, [], DISPERSION_COLUMNS)
    window = training_window(step_table)
    records = []
    for node, iface, series in counter_series(counters):
        for width_ms in bin_ms_list:
            width_ns = bin_width_ns(width_ms)
            resolved = series.resolved(width_ns)
            to_bytes = width_ns / (8 * NS_PER_S)
            for direction in _DIRECTIONS:
                stats = shape_stats(series, f"{direction}_bytes", width_ns, window, resolved)
                mean = stats["mean_bps"] * to_bytes
                cov = stats["cov"]
                records.append(
                    {
                        "node": node,
                        "iface": iface,
                        "direction": direction,
                        "bin_ms": float(width_ms),
                        "n_bins": stats["n_bins"],
                        "mean_bytes": mean,
                        "peak_bytes": stats["peak_bps"] * to_bytes,
                        "peak_to_mean": stats["peak_to_mean"],
                        "dispersion_bytes": cov * cov * mean,
                        "cov": cov,
                        "resolved": resolved,
                    }
                )
    return _finish(out_params, records, DISPERSION_COLUMNS)


# --------------------------------------------------------------------------------------------
# Periodicity
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Cadence and step-to-step similarity of the ops
# --------------------------------------------------------------------------------------------


def _codes(column: pd.Series) -> np.ndarray:
    """Integer codes of ``column``'s values (nulls one code of their own); a column of lists
    (``group_ranks`` as a parquet list) by their text."""
    if column.dtype == object and column.notna().any():
        first = column.dropna().iloc[0]
        if not isinstance(first, str):
            column = column.map(lambda v: None if v is None else ",".join(str(int(r)) for r in v))
    return pd.factorize(column, use_na_sentinel=False)[0].astype("uint64")


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on uint64 (wrapping): nearby inputs give unrelated hashes."""
    x = x.copy()
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _op_identity(ops: pd.DataFrame) -> np.ndarray:
    """A 64-bit hash of each op's (op, bytes, group): ``group_kind`` when recorded and
    ``group_ranks``, else the process-group name."""
    group = "group_ranks" if "group_ranks" in ops.columns else "group"
    sizes = ops["bytes"].to_numpy(dtype="int64", na_value=-1).astype("uint64")
    parts = [_codes(ops["op"]), sizes]
    if group in ops.columns:
        parts.append(_codes(ops[group]))
    if GROUP_KIND_COLUMN in ops.columns:
        parts.append(_codes(ops[GROUP_KIND_COLUMN]))
    h = np.zeros(len(ops), dtype="uint64")
    with np.errstate(over="ignore"):
        for i, part in enumerate(parts):
            h = _mix(h ^ _mix(part + np.uint64(i + 1)))
    return h


def _sorted_by(*keys: np.ndarray) -> np.ndarray | None:
    """The permutation sorting rows by ``keys`` (first the primary key), or None when they
    are sorted already (the usual case; a sort of 10**7 rows costs seconds)."""
    different = np.zeros(len(keys[0]) - 1, dtype=bool) if len(keys[0]) else np.zeros(0, bool)
    for key in keys:
        step = np.sign(np.diff(key))
        # Rows still tied on the earlier keys compare on this one.
        if bool(np.any(step[~different] < 0)):
            return np.lexsort(keys[::-1])
        different |= step != 0
    return None


def _sequence_hashes(
    rank: np.ndarray, step: np.ndarray, identity: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(rank, step, length, hash)`` per (rank, step) run of the ops (sorted by rank, step and
    issue order): the number of its ops and a 64-bit hash of the sequence of their identities,
    the wrapping sum of each identity mixed with its position (order matters; two different
    sequences collide with probability ~2**-64)."""
    n = len(rank)
    new = np.ones(n, dtype=bool)
    new[1:] = (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])
    starts = np.flatnonzero(new)
    lengths = np.diff(np.append(starts, n))
    position = (np.arange(n) - np.repeat(starts, lengths)).astype("uint64")
    with np.errstate(over="ignore"):
        hashed = _mix(identity ^ _mix(position + np.uint64(0x9E3779B97F4A7C15)))
        sums = np.add.reduceat(hashed, starts) if n else hashed
    return rank[starts], step[starts], lengths, sums


def op_cadence(
    ops: pd.DataFrame,
    step_table: pd.DataFrame,
    params: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """Cadence of op issues and step-to-step similarity of the op sequence, per rank, over the
    measured steps.

    ``issue_interval_ms_*``: the intervals between consecutive ``t_issue_ns`` of the rank's
    ops of measured steps, in time order (ms; median, mean; ``issue_interval_cov`` =
    population standard deviation / mean). ``ops_per_step_median``: ops per measured step.
    The op sequence of a step is the list of (op, bytes, group) of the rank's ops in issue
    order (ties by ``seq``), group being ``group_kind`` when recorded and ``group_ranks``; the
    modal sequence is the most frequent over the measured steps (a step without ops has the
    empty one): ``seq_modal_share`` = steps whose sequence equals it / ``n_steps``,
    ``seq_distinct`` the number of different sequences, ``seq_len_modal`` its length. Ops
    without ``t_issue_ns`` are left out of both.

    Columns: cell params, then :data:`OP_CADENCE_COLUMNS`.
    """
    out_params = _params(params, ops, step_table)
    if ops.empty or step_table.empty:
        return _finish(out_params, [], OP_CADENCE_COLUMNS)
    measured_steps = np.unique(_measured(step_table)["step"].to_numpy(dtype="int64"))
    n_steps = len(measured_steps)
    all_ranks = np.unique(ops["rank"].to_numpy(dtype="int64"))
    # An op without an issue time (an imported trace's) has no place in a sequence or cadence.
    issued = ops["t_issue_ns"].notna().to_numpy()
    keep = issued & np.isin(ops["step"].to_numpy(dtype="int64"), measured_steps)
    rank = ops["rank"].to_numpy(dtype="int64")[keep]
    step = ops["step"].to_numpy(dtype="int64")[keep]
    issue = ops["t_issue_ns"].to_numpy(dtype="int64", na_value=0)[keep]
    seq = ops["seq"].to_numpy(dtype="int64")[keep] if "seq" in ops.columns else np.zeros_like(rank)
    identity = _op_identity(ops)[keep]
    order = _sorted_by(rank, step, issue, seq)
    if order is not None:
        rank, step, issue, identity = rank[order], step[order], issue[order], identity[order]
    seq_rank, _, seq_length, seq_hash = _sequence_hashes(rank, step, identity)
    # The intervals in time order per rank (steps overlapping in time would not be).
    order = _sorted_by(rank, issue)
    if order is not None:
        rank, issue = rank[order], issue[order]
    same_rank = rank[1:] == rank[:-1]
    gaps_ms = np.diff(issue)[same_rank].astype("float64") / NS_PER_MS
    gap_rank = rank[1:][same_rank]
    records = []
    for r in all_ranks:
        gaps = gaps_ms[gap_rank == r]
        mine = seq_rank == r
        # Steps where the rank issued nothing have the empty sequence (hash 0, length 0).
        empty_steps = max(n_steps - int(mine.sum()), 0)
        lengths = np.concatenate([seq_length[mine], np.zeros(empty_steps, dtype="int64")])
        hashes = np.concatenate([seq_hash[mine], np.zeros(empty_steps, dtype="uint64")])
        counts = pd.DataFrame({"hash": hashes, "length": lengths}).value_counts(sort=True)
        records.append(
            {
                "rank": int(r),
                "n_steps": n_steps,
                "n_ops": int(seq_length[mine].sum()),
                "ops_per_step_median": float(np.median(lengths)) if n_steps else float("nan"),
                "issue_interval_ms_median": _stats(gaps)[0],
                "issue_interval_ms_mean": float(gaps.mean()) if len(gaps) else float("nan"),
                "issue_interval_cov": _cov(gaps),
                "seq_distinct": len(counts),
                "seq_len_modal": int(counts.index[0][1]) if len(counts) else 0,
                "seq_modal_share": float(counts.iloc[0]) / n_steps if n_steps else float("nan"),
            }
        )
    return _finish(out_params, records, OP_CADENCE_COLUMNS)


# --------------------------------------------------------------------------------------------
# All of them
# --------------------------------------------------------------------------------------------


def temporal_tables(
    counters: pd.DataFrame,
    ops: pd.DataFrame,
    step_table: pd.DataFrame,
    link_cap_bps: float | None = None,
    params: Mapping[str, Any] | None = None,
) -> dict[str, pd.DataFrame]:
    """The cell's temporal tables by name (:data:`TEMPORAL_TABLES`): ``temporal_onoff``
    (:func:`onoff_periods`), ``temporal_dispersion`` (:func:`dispersion_by_width`),
    ``temporal_periodicity`` (:func:`periodicity`), ``temporal_ops`` (:func:`op_cadence`) and
    ``temporal_bursts`` (:func:`bursts_by_timescale`), each with the defaults documented there.

    ``counters``, ``ops``: one cell's tables; ``step_table``: its
    :func:`~commscope.metrics.steps.step_times`; ``link_cap_bps``: cell.json ``bw_bps`` (None
    without a cap); ``params``: the cell parameters that lead every row (by default those of
    the first table that has them).
    """
    out_params = _params(params, counters, ops, step_table)
    return {
        "temporal_onoff": onoff_periods(counters, step_table, link_cap_bps, params=out_params),
        "temporal_dispersion": dispersion_by_width(counters, step_table, params=out_params),
        "temporal_periodicity": periodicity(counters, step_table, params=out_params),
        "temporal_ops": op_cadence(ops, step_table, params=out_params),
        "temporal_bursts": bursts_by_timescale(
            counters, step_table, link_cap_bps, params=out_params
        ),
    }


__all__ = [
    "BURST_BIN_MS",
    "BURST_COLUMNS",
    "BURST_OVER_MEAN",
    "CLASS_BIN_MS",
    "DISPERSION_COLUMNS",
    "FRAME_PAYLOAD_BYTES",
    "FRAME_WIRE_BYTES",
    "HEADER_BYTES",
    "ITERATION_SEARCH",
    "ONOFF_COLUMNS",
    "ON_BIN_MS",
    "ON_THRESHOLD",
    "OP_CADENCE_COLUMNS",
    "PERIOD_BIN_MS",
    "PERIODICITY_COLUMNS",
    "STEP_CORR_BIN_MS",
    "STREAMING_MAX_COV",
    "STREAMING_MIN_ON_FRACTION",
    "TEMPORAL_COLUMNS",
    "TEMPORAL_TABLES",
    "bursts_by_timescale",
    "dispersion_by_width",
    "onoff_periods",
    "op_cadence",
    "periodicity",
    "temporal_tables",
]
