"""System-level traffic from the interface counters: throughput in fixed bins, burstiness
(traffic shape), and bytes and packets over a window."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from pandas.api.extensions import ExtensionDtype

from commscope.contracts import with_params
from commscope.metrics._common import (
    _concat,
    _param_cols,
    _per_cell,
    _shared,
)
from commscope.units import NS_PER_MS, NS_PER_S

# Throughput and shape bin widths: 100 µs (what in-kernel accounting resolves on MTU frames),
# then each decade up to 100 ms. Floats, so 0.1 survives parquet and every groupby.
DEFAULT_BIN_MS: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0)

# Bins at least this wide cover every counter sample of the run; finer ones only the step the
# cell figure zooms into (:func:`~commscope.metrics.steps.zoom_window`): 100 µs over a whole
# run is 10 rows per node and millisecond (90 % of a long run's table and most of its metrics
# time, docs/analysis.md), and the zoom is their only reader. The shape table and the summary
# compute their 100 µs statistics from the counters, over the whole measured window.
FULL_SPAN_MIN_BIN_MS = 1.0

# The counters' optional column with the source's own time resolution (ns, constant per node):
# the in-kernel accounting's bin width, or the sampler's period. Tables without it (older runs,
# imported data) fall back to the median sampling interval.
RESOLUTION_COLUMN = "resolution_ns"

# Without a declared resolution, a bin counts as resolved when the median sampling interval is
# at most this factor times the bin width: a sampler aiming at exactly the bin width jitters by
# a few percent around it.
RESOLUTION_SLACK = 1.05


def bin_width_ns(bin_ms: float) -> int:
    """A bin width in ms (``0.1``, ``10``) as whole nanoseconds, the unit every edge is in.

    Consumers that select rows of one width compare these integers, never the float
    ``bin_ms`` itself, so a width computed as ``100_000 / 1e6`` matches the stored ``0.1``.
    """
    bin_ns = int(round(float(bin_ms) * NS_PER_MS))
    if bin_ns <= 0:
        raise ValueError(f"bin_ms must be positive, got {bin_ms}")
    return bin_ns


@dataclass
class _CounterSeries:
    """One interface's cumulative counters, cleaned: sorted, unique times, never decreasing."""

    t_ns: np.ndarray  # int64
    cum: Mapping[str, np.ndarray]  # float64 bytes since the first sample
    sample_interval_ns: float  # median spacing of samples
    # The source's declared resolution (``resolution_ns``), None when the table has none.
    declared_resolution_ns: int | None = None

    @classmethod
    def from_frame(cls, df: pd.DataFrame, columns: Sequence[str]) -> _CounterSeries:
        """The series of ``df``'s rows (one interface), with the cumulative ``columns``."""
        series = _series_of(df, slice(None))
        for col in columns:
            series.cum[col]  # noqa: B018 (computed now, as a missing column must fail here)
        return series

    @property
    def resolution_ns(self) -> float:
        """The finest time scale the series resolves: the declared resolution when the source
        gives one (sparse in-kernel bins have no meaningful median interval: idle stretches
        have no samples, busy ones one per bin), else the median sampling interval."""
        if self.declared_resolution_ns is not None:
            return float(self.declared_resolution_ns)
        return self.sample_interval_ns

    def resolved(self, bin_ns: int) -> bool:
        """Whether bins of ``bin_ns`` show the traffic rather than a smeared average."""
        if self.declared_resolution_ns is not None:
            return bin_ns >= self.declared_resolution_ns
        return self.sample_interval_ns <= bin_ns * RESOLUTION_SLACK

    def at(self, col: str, when_ns: np.ndarray) -> np.ndarray:
        """Cumulative bytes at arbitrary instants, linearly interpolated between samples.

        Outside the sampled span the counter is held at its first/last value, i.e. nothing is
        assumed to have been sent where nothing was observed. Between two samples with equal
        values (an idle stretch of a sparse in-kernel series) it is flat: zero throughput.
        """
        # Work relative to the first sample: absolute ns (~1.7e18) in float64 would lose
        # ~256 ns of precision, relative ns are exact for 104 days.
        ref = self.t_ns[0]
        return np.interp(
            (np.asarray(when_ns, dtype="int64") - ref).astype("float64"),
            self._relative_t(),
            self.cum[col],
        )

    def _relative_t(self) -> np.ndarray:
        """``t_ns`` relative to the first sample, as float64."""
        return (self.t_ns - self.t_ns[0]).astype("float64")

    def straddle(self, col: str, when_ns: int) -> float:
        """Bytes counted over the sample interval that contains ``when_ns`` (0 when a sample
        falls on it or it lies outside the sampled span): how far an interpolated value at
        that instant can be off, since the counter may have moved anywhere inside it."""
        i = int(np.searchsorted(self.t_ns, when_ns, side="left"))
        if i == 0 or i >= len(self.t_ns) or self.t_ns[i] == when_ns:
            return 0.0
        return float(self.cum[col][i] - self.cum[col][i - 1])

    def bin_range(
        self, origin_ns: int, bin_ns: int, start_ns: int | None = None, end_ns: int | None = None
    ) -> tuple[int, int] | None:
        """``(k_first, k_last)``: the edges of :meth:`bins` are ``origin + k*bin`` for k from
        k_first to k_last; None when there is no whole bin."""
        lo = int(self.t_ns[0]) if start_ns is None else max(int(self.t_ns[0]), start_ns)
        hi = int(self.t_ns[-1]) if end_ns is None else min(int(self.t_ns[-1]), end_ns)
        if hi <= lo:
            return None
        k_first = -((origin_ns - lo) // bin_ns)  # ceil((lo - origin) / bin) in integers
        k_last = (hi - origin_ns) // bin_ns
        if k_last <= k_first:
            return None
        return int(k_first), int(k_last)

    def bins(
        self, origin_ns: int, bin_ns: int, start_ns: int | None = None, end_ns: int | None = None
    ) -> np.ndarray:
        """Bin edges ``origin + k*bin`` of every bin fully inside the sampled span (and inside
        ``[start_ns, end_ns]`` when given). Returns int64 edges; fewer than 2 means no bin."""
        k = self.bin_range(origin_ns, bin_ns, start_ns, end_ns)
        if k is None:
            return np.empty(0, dtype="int64")
        return origin_ns + np.arange(k[0], k[1] + 1, dtype="int64") * bin_ns

    def rates(self, col: str, edges: np.ndarray) -> np.ndarray:
        """Mean rate in bit/s of ``col`` inside each bin between consecutive ``edges``."""
        return np.diff(self.at(col, edges)) * (8 * NS_PER_S) / np.diff(edges)

    def binned_rates(
        self, col: str, origin_ns: int, bin_ns: int, k_first: int, k_last: int
    ) -> np.ndarray:
        """:meth:`rates` over the edges ``origin + k*bin`` for k from ``k_first`` to
        ``k_last``, the same numbers bit for bit with a third of the temporary arrays (the
        shape's 100 µs bins are 10**7 per node-hour): edges relative to the first sample are
        whole numbers below 2**53, exact in float64 however they are summed."""
        rate = np.empty(k_last - k_first, dtype="float64")
        t_rel, cum = self._relative_t(), self.cum[col]
        first = origin_ns + k_first * bin_ns - int(self.t_ns[0])
        # In pieces of _RATE_CHUNK bins (each value computed alike), so the temporaries stay
        # small beside the 80 MB of rates a node-hour of 100 µs bins has.
        for a in range(0, len(rate), _RATE_CHUNK):
            b = min(a + _RATE_CHUNK, len(rate))
            rel = np.arange(a, b + 1, dtype="float64")
            rel *= bin_ns
            rel += first
            np.subtract(*_edge_pairs(np.interp(rel, t_rel, cum)), out=rate[a:b])
        rate *= 8 * NS_PER_S
        rate /= bin_ns
        return rate


# Bins per piece of :meth:`_CounterSeries.binned_rates`.
_RATE_CHUNK = 1 << 20


def _edge_pairs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values at right edges, values at left edges): their difference is np.diff(values)."""
    return values[1:], values[:-1]


class _Cumulative(dict[str, np.ndarray]):
    """A series' cumulative columns, computed on use: one float64 column of 10**7 samples is
    80 MB, so only the byte counters, which every table reads, are kept once computed; the
    packet counters (read once, by the crosscheck) are not."""

    def __init__(self, values: Callable[[str], np.ndarray]) -> None:
        super().__init__()
        self._values = values

    def __missing__(self, col: str) -> np.ndarray:
        v = self._values(col)
        # A counter that goes down was reset (interface recreated) or wrapped: the bytes
        # sent across that instant are unknown, so count that interval as 0 rather than
        # letting it become a huge negative rate.
        d = np.clip(np.diff(v), 0.0, None)
        del v
        cum = np.concatenate([[0.0], np.cumsum(d)])
        if col in _COUNTER_BYTES:
            self[col] = cum
        return cum


def _series_of(counters: pd.DataFrame, rows: np.ndarray | slice) -> _CounterSeries:
    """The cleaned series of ``counters.iloc[rows]`` (one interface): samples sorted by time,
    of samples at the same instant the last one kept (as the sampler or the BPF reader would
    have overwritten it)."""
    t_all = counters["t_ns"].to_numpy(dtype="int64")
    t = t_all[rows]
    if len(t) > 1 and not bool(np.all(np.diff(t) > 0)):
        # Only out-of-order or repeated samples need sorting; a sampler or the BPF reader
        # writes them in order, and 10**6 rows sort in a noticeable ~0.1 s.
        positions = np.arange(len(t_all))[rows]
        order = np.argsort(t, kind="stable")
        t, positions = t[order], positions[order]
        last = np.concatenate([t[1:] != t[:-1], [True]])
        t, rows = t[last], positions[last]

    def values(col: str) -> np.ndarray:
        column = counters[col]
        if isinstance(rows, slice) and rows == slice(None):
            return column.to_numpy(dtype="float64")
        return column.iloc[rows].to_numpy(dtype="float64")

    interval = _median(np.diff(t)) if len(t) > 1 else math.inf
    return _CounterSeries(
        t_ns=t,
        cum=_Cumulative(values),
        sample_interval_ns=interval,
        declared_resolution_ns=_declared_resolution(counters, rows),
    )


def _median(values: np.ndarray) -> float:
    """``float(np.median(values))`` of integers, the same number sooner when few distinct
    values repeat (the intervals of a sparse in-kernel series: its bin width and a handful of
    gaps), where numpy's selection takes ~40x a sort's time (0.2 s per 10**6)."""
    if len(values) > 4096 and len(np.unique(values[:4096])) <= 64:
        ordered, k = np.sort(values), len(values) // 2
        middle = ordered[k : k + 1] if len(values) % 2 else ordered[k - 1 : k + 1]
        return float(np.mean(middle))  # as np.median averages the middle of its partition
    return float(np.median(values))


def _declared_resolution(counters: pd.DataFrame, rows: np.ndarray | slice) -> int | None:
    """The ``resolution_ns`` of one series' rows: None without the column or without a value
    (a table concatenated from old and new runs has nulls on the old rows)."""
    if RESOLUTION_COLUMN not in counters.columns:
        return None
    column = counters[RESOLUTION_COLUMN]
    mine = column if isinstance(rows, slice) and rows == slice(None) else column.iloc[rows]
    values = pd.to_numeric(mine, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    values = values[values > 0]  # NaN compares false: nulls drop out here too
    # Constant per node by contract; should it vary, the coarsest is what holds throughout.
    return int(values.max()) if len(values) else None


_COUNTER_BYTES = ("tx_bytes", "rx_bytes")


def _series_rows(counters: pd.DataFrame) -> list[tuple[int, str, np.ndarray | slice]]:
    """The rows of each (node, iface) of one cell's counters, in (node, iface) order, each
    in table order; rows with a null node or iface belong to none (as in a pandas groupby).
    A table already in that order (as the parse step writes it) is cut into slices, no copy."""
    if counters.empty:
        return []
    node_col = counters["node"]
    if node_col.dtype.kind not in "iu" or isinstance(node_col.dtype, ExtensionDtype):
        return _series_rows_grouped(counters)
    node = node_col.to_numpy(dtype="int64")
    has_iface = "iface" in counters.columns
    if has_iface:
        codes, uniques = pd.factorize(counters["iface"], use_na_sentinel=True)
        names = sorted(str(u) for u in uniques)
        # Each code's place among the sorted names, so keys sort like (node, iface) pairs.
        place = np.array([names.index(str(u)) for u in uniques], dtype="int64")
        valid = codes >= 0
        if not valid.any():
            return []
        iface_place = place[np.where(valid, codes, 0)] if len(place) else codes
    else:
        names, iface_place, valid = [""], np.zeros(len(node), dtype="int64"), None
    width = len(names)
    base = int(node.min())
    key = (node - base) * width + iface_place
    pieces: list[np.ndarray | slice]
    if valid is None or bool(valid.all()):
        if bool(np.all(key[1:] >= key[:-1])):
            bounds = [0, *(np.flatnonzero(key[1:] != key[:-1]) + 1).tolist(), len(key)]
            whole = len(bounds) == 2
            pieces = [
                slice(None) if whole else slice(a, b)
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)
            ]
            keys = [int(key[a]) for a in bounds[:-1]]
        else:
            pieces, keys = _split_by_key(np.argsort(key, kind="stable"), key)
    else:
        kept = np.flatnonzero(valid)
        pieces, keys = _split_by_key(kept[np.argsort(key[kept], kind="stable")], key)
    return [
        (base + k // width, names[k % width] if has_iface else "", rows)
        for k, rows in zip(keys, pieces, strict=True)
    ]


def _split_by_key(order: np.ndarray, key: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
    """Row positions ``order`` (sorted by ``key``) cut where the key changes, and each
    piece's key."""
    sorted_keys = key[order]
    cuts = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    return np.split(order, cuts), [int(sorted_keys[i]) for i in (0, *cuts.tolist())]


