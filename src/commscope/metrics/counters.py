"""System-level traffic from the interface counters: throughput in fixed bins, burstiness
(traffic shape), and bytes and packets over a window, each read off the counters' cleaned
series (:mod:`~commscope.metrics.counter_series`)."""

from __future__ import annotations

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
    _shared,
)
from commscope.metrics.counter_series import BYTE_COUNTERS, CounterSeries, counter_series
from commscope.units import NS_PER_MS

# Throughput and shape bin widths: 100 µs (what in-kernel accounting resolves on MTU frames),
# then each decade up to 100 ms. Floats, so 0.1 survives parquet and every groupby.
DEFAULT_BIN_MS: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0)

# Bins at least this wide cover every counter sample of the run; finer ones only the step the
# cell figure zooms into (:func:`~commscope.metrics.steps.zoom_window`): 100 µs over a whole
# run is 10 rows per node and millisecond (90 % of a long run's table and most of its metrics
# time, docs/analysis.md), and the zoom is their only reader. The shape table and the summary
# compute their 100 µs statistics from the counters, over the whole measured window.
FULL_SPAN_MIN_BIN_MS = 1.0


def bin_width_ns(bin_ms: float) -> int:
    """A bin width in ms (``0.1``, ``10``) as whole nanoseconds, the unit every edge is in.

    Consumers that select rows of one width compare these integers, never the float
    ``bin_ms`` itself, so a width computed as ``100_000 / 1e6`` matches the stored ``0.1``.
    """
    bin_ns = int(round(float(bin_ms) * NS_PER_MS))
    if bin_ns <= 0:
        raise ValueError(f"bin_ms must be positive, got {bin_ms}")
    return bin_ns


THROUGHPUT_COLUMNS = [
    "node",
    "iface",
    "bin_ms",
    "t_start_ns",
    "tx_bps",
    "rx_bps",
    "resolved",
]


def throughput(
    counters: pd.DataFrame,
    bin_ms: float,
    origin_ns: int = 0,
    window: tuple[int, int] | None = None,
) -> pd.DataFrame:
    """Per-node tx/rx throughput in fixed bins of ``bin_ms`` milliseconds (a float: 0.1 is
    100 µs).

    The counters are cumulative and sampled at irregular instants (a sampler thread wakes up
    late now and then). Rather than assigning each sample's delta to the bin it lands in,
    which would put a late sample's bytes into the wrong bin and make rates jump, the
    cumulative counter is linearly interpolated onto the bin edges and differenced: bytes in a
    bin = counter(edge_right) - counter(edge_left). This is exact for traffic that is steady
    between samples, conserves bytes, and cannot go negative because decreasing counter steps
    (resets) are clamped to zero first. Only bins fully covered by samples (and fully inside
    ``window = (start_ns, end_ns)`` when given) are emitted.

    Bin edges are ``origin_ns + k * bin`` (default origin 0: edges at whole multiples of the
    bin width on the shared clock), so all nodes, cells and nested widths (0.1/1/10/100 ms)
    share edges and can be compared bin by bin. A sparse in-kernel series (``resolution_ns``
    given, one sample at each edge of its own bins, which are multiples of ``resolution_ns``,
    none across idle stretches) is exact at its bin edges: with a width that is a multiple of
    its resolution every edge here is one of them, so a 100 µs bin is exactly one source bin
    and a 1 ms bin the sum of ten, with no interpolation; idle stretches give 0.

    ``resolved`` is false when the bin is finer than the source resolves: finer than the
    declared ``resolution_ns``, or, without that column, than the median sampling interval
    (times :data:`~commscope.metrics.counter_series.RESOLUTION_SLACK`). Such bins only show a
    smeared average; they are flagged, not dropped.

    Columns: cell params, node, iface, bin_ms (float), t_start_ns, tx_bps, rx_bps, resolved.
    """
    limits = None if window is None else (int(window[0]), int(window[1]))
    return throughput_rows(counters, [(float(bin_ms), limits)], int(origin_ns))


