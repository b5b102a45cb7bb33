"""System-level traffic from the interface counters: throughput in fixed bins, burstiness
(traffic shape), and bytes and packets over a window."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from commscope.contracts import with_params
from commscope.metrics._common import (
    _concat,
    _param_cols,
    _per_cell,
)
from commscope.units import NS_PER_MS, NS_PER_S

DEFAULT_BIN_MS: tuple[int, ...] = (1, 10, 100)

# A bin counts as resolved when the median sampling interval is at most this factor times the
# bin width: a sampler aiming at exactly the bin width jitters by a few percent around it.
RESOLUTION_SLACK = 1.05


@dataclass
class _CounterSeries:
    """One interface's cumulative counters, cleaned: sorted, unique times, never decreasing."""

    t_ns: np.ndarray  # int64
    cum: dict[str, np.ndarray]  # float64 bytes since the first sample
    sample_interval_ns: float  # median spacing of samples

    @classmethod
    def from_frame(cls, df: pd.DataFrame, columns: Sequence[str]) -> _CounterSeries:
        df = df.sort_values("t_ns", kind="stable").drop_duplicates("t_ns", keep="last")
        t = df["t_ns"].to_numpy(dtype="int64")
        cum = {}
        for col in columns:
            v = df[col].to_numpy(dtype="float64")
            # A counter that goes down was reset (interface recreated) or wrapped: the bytes
            # sent across that instant are unknown, so count that interval as 0 rather than
            # letting it become a huge negative rate.
            d = np.clip(np.diff(v), 0.0, None)
            cum[col] = np.concatenate([[0.0], np.cumsum(d)])
        interval = float(np.median(np.diff(t))) if len(t) > 1 else math.inf
        return cls(t_ns=t, cum=cum, sample_interval_ns=interval)

    def at(self, col: str, when_ns: np.ndarray) -> np.ndarray:
        """Cumulative bytes at arbitrary instants, linearly interpolated between samples.

        Outside the sampled span the counter is held at its first/last value, i.e. nothing is
        assumed to have been sent where nothing was observed.
        """
        # Work relative to the first sample: absolute ns (~1.7e18) in float64 would lose
        # ~256 ns of precision, relative ns are exact for 104 days.
        ref = self.t_ns[0]
        return np.interp(
            (np.asarray(when_ns, dtype="int64") - ref).astype("float64"),
            (self.t_ns - ref).astype("float64"),
            self.cum[col],
        )

    def straddle(self, col: str, when_ns: int) -> float:
        """Bytes counted over the sample interval that contains ``when_ns`` (0 when a sample
        falls on it or it lies outside the sampled span): how far an interpolated value at
        that instant can be off, since the counter may have moved anywhere inside it."""
        i = int(np.searchsorted(self.t_ns, when_ns, side="left"))
        if i == 0 or i >= len(self.t_ns) or self.t_ns[i] == when_ns:
            return 0.0
        return float(self.cum[col][i] - self.cum[col][i - 1])

    def bins(
        self, origin_ns: int, bin_ns: int, start_ns: int | None = None, end_ns: int | None = None
    ) -> np.ndarray:
        """Bin edges ``origin + k*bin`` of every bin fully inside the sampled span (and inside
        ``[start_ns, end_ns]`` when given). Returns int64 edges; fewer than 2 means no bin."""
        lo = int(self.t_ns[0]) if start_ns is None else max(int(self.t_ns[0]), start_ns)
        hi = int(self.t_ns[-1]) if end_ns is None else min(int(self.t_ns[-1]), end_ns)
        if hi <= lo:
            return np.empty(0, dtype="int64")
        k_first = -((origin_ns - lo) // bin_ns)  # ceil((lo - origin) / bin) in integers
        k_last = (hi - origin_ns) // bin_ns
        if k_last <= k_first:
            return np.empty(0, dtype="int64")
        return origin_ns + np.arange(k_first, k_last + 1, dtype="int64") * bin_ns


_COUNTER_BYTES = ("tx_bytes", "rx_bytes")


def _counter_series(counters: pd.DataFrame) -> Iterator[tuple[int, str, _CounterSeries]]:
    """Cleaned counter series per (node, iface) of one cell."""
    iface_key = "iface" if "iface" in counters.columns else None
    keys = ["node", iface_key] if iface_key else ["node"]
    for key, sub in counters.groupby(keys, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        node = int(key[0])
        iface = str(key[1]) if iface_key else ""
        yield node, iface, _CounterSeries.from_frame(sub, _COUNTER_BYTES)


def _resolved(series: _CounterSeries, bin_ns: int) -> bool:
    return series.sample_interval_ns <= bin_ns * RESOLUTION_SLACK


THROUGHPUT_COLUMNS = [
    "node",
    "iface",
    "bin_ms",
    "t_start_ns",
    "tx_bps",
    "rx_bps",
    "resolved",
]


def throughput(counters: pd.DataFrame, bin_ms: float, origin_ns: int = 0) -> pd.DataFrame:
    """Per-node tx/rx throughput in fixed bins of ``bin_ms`` milliseconds.

    The counters are cumulative and sampled at irregular instants (a sampler thread wakes up
    late now and then). Rather than assigning each sample's delta to the bin it lands in,
    which would put a late sample's bytes into the wrong bin and make rates jump, the
    cumulative counter is linearly interpolated onto the bin edges and differenced: bytes in a
    bin = counter(edge_right) - counter(edge_left). This is exact for traffic that is steady
    between samples, conserves bytes, and cannot go negative because decreasing counter steps
    (resets) are clamped to zero first. Only bins fully covered by samples are emitted.

    Bin edges are ``origin_ns + k * bin`` (default origin 0: edges at whole multiples of the
    bin width on the shared clock), so all nodes, cells and nested widths (1/10/100 ms) share
    edges and can be compared bin by bin. ``resolved`` is false when the
    median sampling interval is longer than the bin: such bins only show a smeared average.

    Columns: cell params, node, iface, bin_ms, t_start_ns, tx_bps, rx_bps, resolved.
    """
    bin_ns = int(round(bin_ms * NS_PER_MS))
    if bin_ns <= 0:
        raise ValueError(f"bin_ms must be positive, got {bin_ms}")
    frames = []
    for params, cell_counters in _per_cell(counters):
        for node, iface, series in _counter_series(cell_counters):
            edges = series.bins(int(origin_ns), bin_ns)
            if len(edges) < 2:
                continue
            out = pd.DataFrame(
                {
                    "node": node,
                    "iface": iface,
                    "bin_ms": bin_ms,
                    "t_start_ns": edges[:-1],
                }
            )
            for col in _COUNTER_BYTES:
                # Bytes per bin are tx_bps * bin_ms / 8000; not stored twice (this is the
                # largest table: one row per node and millisecond).
                moved = np.diff(series.at(col, edges))
                out[col.replace("_bytes", "_bps")] = moved * 8 * NS_PER_S / bin_ns
            out["resolved"] = _resolved(series, bin_ns)
            frames.append(with_params(params, out[THROUGHPUT_COLUMNS]))
    return _concat(frames, [*_param_cols(counters), *THROUGHPUT_COLUMNS])


SHAPE_COLUMNS = [
    "node",
    "iface",
    "direction",
    "bin_ms",
    "n_bins",
    "mean_bps",
    "peak_bps",
    "peak_to_mean",
    "cov",
    "sample_interval_ms",
    "resolved",
]


def traffic_shape(
    counters: pd.DataFrame,
    window: tuple[int, int],
    bin_ms_list: Sequence[float] = DEFAULT_BIN_MS,
) -> pd.DataFrame:
    """Burstiness of each node's traffic inside the training ``window`` at several bin widths.

    For each node, direction (tx/rx) and bin width, the binned rate series (see
    :func:`throughput`, bins aligned to the window start, only bins fully inside the window)
    gives ``mean_bps``, ``peak_bps``, ``peak_to_mean`` = peak/mean and ``cov`` = population
    standard deviation / mean of the binned rate. A constant-rate stream has peak_to_mean 1 and
    cov 0 at every width; on/off traffic with duty cycle d (bins aligned to the on/off periods)
    has peak_to_mean 1/d and cov sqrt((1-d)/d).

    When the bin is finer than the median sampling interval (``resolved`` false) the rate
    inside a sampling interval is unknown, and interpolation would report a flat, fake-calm
    series: ``peak_bps``, ``peak_to_mean`` and ``cov`` are NaN. ``mean_bps`` is still given,
    as the average rate does not depend on resolution. ``window`` is ``(start_ns, end_ns)``,
    e.g. from :func:`training_window`; ``counters`` must hold a single cell.

    Columns: cell params, node, iface, direction, bin_ms, n_bins, mean_bps, peak_bps,
    peak_to_mean, cov, sample_interval_ms, resolved.
    """
    start_ns, end_ns = int(window[0]), int(window[1])
    rows: list[pd.DataFrame] = []
    for params, cell_counters in _per_cell(counters):
        records = []
        for node, iface, series in _counter_series(cell_counters):
            for bin_ms in bin_ms_list:
                bin_ns = int(round(bin_ms * NS_PER_MS))
                edges = series.bins(start_ns, bin_ns, start_ns, end_ns)
                resolved = _resolved(series, bin_ns)
                for direction in ("tx", "rx"):
                    records.append(
                        {
                            "node": node,
                            "iface": iface,
                            "direction": direction,
                            "bin_ms": bin_ms,
                            **_shape_stats(series, f"{direction}_bytes", edges, resolved),
                            "sample_interval_ms": series.sample_interval_ns / NS_PER_MS,
                            "resolved": resolved,
                        }
                    )
        if records:
            rows.append(with_params(params, pd.DataFrame(records)))
    return _concat(rows, [*_param_cols(counters), *SHAPE_COLUMNS])


def _shape_stats(
    series: _CounterSeries, col: str, edges: np.ndarray, resolved: bool
) -> dict[str, float]:
    nan = float("nan")
    if len(edges) < 2:
        return {
            "n_bins": 0,
            "mean_bps": nan,
            "peak_bps": nan,
            "peak_to_mean": nan,
            "cov": nan,
        }
    rate = np.diff(series.at(col, edges)) * 8 * NS_PER_S / np.diff(edges)
    mean = float(rate.mean())
    peak, ratio, cov = nan, nan, nan
    if resolved:
        peak = float(rate.max())
        if mean > 0:
            ratio = peak / mean
            cov = float(rate.std(ddof=0)) / mean
    return {
        "n_bins": len(rate),
        "mean_bps": mean,
        "peak_bps": peak,
        "peak_to_mean": ratio,
        "cov": cov,
    }


def counted_wire_bytes(counters: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """Bytes each node's interface(s) sent and received between ``window[0]`` and
    ``window[1]`` (counters interpolated at both instants, interfaces summed).

    ``covered`` tells whether the samples span the whole window; where they do not, the
    missing part counts as silent. ``counters`` must hold a single cell.

    Columns: node, wire_tx_bytes, wire_rx_bytes, covered.
    """
    edges = np.asarray(window, dtype="int64")
    records: dict[int, dict[str, Any]] = {}
    for node, _iface, series in _counter_series(counters):
        rec = records.setdefault(
            node, {"node": node, "wire_tx_bytes": 0.0, "wire_rx_bytes": 0.0, "covered": True}
        )
        for col in _COUNTER_BYTES:
            rec[f"wire_{col}"] += float(np.diff(series.at(col, edges))[0])
        rec["covered"] &= bool(series.t_ns[0] <= edges[0] and series.t_ns[-1] >= edges[1])
    return pd.DataFrame(
        list(records.values()), columns=["node", "wire_tx_bytes", "wire_rx_bytes", "covered"]
    )


_PACKET_COLUMNS = ("tx_packets", "rx_packets")


def wire_counts(counters: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """Bytes and packets each node's interface(s) sent and received inside ``window``
    (cumulative counters interpolated at both edges, interfaces summed; packets are 0 when the
    counters lack packet columns). ``counters`` must hold a single cell.

    ``tx_edge_bytes``/``rx_edge_bytes``: bytes counted in the sample intervals that straddle
    the two edges (:meth:`_CounterSeries.straddle`), the most the interpolation can misplace;
    near 0 when the edges fall in quiet stretches and samples come every millisecond, large
    when the sampler was descheduled across a burst.

    Columns: node, tx_bytes, rx_bytes, tx_packets, rx_packets, tx_edge_bytes, rx_edge_bytes,
    covered.
    """
    cols = ["node", "tx_bytes", "rx_bytes", "tx_packets", "rx_packets"]
    cols += ["tx_edge_bytes", "rx_edge_bytes", "covered"]
    if counters.empty:
        return pd.DataFrame(columns=cols)
    edges = np.asarray(window, dtype="int64")
    present = [c for c in (*_COUNTER_BYTES, *_PACKET_COLUMNS) if c in counters.columns]
    iface_key = "iface" if "iface" in counters.columns else None
    keys = ["node", iface_key] if iface_key else ["node"]
    records: dict[int, dict[str, Any]] = {}
    for key, sub in counters.groupby(keys, sort=True):
        node = int(key[0] if isinstance(key, tuple) else key)
        series = _CounterSeries.from_frame(sub, present)
        rec = records.setdefault(node, {c: 0.0 for c in cols[1:-1]} | {"covered": True})
        for col in present:
            rec[col] += float(np.diff(series.at(col, edges))[0])
        for col in (c for c in _COUNTER_BYTES if c in present):
            edge_col = f"{col.split('_')[0]}_edge_bytes"
            rec[edge_col] += sum(series.straddle(col, int(e)) for e in edges)
        rec["covered"] &= bool(series.t_ns[0] <= edges[0] and series.t_ns[-1] >= edges[1])
    out = pd.DataFrame([{"node": n, **r} for n, r in records.items()])
    return out[cols]