def _series_rows_grouped(counters: pd.DataFrame) -> list[tuple[int, str, np.ndarray | slice]]:
    """:func:`_series_rows` by a pandas groupby, for node columns that are not plain ints."""
    iface_key = "iface" if "iface" in counters.columns else None
    keys = ["node", iface_key] if iface_key else ["node"]
    if iface_key and isinstance(counters["iface"].dtype, pd.CategoricalDtype):
        # Sorted by name, not by category order, like the plain text column.
        plain = counters["iface"].cat.categories.dtype
        counters = counters.assign(iface=counters["iface"].astype(plain))
    out = []
    for key, rows in counters.groupby(keys, sort=True).indices.items():
        key = key if isinstance(key, tuple) else (key,)
        out.append((int(key[0]), str(key[1]) if iface_key else "", np.asarray(rows)))
    return out


def _counter_series(counters: pd.DataFrame) -> list[tuple[int, str, _CounterSeries]]:
    """Cleaned counter series per (node, iface) of one cell, in (node, iface) order; computed
    once per counters table inside :func:`~commscope.metrics._common.shared_results`."""

    def compute() -> list[tuple[int, str, _CounterSeries]]:
        return [
            (node, iface, _series_of(counters, rows))
            for node, iface, rows in _series_rows(counters)
        ]

    return _shared("counter_series", (counters,), compute)


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
    (times :data:`RESOLUTION_SLACK`). Such bins only show a smeared average; they are flagged,
    not dropped.

    Columns: cell params, node, iface, bin_ms (float), t_start_ns, tx_bps, rx_bps, resolved.
    """
    limits = None if window is None else (int(window[0]), int(window[1]))
    return _throughput(counters, [(float(bin_ms), limits)], int(origin_ns))


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
    return _throughput(counters, throughput_specs(window, bin_ms_list, zoom), 0)


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
    for node, iface, series in _counter_series(counters):
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


def _throughput(
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
        for node, iface, series in _counter_series(cell_counters):
            for bin_ms, bin_ns in widths:
                resolved = series.resolved(bin_ns)
                for direction in ("tx", "rx"):
                    stats = _shape_stats(
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


def _shape_stats(
    series: _CounterSeries,
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
    records: dict[int, dict[str, Any]] = {}
    for node, _iface, series in _counter_series(counters):
        rec = records.setdefault(node, {c: 0.0 for c in cols[1:-1]} | {"covered": True})
        for col in present:
            rec[col] += float(np.diff(series.at(col, edges))[0])
        for col in (c for c in _COUNTER_BYTES if c in present):
            edge_col = f"{col.split('_')[0]}_edge_bytes"
            rec[edge_col] += sum(series.straddle(col, int(e)) for e in edges)
        rec["covered"] &= bool(series.t_ns[0] <= edges[0] and series.t_ns[-1] >= edges[1])
    out = pd.DataFrame([{"node": n, **r} for n, r in records.items()])
    return out[cols]
