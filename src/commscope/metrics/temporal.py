"""Temporal structure of one cell's traffic (issue 13, item 1; definitions in docs/temporal.md).

From the wire (the cell's counters, cleaned as :mod:`commscope.metrics.counters` cleans them),
per node and direction:

* :func:`onoff_periods`: on/off periods at the link in bins of 100 µs, bursts (maximal runs of
  "on" bins), their durations, sizes, gaps and cadence, and the bursty/streaming class;
* :func:`dispersion_by_width`: mean, peak/mean and index of dispersion (variance / mean of the
  bytes per bin) at 0.1, 1, 10 and 100 ms;
* :func:`bursts_by_timescale`: peak/mean, the share of payload in bursts and the on/off period
  distributions of the payload bytes at 0.1, 1, 10 and 100 ms (docs/analysis.md).

The wire's periodicity (:func:`~commscope.metrics.periodicity.periodicity`) and the ops'
cadence (:func:`~commscope.metrics.cadence.op_cadence`) live in their own modules;
:func:`temporal_tables` returns all five tables by name. Every function takes one cell's
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

from commscope.contracts import TEMPORAL_TABLES as TEMPORAL_TABLES  # this module's, re-exported
from commscope.metrics._temporal_common import (
    _DIRECTIONS,
    _binned_bytes,
    _cov,
    _finish,
    _params,
    _resolved_width,
    _stats,
)
from commscope.metrics.cadence import OP_CADENCE_COLUMNS, op_cadence
from commscope.metrics.counter_series import CounterSeries, counter_series
from commscope.metrics.counters import DEFAULT_BIN_MS, bin_width_ns, shape_stats
from commscope.metrics.periodicity import PERIODICITY_COLUMNS, periodicity
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

# Bursty vs streaming: a direction streams when its link is on at least half of the 100 µs bins
# and its 10 ms bins vary little: coefficient of variation <= 0.5, i.e. index of dispersion
# <= 0.25 x the mean bytes per bin (an on/off source of duty d has CoV sqrt((1-d)/d): 0.5 is
# d = 0.8). 10 ms averages out frames and ACK clocking, and stays below the step time.
STREAMING_MIN_ON_FRACTION = 0.5
STREAMING_MAX_COV = 0.5
CLASS_BIN_MS = 10.0

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
# Payload bytes
# --------------------------------------------------------------------------------------------


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
    "ONOFF_COLUMNS",
    "ON_BIN_MS",
    "ON_THRESHOLD",
    "STREAMING_MAX_COV",
    "STREAMING_MIN_ON_FRACTION",
    "TEMPORAL_COLUMNS",
    "TEMPORAL_TABLES",
    "bursts_by_timescale",
    "dispersion_by_width",
    "onoff_periods",
    "temporal_tables",
]
