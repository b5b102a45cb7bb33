"""The interface counters as series: one cleaned, cumulative series per (node, interface) of a
cell's counters table (:func:`counter_series`), which every counter metric reads
(:mod:`~commscope.metrics.counters`, :mod:`~commscope.metrics.temporal`, the cross-check's
wire side): samples in time order, resets clamped, values between samples interpolated, and
the time scale the source resolves (:attr:`CounterSeries.resolution_ns`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pandas.api.extensions import ExtensionDtype

from commscope.metrics._common import _shared
from commscope.units import NS_PER_S

# The counters' optional column with the source's own time resolution (ns, constant per node):
# the in-kernel accounting's bin width, or the sampler's period. Tables without it (older runs,
# imported data) fall back to the median sampling interval.
RESOLUTION_COLUMN = "resolution_ns"

# Without a declared resolution, a bin counts as resolved when the median sampling interval is
# at most this factor times the bin width: a sampler aiming at exactly the bin width jitters by
# a few percent around it.
RESOLUTION_SLACK = 1.05


@dataclass
class CounterSeries:
    """One interface's cumulative counters, cleaned: sorted, unique times, never decreasing."""

    t_ns: np.ndarray  # int64
    cum: Mapping[str, np.ndarray]  # float64 bytes since the first sample
    sample_interval_ns: float  # median spacing of samples
    # The source's declared resolution (``resolution_ns``), None when the table has none.
    declared_resolution_ns: int | None = None

    @classmethod
    def from_frame(cls, df: pd.DataFrame, columns: Sequence[str]) -> CounterSeries:
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


# Bins per piece of :meth:`CounterSeries.binned_rates`.
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
        if col in BYTE_COUNTERS:
            self[col] = cum
        return cum


def _series_of(counters: pd.DataFrame, rows: np.ndarray | slice) -> CounterSeries:
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
    return CounterSeries(
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


# The byte counters: what every counter table reads (their cumulative columns are kept).
BYTE_COUNTERS = ("tx_bytes", "rx_bytes")


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


def counter_series(counters: pd.DataFrame) -> list[tuple[int, str, CounterSeries]]:
    """Cleaned counter series per (node, iface) of one cell, in (node, iface) order; computed
    once per counters table inside :func:`~commscope.metrics._common.shared_results`."""

    def compute() -> list[tuple[int, str, CounterSeries]]:
        return [
            (node, iface, _series_of(counters, rows))
            for node, iface, rows in _series_rows(counters)
        ]

    return _shared("counter_series", (counters,), compute)