def throughput_specs(
    window: tuple[int, int] | None,
    bin_ms_list: Sequence[float] = DEFAULT_BIN_MS,
    zoom: tuple[int, int] | None = None,
) -> list[tuple[float, tuple[int, int] | None]]:
    """The ``(bin_ms, limits)`` of the cell's ``throughput`` table (:func:`throughput_table`):
    widths of at least :data:`FULL_SPAN_MIN_BIN_MS` over the whole sampled span (no limits);
    finer ones over ``zoom`` (:func:`~commscope.metrics.steps.zoom_window`): every bin of
    theirs that overlaps it and lies inside ``window`` (the training window), so the figure's
    zoom, widened to whole bins, finds all of its bins. Without ``zoom`` the finer widths cover
    the whole ``window``; without ``window`` (no steps recorded) they are left out."""
    specs: list[tuple[float, tuple[int, int] | None]] = []
    for bin_ms in bin_ms_list:
        if float(bin_ms) >= FULL_SPAN_MIN_BIN_MS:
            specs.append((float(bin_ms), None))
        elif window is not None:
            lo, hi = int(window[0]), int(window[1])
            if zoom is not None:
                # Widened to the width's grid (origin 0, the table's), then cut to the window.
                bin_ns = bin_width_ns(bin_ms)
                lo = max(lo, int(zoom[0]) - int(zoom[0]) % bin_ns)
                hi = min(hi, int(zoom[1]) + (-int(zoom[1])) % bin_ns)
            specs.append((float(bin_ms), (lo, hi)))
    return specs


def throughput_table(
    counters: pd.DataFrame,
    window: tuple[int, int] | None,
    bin_ms_list: Sequence[float] = DEFAULT_BIN_MS,
    zoom: tuple[int, int] | None = None,
) -> pd.DataFrame:
    """:func:`throughput` at every width of ``bin_ms_list``, stacked (column ``bin_ms``), as
    the cell's ``throughput`` table is written (with the ``zoom`` of its step table).

    Widths of at least :data:`FULL_SPAN_MIN_BIN_MS` cover the whole sampled span (start-up and
    tear-down included); finer ones only the step the cell figure zooms into (``zoom``,
    :func:`~commscope.metrics.steps.zoom_window`, widened to whole bins inside the measured
    ``window``, :func:`~commscope.metrics.steps.training_window`; the whole ``window`` without
    ``zoom``), and none at all when ``window`` is None (no steps were recorded). Each counter
    series is cleaned once for all widths.
    """
    return throughput_rows(counters, throughput_specs(window, bin_ms_list, zoom), 0)


# Rows of one part of the throughput table at most (:func:`throughput_parts`): the table has
# a row per node and millisecond at 1 ms, far more than one array should hold at once; a
# part is one row group of the written file, and half a million rows keep the writer's buffers
# near 50 MB beside the rest of a long run's metrics.
THROUGHPUT_PART_ROWS = 1 << 19


@dataclass(frozen=True)
class ThroughputPart:
    """Consecutive rows of the throughput table, of one node, interface and bin width."""

    node: int
    iface: str
    bin_ms: float
    t_start_ns: np.ndarray
    tx_bps: np.ndarray
    rx_bps: np.ndarray
    resolved: bool

    def __len__(self) -> int:
        return len(self.t_start_ns)

    def head(self, rows: int) -> ThroughputPart:
        """The first ``rows`` rows."""
        return ThroughputPart(
            self.node,
            self.iface,
            self.bin_ms,
            self.t_start_ns[:rows],
            self.tx_bps[:rows],
            self.rx_bps[:rows],
            self.resolved,
        )


def throughput_parts(
    counters: pd.DataFrame,
    specs: Sequence[tuple[float, tuple[int, int] | None]],
    origin_ns: int = 0,
    max_rows: int | None = None,
) -> Iterator[tuple[dict[str, Any], Iterator[ThroughputPart]]]:
    """The rows of :func:`throughput` for every ``(bin_ms, limits)`` of ``specs`` (see
    :func:`throughput_specs`), per cell: ``(cell params, its parts)``, parts of at most
    ``max_rows`` rows (default :data:`THROUGHPUT_PART_ROWS`) in table order. Stacking a
    cell's parts (:func:`throughput_frame`) gives its rows of the table, the same numbers
    however it is cut; writing them one by one never holds the whole table."""
    widths = [(bin_ms, bin_width_ns(bin_ms), limits) for bin_ms, limits in specs]
    max_rows = max_rows or THROUGHPUT_PART_ROWS
    for params, cell_counters in _per_cell(counters):
        yield params, _cell_throughput_parts(cell_counters, widths, origin_ns, max_rows)


def _cell_throughput_parts(
    counters: pd.DataFrame,
    widths: Sequence[tuple[float, int, tuple[int, int] | None]],
    origin_ns: int,
    max_rows: int,
) -> Iterator[ThroughputPart]:
    for node, iface, series in counter_series(counters):
        for bin_ms, bin_ns, limits in widths:
            lo, hi = (None, None) if limits is None else limits
            k = series.bin_range(origin_ns, bin_ns, lo, hi)
            if k is None:
                continue
            resolved = series.resolved(bin_ns)
            for k_first in range(k[0], k[1], max_rows):
                k_last = min(k_first + max_rows, k[1])
                # Bytes per bin are tx_bps * bin_ms / 8000; not stored twice (this is the
                # largest table: one row per node and bin).
                yield ThroughputPart(
                    node=node,
                    iface=iface,
                    bin_ms=bin_ms,
                    t_start_ns=origin_ns + np.arange(k_first, k_last, dtype="int64") * bin_ns,
                    tx_bps=series.binned_rates("tx_bytes", origin_ns, bin_ns, k_first, k_last),
                    rx_bps=series.binned_rates("rx_bytes", origin_ns, bin_ns, k_first, k_last),
                    resolved=resolved,
                )


def throughput_frame(parts: Sequence[ThroughputPart]) -> pd.DataFrame:
    """The throughput table's rows of ``parts`` (no cell params): THROUGHPUT_COLUMNS."""
    columns: dict[str, Any] = {
        "node": np.concatenate([np.full(len(p), p.node, dtype="int64") for p in parts]),
        "iface": np.concatenate([np.full(len(p), p.iface, dtype=object) for p in parts]),
        "bin_ms": np.concatenate([np.full(len(p), p.bin_ms, dtype="float64") for p in parts]),
        "t_start_ns": np.concatenate([p.t_start_ns for p in parts]),
        "tx_bps": np.concatenate([p.tx_bps for p in parts]),
        "rx_bps": np.concatenate([p.rx_bps for p in parts]),
        "resolved": np.concatenate([np.full(len(p), p.resolved, dtype=bool) for p in parts]),
    }
    out = pd.DataFrame(columns)
    out["iface"] = out["iface"].astype("str")
    return out


def throughput_rows(
    counters: pd.DataFrame,
    specs: Sequence[tuple[float, tuple[int, int] | None]],
    origin_ns: int,
) -> pd.DataFrame:
    """The throughput rows of every ``(bin_ms, limits)`` of ``specs``: bins of that width
    inside the sampled span and, when ``limits`` is given, inside ``[start_ns, end_ns]``."""
    frames = []
    for params, parts in throughput_parts(counters, specs, origin_ns):
        cell_parts = list(parts)
        if cell_parts:
            frames.append(with_params(params, throughput_frame(cell_parts)))
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
    "resolution_ms",
    "resolved",
]


def traffic_shape(
    counters: pd.DataFrame,
    window: tuple[int, int],
    bin_ms_list: Sequence[float] = DEFAULT_BIN_MS,
) -> pd.DataFrame:
    """Burstiness of each node's traffic inside the training ``window`` at several bin widths.

    For each node, direction (tx/rx) and bin width, the binned rate series gives
    ``mean_bps``, ``peak_bps``, ``peak_to_mean`` = peak/mean and ``cov`` = population standard
    deviation / mean of the binned rate. The bins are exactly the ``throughput`` table's (edges
    at whole multiples of the width on the shared clock, see :func:`throughput`) that lie fully
    inside the window; so at 100 µs on an in-kernel source every bin is one source bin. A
    constant-rate stream has peak_to_mean 1 and cov 0 at every width; on/off traffic with duty
    cycle d (bins aligned to the on/off periods) has peak_to_mean 1/d and cov sqrt((1-d)/d).

    When the bin is finer than the source resolves (``resolved`` false, see
    :func:`throughput`) the rate inside a source interval is unknown, and interpolation would
    report a flat, fake-calm series: ``peak_bps``, ``peak_to_mean`` and ``cov`` are NaN.
    ``mean_bps`` is still given, as the average rate does not depend on resolution.
    ``sample_interval_ms`` is the median spacing of samples, ``resolution_ms`` what
    ``resolved`` was judged by (the declared ``resolution_ns`` when the counters have it, else
    that median). ``window`` is ``(start_ns, end_ns)``, e.g. from :func:`training_window`;
    ``counters`` must hold a single cell.

    Columns: cell params, node, iface, direction, bin_ms (float), n_bins, mean_bps, peak_bps,
    peak_to_mean, cov, sample_interval_ms, resolution_ms, resolved.
    """
    start_ns, end_ns = int(window[0]), int(window[1])
    widths = [(float(b), bin_width_ns(b)) for b in bin_ms_list]
    rows: list[pd.DataFrame] = []
    for params, cell_counters in _per_cell(counters):
        records = []
        for node, iface, series in counter_series(cell_counters):
            for bin_ms, bin_ns in widths:
                resolved = series.resolved(bin_ns)
                for direction in ("tx", "rx"):
                    stats = shape_stats(
                        series, f"{direction}_bytes", bin_ns, (start_ns, end_ns), resolved
                    )
                    records.append(
                        {
                            "node": node,
                            "iface": iface,
                            "direction": direction,
                            "bin_ms": bin_ms,
                            **stats,
                            "sample_interval_ms": series.sample_interval_ns / NS_PER_MS,
                            "resolution_ms": series.resolution_ns / NS_PER_MS,
                            "resolved": resolved,
                        }
                    )
        if records:
            rows.append(with_params(params, pd.DataFrame(records)))
    return _concat(rows, [*_param_cols(counters), *SHAPE_COLUMNS])


def shape_stats(
    series: CounterSeries,
    col: str,
    bin_ns: int,
    window: tuple[int, int],
    resolved: bool,
) -> dict[str, float]:
    """n_bins, mean_bps, peak_bps, peak_to_mean and cov of ``col``'s rates in the bins of
    ``bin_ns`` inside ``window`` (computed once per series inside ``shared_results``: the
    summary asks for the same widths as the shape table)."""

    def compute() -> dict[str, float]:
        nan = float("nan")
        k = series.bin_range(0, bin_ns, window[0], window[1])
        if k is None:
            return {
                "n_bins": 0,
                "mean_bps": nan,
                "peak_bps": nan,
                "peak_to_mean": nan,
                "cov": nan,
            }
        rate = series.binned_rates(col, 0, bin_ns, k[0], k[1])
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

    return _shared(("shape_stats", col, bin_ns, *window, resolved), (series,), compute)


def counted_wire_bytes(counters: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """Bytes each node's interface(s) sent and received between ``window[0]`` and
    ``window[1]`` (counters interpolated at both instants, interfaces summed).

    ``covered`` tells whether the samples span the whole window; where they do not, the
    missing part counts as silent. ``counters`` must hold a single cell.

    Columns: node, wire_tx_bytes, wire_rx_bytes, covered.
    """
    edges = np.asarray(window, dtype="int64")
    records: dict[int, dict[str, Any]] = {}
    for node, _iface, series in counter_series(counters):
        rec = records.setdefault(
            node, {"node": node, "wire_tx_bytes": 0.0, "wire_rx_bytes": 0.0, "covered": True}
        )
        for col in BYTE_COUNTERS:
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
    the two edges (:meth:`CounterSeries.straddle`), the most the interpolation can misplace;
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
    present = [c for c in (*BYTE_COUNTERS, *_PACKET_COLUMNS) if c in counters.columns]
    records: dict[int, dict[str, Any]] = {}
    for node, _iface, series in counter_series(counters):
        rec = records.setdefault(node, {c: 0.0 for c in cols[1:-1]} | {"covered": True})
        for col in present:
            rec[col] += float(np.diff(series.at(col, edges))[0])
        for col in (c for c in BYTE_COUNTERS if c in present):
            edge_col = f"{col.split('_')[0]}_edge_bytes"
            rec[edge_col] += sum(series.straddle(col, int(e)) for e in edges)
        rec["covered"] &= bool(series.t_ns[0] <= edges[0] and series.t_ns[-1] >= edges[1])
    out = pd.DataFrame([{"node": n, **r} for n, r in records.items()])
    return out[cols]
