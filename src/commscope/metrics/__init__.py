"""Metrics of one sweep cell, computed from its trace tables (definitions: docs/traces.md).

Every function here is a pure function of DataFrames and returns a *tidy* DataFrame whose first
columns are the cell parameters (``cell``, ``strategy``, ``model``, ... whichever the input
carries), so tables of many cells aggregate by concatenation and never by parsing paths. Inputs
may hold several cells at once; every computation is done per cell.

Units: bytes, bits per second (``*_bps``), seconds (``*_s``), nanoseconds (``*_ns``,
one clock shared by all nodes). Sizes are SI (1 MB = 10**6 bytes) wherever they are printed.

Definitions worth knowing before reading a number:

* *framework bytes* are the payload bytes of each op's input tensor(s) as each rank recorded
  them, summed over ranks (a send and its matching recv both count, as do the n inputs of an
  n-rank all-reduce). It measures what the framework asks for, not what the wire carries.
* *modelled bytes* are what one rank must transmit for an op under the algorithm its backend
  really runs: gloo's own algorithms (ring all-reduce, reduce-scatter as a full all-reduce,
  binomial-tree broadcast, ...) for gloo cells, the bandwidth-optimal rings and chains that
  NCCL uses for large messages otherwise (see docs/crossvalidation.md).
  :func:`op_destinations` is the one model of who sends how much to whom;
  :func:`ring_send_bytes` (per-rank totals), :func:`wire_vs_framework` (whose inter-node
  part is compared with the interface counters), :func:`comm_matrix` and the per-cell
  cross-validation (:func:`crosscheck`, :func:`matrix_check`) all derive from it.
* the *communication matrix* (:func:`comm_matrix`, :func:`node_matrix`) gives those bytes
  per measured step for every (sender, receiver) pair of ranks and of nodes; its node
  diagonal is traffic inside a node, which never reaches the experiment interface.
* *traffic shape* is computed from the interface counters binned at several widths; a bin width
  finer than the sampling interval cannot show bursts, so such rows are flagged and hold NaN
  rather than an interpolated, artificially smooth number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from commscope.config import SWEEP_AXES

# Columns that identify a sweep cell, in the order they lead every output table.
PARAM_COLUMNS: tuple[str, ...] = ("cell", *SWEEP_AXES)

# Tables written by compute_cell_metrics() and concatenated by aggregate_cells().
METRIC_TABLES: tuple[str, ...] = (
    "summary",
    "op_volume",
    "msg_sizes",
    "throughput",
    "shape",
    "step_times",
    "wire",
    "comm_matrix",
    "node_matrix",
    "crosscheck",
    "matrix_check",
    "sockets",
)

DEFAULT_BIN_MS: tuple[int, ...] = (1, 10, 100)

# Bin width at which cell_summary() reports burstiness: fine enough for the micro-bursts that
# live below 10 ms to show, coarse enough for a 100 Hz sampler to resolve.
SUMMARY_BIN_MS = 10

# A bin counts as resolved when the median sampling interval is at most this factor times the
# bin width: a sampler aiming at exactly the bin width jitters by a few percent around it.
RESOLUTION_SLACK = 1.05

P2P_OPS = frozenset({"send", "recv"})
_RING_OPS = frozenset({"allreduce", "allgather", "reduce_scatter"})
# Ops whose traffic depends on a root rank (the ``root`` column; older traces lack it).
_ROOTED_OPS = frozenset({"broadcast", "reduce", "gather", "scatter"})
KNOWN_OPS = frozenset(
    _RING_OPS | _ROOTED_OPS | {"alltoall", "send", "recv", "barrier"},
)

_NS_PER_S = 1_000_000_000
_NS_PER_MS = 1_000_000

# Backends with a traffic model of their own. Anything else (nccl, an imported trace without a
# backend) gets the ring/chain model, which is what NCCL runs for large messages.
GLOO = "gloo"
DEFAULT_BACKEND = "nccl"

# gloo/allreduce.h: AllreduceOptions::kMaxSegmentSize, the largest single send of the ring.
GLOO_MAX_SEGMENT_BYTES = 1024 * 1024


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


@dataclass
class CellTraces:
    """The trace tables of one sweep cell plus its ``cell.json`` metadata; ``sockets`` is
    ``sockets.parquet`` (empty for runs without socket statistics)."""

    ops: pd.DataFrame
    steps: pd.DataFrame
    counters: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    sockets: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def warmup_steps(self) -> int:
        """Steps at the start of the run excluded from every summary (default 0)."""
        return int(self.meta.get("warmup_steps") or 0)

    @property
    def backend(self) -> str:
        """The c10d backend the cell ran on (cell.json ``backend``), which picks the traffic
        model of :func:`op_destinations`; :data:`DEFAULT_BACKEND` when not recorded."""
        return _backend_of(self.meta)

    @property
    def params(self) -> dict[str, Any]:
        """The cell's parameters, ``cell`` id first, as they lead every output table."""
        params = {"cell": self.meta.get("cell")}
        params.update(self.meta.get("params", {}))
        return params


def load_cell(cell_dir: Path) -> CellTraces:
    """Read ``cell.json``, ``ops.parquet``, ``steps.parquet``, ``counters.parquet`` and
    ``sockets.parquet``.

    A missing ``ops``, ``counters`` or ``sockets`` table (a run without communication, a node
    without a sampler, a run from before socket statistics) loads as an empty frame so the
    metrics degrade to NaN instead of failing; ``cell.json`` and ``steps.parquet`` are
    required. MoE all-to-alls recorded without
    ``split_bytes`` get them from ``moe.parquet`` where that is exact
    (:func:`alltoall_splits_from_routing`).
    """
    cell_dir = Path(cell_dir)
    meta = json.loads((cell_dir / "cell.json").read_text())
    steps = pd.read_parquet(cell_dir / "steps.parquet")
    ops = _read_optional(cell_dir / "ops.parquet")
    counters = _read_optional(cell_dir / "counters.parquet")
    ops = alltoall_splits_from_routing(ops, _read_optional(cell_dir / ROUTING_FILE))
    sockets = _read_optional(cell_dir / SOCKETS_FILE)
    return CellTraces(ops=ops, steps=steps, counters=counters, meta=meta, sockets=sockets)


def _read_optional(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def _backend_of(meta: dict[str, Any]) -> str:
    return str(meta.get("backend") or DEFAULT_BACKEND).lower()


# --------------------------------------------------------------------------------------------
# Helpers shared by the metrics
# --------------------------------------------------------------------------------------------


def _param_cols(df: pd.DataFrame) -> list[str]:
    """The cell parameter columns present in ``df``, in canonical order."""
    return [c for c in PARAM_COLUMNS if c in df.columns]


def _per_cell(df: pd.DataFrame) -> Iterator[tuple[dict[str, Any], pd.DataFrame]]:
    """Yield ``(cell parameters, rows of that cell)`` for each cell in ``df``."""
    if df.empty:
        return
    if "cell" not in df.columns:
        yield {c: df[c].iloc[0] for c in _param_cols(df)}, df
        return
    for _, sub in df.groupby("cell", sort=True, dropna=False):
        yield {c: sub[c].iloc[0] for c in _param_cols(sub)}, sub


def _with_params(params: dict[str, Any], df: pd.DataFrame) -> pd.DataFrame:
    """Prefix ``df`` with constant parameter columns (parameters first, as in every table)."""
    # Scalars broadcast over the index: far cheaper than building per-row lists.
    lead = pd.DataFrame(params, index=df.index)
    return pd.concat([lead, df.drop(columns=list(params), errors="ignore")], axis=1)


def _concat(frames: Iterable[pd.DataFrame], columns: Sequence[str]) -> pd.DataFrame:
    """Concatenate per-cell results; an empty input still gives the documented columns."""
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=list(columns))
    return pd.concat(frames, ignore_index=True)


def _as_int_ns(values: pd.Series | np.ndarray) -> np.ndarray:
    """Timestamps as int64 ns, nulls dropped (nullable or float columns both accepted)."""
    s = pd.Series(values).dropna()
    return s.to_numpy(dtype="int64")


def _groupby(df: pd.DataFrame, keys: list[str]):
    # dropna=False: a null parameter (e.g. a cap recorded as None) must not drop rows.
    return df.groupby(keys, sort=True, dropna=False, observed=True)


# --------------------------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------------------------

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
    out["duration_s"] = (out["t_end_ns"] - out["t_start_ns"]) / _NS_PER_S
    out["start_spread_s"] = (out["last_start_ns"] - out["t_start_ns"]) / _NS_PER_S
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


# --------------------------------------------------------------------------------------------
# Framework-level volume and messages
# --------------------------------------------------------------------------------------------


def op_volume(ops: pd.DataFrame, per_rank: bool = True) -> pd.DataFrame:
    """Framework bytes and op count per op type and step.

    ``per_rank=True`` gives one row per (rank, node, step, op); ``per_rank=False`` sums over
    ranks, one row per (step, op), with ``n_ranks`` the number of ranks that issued that op.
    Ops outside a training step keep ``step == -1`` (e.g. DDP's initial parameter broadcast).

    Columns: cell params, [rank, node,] step, op, bytes, count[, n_ranks].
    """
    params = _param_cols(ops)
    keys = [*params, "rank", "node", "step", "op"] if per_rank else [*params, "step", "op"]
    value_cols = ["bytes", "count"] if per_rank else ["bytes", "count", "n_ranks"]
    if ops.empty:
        return pd.DataFrame(columns=[*keys, *value_cols])
    aggs: dict[str, tuple[str, str]] = {"bytes": ("bytes", "sum"), "count": ("bytes", "size")}
    if not per_rank:
        aggs["n_ranks"] = ("rank", "nunique")
    out = _groupby(ops, keys).agg(**aggs).reset_index()
    return out[[*keys, *value_cols]]


def bytes_per_step(ops: pd.DataFrame) -> pd.DataFrame:
    """Framework bytes and message (op) count per step, summed over ranks and op types.

    Columns: cell params, step, bytes, messages.
    """
    keys = [*_param_cols(ops), "step"]
    if ops.empty:
        return pd.DataFrame(columns=[*keys, "bytes", "messages"])
    return (
        _groupby(ops, keys)
        .agg(bytes=("bytes", "sum"), messages=("bytes", "size"))
        .reset_index()[[*keys, "bytes", "messages"]]
    )


MSG_SIZE_COLUMNS = ["rank", "node", "step", "phase", "op", "group_size", "bytes", "measured"]


def message_sizes(ops: pd.DataFrame, warmup_steps: int = 0) -> pd.DataFrame:
    """One row per message (op issued by a rank) with its payload size, for CDFs/histograms.

    ``measured`` is true for ops inside a measured (non-warm-up) step, so plots can leave out
    warm-up and out-of-step traffic (``step == -1``) without needing the step table.

    Columns: cell params, rank, node, step, phase, op, group_size, bytes, measured.
    """
    params = _param_cols(ops)
    if ops.empty:
        return pd.DataFrame(columns=[*params, *MSG_SIZE_COLUMNS])
    out = ops[[*params, *[c for c in MSG_SIZE_COLUMNS if c != "measured"]]].copy()
    out["measured"] = out["step"] >= max(warmup_steps, 0)
    return out.reset_index(drop=True)


def size_cdf(msgs: pd.DataFrame, by: Sequence[str] | None = None) -> pd.DataFrame:
    """Empirical CDF of message sizes: fraction of messages of at most ``bytes``.

    ``msgs`` is any frame with a ``bytes`` column (ops or :func:`message_sizes`). ``by`` are
    the grouping columns (default: the cell parameters plus ``op``; pass e.g.
    ``["strategy"]`` for one CDF per strategy across cells). Zero-byte ops (barriers) are left
    out: they carry no payload and have no place on a log-size axis. One row per distinct size,
    so the CDF is exact and ``cum_fraction`` is non-decreasing and ends at 1 in every group.

    Columns: by..., bytes, count, cum_fraction.
    """
    by = [*_param_cols(msgs), "op"] if by is None else list(by)
    cols = [*by, "bytes", "count", "cum_fraction"]
    sized = msgs[msgs["bytes"] > 0] if not msgs.empty else msgs
    if sized.empty:
        return pd.DataFrame(columns=cols)
    counts = _groupby(sized, [*by, "bytes"]).size().rename("count").reset_index()
    counts = counts.sort_values([*by, "bytes"], kind="stable").reset_index(drop=True)
    if by:
        cum = counts.groupby(by, sort=False, dropna=False, observed=True)["count"].cumsum()
        total = counts.groupby(by, sort=False, dropna=False, observed=True)["count"].transform(
            "sum"
        )
    else:
        cum, total = counts["count"].cumsum(), counts["count"].sum()
    counts["cum_fraction"] = cum / total
    return counts[cols]


# --------------------------------------------------------------------------------------------
# System-level traffic from the interface counters
# --------------------------------------------------------------------------------------------


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
    bin_ns = int(round(bin_ms * _NS_PER_MS))
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
                out[col.replace("_bytes", "_bps")] = moved * 8 * _NS_PER_S / bin_ns
            out["resolved"] = _resolved(series, bin_ns)
            frames.append(_with_params(params, out[THROUGHPUT_COLUMNS]))
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
                bin_ns = int(round(bin_ms * _NS_PER_MS))
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
                            "sample_interval_ms": series.sample_interval_ns / _NS_PER_MS,
                            "resolved": resolved,
                        }
                    )
        if records:
            rows.append(_with_params(params, pd.DataFrame(records)))
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
    rate = np.diff(series.at(col, edges)) * 8 * _NS_PER_S / np.diff(edges)
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


def wire_bytes(counters: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
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


# --------------------------------------------------------------------------------------------
# Framework vs wire
# --------------------------------------------------------------------------------------------


# The traffic model: who sends what to whom for one op. ring_send_bytes, the wire comparison
# and the communication matrix all derive from op_destinations(), so they cannot disagree.

# Optional ops.parquet column with the exact bytes a rank sends to each member of the group, in
# group_ranks order ("b0,b1,..." or a list), for all-to-alls with uneven splits (MoE dispatch).
# Null where not applicable; without it an all-to-all is modelled as an even split.
SPLIT_COLUMN = "split_bytes"


def op_destinations(
    op: str,
    bytes: float,
    group_ranks: Any,
    rank: int,
    peer: int = -1,
    root: int = -1,
    splits: Any = None,
    backend: str = DEFAULT_BACKEND,
    element_size: int = 1,
) -> list[tuple[int, float]]:
    """Where the bytes ``rank`` transmits for one op go, as ``[(destination rank, bytes)]``.

    This is commscope's single traffic model, and it follows the algorithm the backend really
    runs. ``bytes`` (S) is the op's payload on this rank as recorded in ops.parquet,
    ``group_ranks`` the group's global ranks ("0,2,4" or a sequence) in group-rank order, n
    their number, "next"/"previous" the neighbours in that order (wrapping around), ``peer``
    and ``root`` global ranks (-1 when not applicable or not recorded), ``element_size`` the
    bytes per tensor element (gloo rounds its segments to whole elements).

    ``backend="gloo"`` (sources: pytorch torch/csrc/distributed/c10d/ProcessGroupGloo.cpp,
    which calls facebookincubator/gloo gloo/allreduce.cc ring(), allgather.cc, broadcast.cc,
    alltoall.cc, scatter.cc, gather.cc, reduce.cc, barrier.cc; details and links in
    docs/crossvalidation.md):

    ============== =============================================================================
    op             what ``rank`` sends, and to whom
    ============== =============================================================================
    allreduce      ring reduce-scatter then ring all-gather, both to the *previous* rank
                   (``sendRank = rank - 1``). S is cut into n chunks of m segments of at most
                   1 MiB (m >= 2); the rank sends every chunk but its own (S - L_i), then
                   every chunk but its previous rank's (S - L_i-1): about 2(n-1)/n * S
    reduce_scatter ProcessGroupGloo runs a full all-reduce of the input and keeps its chunk
                   (``reduce_scatter_tensor_coalesced``): as allreduce, S the full input
    allgather      ring to the next rank, (n-1) * S (S is the local shard)
    alltoall       S/n to every other member, pairwise (``splits`` exact when known)
    broadcast      binomial tree from the root: virtual rank v = (i - root) mod n sends S
                   to v + 2^k for every 2^k > v with v + 2^k < n
    reduce         ring reduce-scatter to the previous rank (S - L_i), then its reduced
                   chunk L_i straight to the root
    gather         S to the root, except the root itself
    scatter        the root sends S/n to every other member; the others send nothing
    send           S to ``peer``
    recv, barrier  nothing: the sender accounts for a transfer; gloo's barrier is a
                   dissemination barrier of empty messages (a 48 B preamble each)
    ============== =============================================================================

    Any other backend (NCCL, imported traces) gets the bandwidth-optimal rings and chains NCCL
    runs for large messages, in group order: allreduce 2(n-1)/n * S and reduce_scatter
    (n-1)/n * S to the next rank, allgather (n-1) * S to the next rank, broadcast a chain from
    the root along the ring (the root's previous rank, last in the chain, forwards nothing),
    reduce a chain into the root (every rank but the root sends S to the next rank); alltoall,
    gather, scatter, send, recv and barrier as for gloo.

    A rooted op whose root is unknown (``root`` not in the group) gets the expectation over a
    root drawn uniformly from the group, which keeps each rank's and the group's expected
    totals while single destinations are estimates. A rank outside its group, a group of one,
    a send without a recorded peer, and zero-byte transfers give an empty list. Unknown ops
    raise ``ValueError`` rather than being silently dropped.
    """
    if op not in KNOWN_OPS:
        raise ValueError(f"no traffic model for op {op!r}; known ops: {sorted(KNOWN_OPS)}")
    size = float(bytes)
    if op == "send":
        return [(int(peer), size)] if int(peer) >= 0 and size else []
    members = _parse_ranks(group_ranks)
    rank, root = int(rank), int(root)
    n = len(members)
    if op in ("recv", "barrier") or n <= 1 or rank not in members or not size:
        return []
    here = members.index(rank)
    if op == "alltoall":
        out = _alltoall_destinations(size, members, rank, splits, group_ranks)
    elif op == "gather" or op == "scatter":
        out = _direct_rooted(op, size, members, rank, root)
    elif str(backend).lower() == GLOO:
        out = _gloo_destinations(op, size, members, here, root, element_size)
    else:
        out = _ring_destinations(op, size, members, here, root)
    return _merged([(dst, b) for dst, b in out if b])


def _merged(pairs: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Sum the bytes of repeated destinations, keeping first-seen order."""
    total: dict[int, float] = {}
    for dst, b in pairs:
        total[dst] = total.get(dst, 0.0) + b
    return list(total.items())


def _alltoall_destinations(
    size: float, members: list[int], rank: int, splits: Any, group_ranks: Any
) -> list[tuple[int, float]]:
    n = len(members)
    exact = _parse_splits(splits)
    if exact is None:
        return [(m, size / n) for m in members if m != rank]
    if len(exact) != n:
        raise ValueError(
            f"{SPLIT_COLUMN} has {len(exact)} entries for a group of {n} ({group_ranks!r})"
        )
    return [(m, b) for m, b in zip(members, exact, strict=True) if m != rank]


# The MoE model's routing table (trace/moe.parquet): per rank, step, MoE layer and destination
# EP rank, the tokens the dispatch all-to-all sent there and received from there.
ROUTING_FILE = "moe.parquet"


def alltoall_splits_from_routing(ops: pd.DataFrame, routing: pd.DataFrame) -> pd.DataFrame:
    """``ops`` with the exact per-destination bytes (``split_bytes``) of the MoE token
    all-to-alls filled in from the routing table, for traces recorded without them.

    The MoE layer (commscope.workload.moe) issues per forward a dispatch all-to-all that sends
    ``tokens_sent[d]`` rows to EP rank d and receives ``tokens_received[d]``, a combine that
    sends the received rows back (``tokens_received[d]`` to d), and in backward the mirror of
    each (combine's backward sends as the dispatch, dispatch's as the combine); every row is one
    token of ``token_bytes`` = hidden x element size. ``routing`` (``moe.parquet``: ``rank``,
    ``step``, ``layer``, ``dst_rank``, ``tokens_sent``, ``tokens_received``; a layer run twice in
    a step repeats its rows in order) gives those counts per forward, but not which op record
    is which, so each record is matched by its totals: an all-to-all of the same rank, step and
    group whose input ``bytes`` and ``bytes_out`` are ``token_bytes`` times the sent and
    received (dispatch pattern) or received and sent (combine pattern) token totals of one
    forward. ``token_bytes`` is the value that explains the most records of the cell. A record
    gets ``split_bytes`` = ``token_bytes`` x the token counts of its pattern in group-rank order
    ("b0,b1,...") only when every forward it matches gives the same splits; other records
    (the per-expert count all-to-all, which is an even split, ambiguous matches, other ops)
    and records that already carry ``split_bytes`` are left as they are.
    """
    need = {"rank", "step", "layer", "dst_rank", "tokens_sent", "tokens_received"}
    if ops.empty or routing.empty or not need <= set(routing.columns) or "op" not in ops:
        return ops
    todo = ops["op"] == "alltoall"
    if SPLIT_COLUMN in ops:
        todo &= ops[SPLIT_COLUMN].map(_parse_splits).isna()
    if not todo.any():
        return ops
    rows = routing[list(need)].copy()
    # A layer that ran several forwards in one step (microbatches) repeats its rows in order.
    rows["forward"] = rows.groupby(["rank", "step", "layer", "dst_rank"]).cumcount()
    forwards: dict[tuple[int, int], list[dict[int, tuple[int, int]]]] = {}
    for (rank, step, _layer, _fwd), sub in rows.groupby(
        ["rank", "step", "layer", "forward"], sort=False
    ):
        counts = {
            int(d): (int(t), int(r))
            for d, t, r in sub[["dst_rank", "tokens_sent", "tokens_received"]].itertuples(
                index=False, name=None
            )
        }
        forwards.setdefault((int(rank), int(step)), []).append(counts)
    matches: dict[Any, list[tuple[int, tuple[int, ...]]]] = {}
    candidates = ops.loc[todo, ["rank", "step", "group_ranks", "bytes", "bytes_out"]]
    for idx, rank, step, group_ranks, size, size_out in candidates.itertuples(name=None):
        members = _parse_ranks(group_ranks)
        if pd.isna(step) or pd.isna(size) or pd.isna(size_out):
            continue
        found = []
        for counts in forwards.get((int(rank), int(step)), []):
            if set(counts) != set(members):
                continue
            sent = [counts[m][0] for m in members]
            received = [counts[m][1] for m in members]
            for first, (out_tokens, in_tokens) in enumerate(((sent, received), (received, sent))):
                token_bytes = _token_bytes(int(size), int(size_out), out_tokens, in_tokens)
                if token_bytes:
                    found.append((token_bytes, tuple(out_tokens), first == 0))
        if found:
            matches[idx] = found
    if not matches:
        return ops
    votes = pd.Series([tb for found in matches.values() for tb in {f[0] for f in found}])
    token_bytes = int(votes.mode().iloc[0])
    chosen: dict[Any, tuple[int, ...]] = {}
    tied: dict[tuple[Any, ...], list[Any]] = {}
    for idx, found in matches.items():
        patterns = {(tokens, dispatch) for tb, tokens, dispatch in found if tb == token_bytes}
        if len({tokens for tokens, _ in patterns}) == 1:
            chosen[idx] = patterns.pop()[0]
        elif len(patterns) == 2 and {d for _, d in patterns} == {True, False}:
            # One forward whose sent and received totals are equal: both patterns fit.
            key = (ops.at[idx, "rank"], ops.at[idx, "step"], _phase_of(ops, idx), *patterns)
            tied.setdefault(key, []).append(idx)
    # In a forward the dispatch (sent pattern) precedes the combine (received pattern), and in
    # backward the combine's mirror (sent pattern) precedes the dispatch's: within a phase the
    # records tied to one forward alternate sent, received in issue order.
    for key, idxs in tied.items():
        if len(idxs) % 2:
            continue
        by_pattern = {dispatch: tokens for tokens, dispatch in key[3:]}
        order = sorted(idxs, key=lambda i: int(ops.at[i, "seq"]) if "seq" in ops else i)
        for k, idx in enumerate(order):
            chosen[idx] = by_pattern[k % 2 == 0]
    splits = {idx: ",".join(str(token_bytes * t) for t in tokens) for idx, tokens in chosen.items()}
    if not splits:
        return ops
    out = ops.copy()
    if SPLIT_COLUMN not in out:
        out[SPLIT_COLUMN] = pd.Series(None, index=out.index, dtype="object")
    else:
        out[SPLIT_COLUMN] = out[SPLIT_COLUMN].astype("object")
    out.loc[list(splits), SPLIT_COLUMN] = pd.Series(splits)
    return out


def _phase_of(ops: pd.DataFrame, idx: Any) -> Any:
    return ops.at[idx, "phase"] if "phase" in ops else None


def _token_bytes(size: int, size_out: int, out_tokens: list[int], in_tokens: list[int]) -> int:
    """The bytes per token under which an all-to-all of ``size`` bytes in and ``size_out`` out
    sends ``out_tokens`` and receives ``in_tokens`` rows in total; 0 when none does."""
    sent, received = sum(out_tokens), sum(in_tokens)
    if sent > 0 and size % sent == 0:
        token_bytes = size // sent
        return token_bytes if token_bytes > 0 and size_out == token_bytes * received else 0
    # A rank that sends no token (its experts got none to return) still receives some.
    if sent == 0 == size and received > 0 and size_out % received == 0:
        return size_out // received
    return 0


def _direct_rooted(
    op: str, size: float, members: list[int], rank: int, root: int
) -> list[tuple[int, float]]:
    """gather and scatter: every backend sends directly between the root and each member."""
    n = len(members)
    others = [m for m in members if m != rank]
    if root not in members:
        return [(m, size / n) for m in others]
    if op == "gather":
        return [] if rank == root else [(root, size)]
    return [(m, size / n) for m in others] if rank == root else []


def _ring_destinations(
    op: str, size: float, members: list[int], here: int, root: int
) -> list[tuple[int, float]]:
    """The ring/chain model (NCCL for large messages): everything goes to the next rank."""
    n = len(members)
    succ = members[(here + 1) % n]
    if op == "allreduce":
        return [(succ, 2 * (n - 1) / n * size)]
    if op == "reduce_scatter":
        return [(succ, (n - 1) / n * size)]
    if op == "allgather":
        return [(succ, float((n - 1) * size))]
    # broadcast or reduce
    if root not in members:
        return [(succ, (n - 1) / n * size)]
    rank = members[here]
    if op == "broadcast":
        last = members[(members.index(root) - 1) % n]
        return [] if rank == last else [(succ, size)]
    return [] if rank == root else [(succ, size)]


def _gloo_destinations(
    op: str, size: float, members: list[int], here: int, root: int, element_size: int
) -> list[tuple[int, float]]:
    """gloo's algorithms (see :func:`op_destinations`); ``here`` is the context rank."""
    n = len(members)
    prev = members[(here - 1) % n]
    if op in ("allreduce", "reduce_scatter"):
        chunks = gloo_ring_chunks(size, n, element_size)
        total = float(sum(chunks))
        # Reduce-scatter: every chunk but its own; all-gather: every chunk but prev's.
        return [(prev, 2 * total - chunks[here] - chunks[(here - 1) % n])]
    if op == "allgather":
        return [(members[(here + 1) % n], float((n - 1) * size))]
    roots = [members.index(root)] if root in members else list(range(n))
    weight = 1.0 / len(roots)
    out: list[tuple[int, float]] = []
    for r in roots:
        if op == "broadcast":
            vrank = (here - r) % n
            out += [(members[(v + r) % n], size * weight) for v in _binomial_children(vrank, n)]
        else:  # reduce: ring reduce-scatter, then each reduced chunk straight to the root
            chunks = gloo_ring_chunks(size, n, element_size)
            out.append((prev, (float(sum(chunks)) - chunks[here]) * weight))
            if here != r:
                out.append((members[r], chunks[here] * weight))
    return out


def _binomial_children(vrank: int, n: int) -> list[int]:
    """Virtual ranks that ``vrank`` sends to in gloo's binomial-tree broadcast (root = 0).

    gloo/broadcast.cc: in round k (k = 0 .. ceil(log2 n) - 1) the ranks below 2^(k+1) take
    part and those with bit k clear send to their partner with bit k set.
    """
    children = []
    k = 0
    while (1 << k) < n:
        if vrank < (1 << k) and vrank + (1 << k) < n:
            children.append(vrank + (1 << k))
        k += 1
    return children


def gloo_ring_chunks(size: float, n: int, element_size: int = 1) -> list[int]:
    """Bytes of each of the n chunks gloo's ring all-reduce cuts ``size`` bytes into.

    From gloo/allreduce.cc ``ring()``: the buffer is split into ``numSegments`` segments, at
    least 2n and a multiple of n, of ``segmentBytes`` = ceil(S / numSegments) rounded up to
    whole elements and at most 1 MiB (:data:`GLOO_MAX_SEGMENT_BYTES`); chunk i is segments
    i*m .. i*m+m-1 (m = numSegments / n), clipped at the end of the buffer, so the last chunks
    can be shorter or empty. The chunks sum to S.
    """
    total = int(round(float(size)))
    elem = max(int(element_size), 1)
    if n <= 0 or total <= 0:
        return [0] * max(n, 0)
    max_segment = elem * max(1, GLOO_MAX_SEGMENT_BYTES // elem)
    num_segments = _round_up(max(-(-total // max_segment), 2 * n), n)
    segment = _round_up(-(-total // num_segments), elem)
    per_rank = num_segments // n
    chunk = per_rank * segment
    return [min(chunk, max(total - i * chunk, 0)) for i in range(n)]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# gloo/transport/tcp/pair.h: every message starts with an Op preamble of six size_t fields
# (nbytes, opcode, slot, offset, length, roffset) = 48 bytes, zero-length messages included.
GLOO_PREAMBLE_BYTES = 48
# gloo/transport/tcp/pair.cc: Pair::send() always writes NOTIFY_SEND_READY and then the data
# (two preambles from the sender); Pair::recv() always writes NOTIFY_RECV_READY (one preamble
# from the receiver back to the sender).
GLOO_SENDER_PREAMBLES = 2
GLOO_RECEIVER_PREAMBLES = 1


def op_messages(
    op: str,
    bytes: float,
    group_ranks: Any,
    rank: int,
    peer: int = -1,
    root: int = -1,
    backend: str = DEFAULT_BACKEND,
    element_size: int = 1,
) -> list[tuple[int, float]]:
    """How many messages ``rank`` sends for one op, and to whom: ``[(destination, count)]``.

    The companion of :func:`op_destinations` (same arguments, same algorithms), for the
    per-message protocol overhead (:data:`GLOO_PREAMBLE_BYTES` under gloo). Only gloo is
    modelled; other backends give an empty list. Under gloo: allreduce and reduce_scatter
    send one message per non-empty ring segment (see :func:`gloo_ring_chunks`) in each phase;
    allgather 2(n-1) (each shard in two halves); alltoall one to every other member;
    broadcast one per tree child; reduce its ring segments plus one to the root; gather one
    to the root; scatter one from the root to every other member; send one; barrier
    ceil(log2 n) empty messages to rank + 1, + 2, + 4, ... (dissemination); recv none. A
    rooted op with an unknown root gets the expectation over roots.
    """
    if op not in KNOWN_OPS:
        raise ValueError(f"no traffic model for op {op!r}; known ops: {sorted(KNOWN_OPS)}")
    if str(backend).lower() != GLOO:
        return []
    if op == "send":
        return [(int(peer), 1.0)] if int(peer) >= 0 else []
    members = _parse_ranks(group_ranks)
    rank, root = int(rank), int(root)
    n = len(members)
    if op == "recv" or n <= 1 or rank not in members:
        return []
    here = members.index(rank)
    prev, succ = members[(here - 1) % n], members[(here + 1) % n]
    if op == "barrier":
        out, d = [], 1
        while d < n:
            out.append((members[(here + d) % n], 1.0))
            d <<= 1
        return _merged(out)
    if op == "allgather":
        return [(succ, 2.0 * (n - 1))]
    if op == "alltoall":
        return [(m, 1.0) for m in members if m != rank]
    if op in ("allreduce", "reduce_scatter"):
        counts = _gloo_ring_segment_counts(bytes, n, element_size)
        total = sum(counts)
        return [(prev, float(2 * total - counts[here] - counts[(here - 1) % n]))]
    roots = [members.index(root)] if root in members else list(range(n))
    weight = 1.0 / len(roots)
    out = []
    for r in roots:
        if op == "broadcast":
            vrank = (here - r) % n
            out += [(members[(v + r) % n], weight) for v in _binomial_children(vrank, n)]
        elif op == "reduce":
            counts = _gloo_ring_segment_counts(bytes, n, element_size)
            out.append((prev, (sum(counts) - counts[here]) * weight))
            if here != r:
                out.append((members[r], weight))
        elif op == "gather":
            if here != r:
                out.append((members[r], weight))
        elif here == r:  # scatter
            out += [(m, weight) for m in members if m != rank]
    return _merged([(dst, c) for dst, c in out if c])


def _gloo_ring_segment_counts(size: float, n: int, element_size: int = 1) -> list[int]:
    """Non-empty ring segments in each of the n chunks of :func:`gloo_ring_chunks`."""
    total = int(round(float(size)))
    if n <= 0 or total <= 0:
        return [0] * max(n, 0)
    elem = max(int(element_size), 1)
    max_segment = elem * max(1, GLOO_MAX_SEGMENT_BYTES // elem)
    num_segments = _round_up(max(-(-total // max_segment), 2 * n), n)
    segment = _round_up(-(-total // num_segments), elem)
    per_rank = num_segments // n
    non_empty = -(-total // segment)
    return [min(per_rank, max(non_empty - i * per_rank, 0)) for i in range(n)]


def ring_send_bytes(
    op: str,
    bytes: float,
    group_size: int,
    is_root: bool | None = None,
    backend: str = DEFAULT_BACKEND,
) -> float:
    """Bytes one rank transmits for one op, knowing only the group size and, for rooted ops,
    whether the rank is the root: the total of :func:`op_destinations` over its destinations.

    With S = ``bytes`` and n = ``group_size`` the default (ring/chain) backend gives
    allreduce 2(n-1)/n * S,
    reduce_scatter and alltoall (n-1)/n * S, allgather (n-1) * S, send S, recv and barrier 0;
    for rooted ops: scatter root (n-1)/n * S, others 0; broadcast root S, others
    (n-2)/(n-1) * S (a non-root's place in the chain is unknown here, so this is the mean over
    the non-root places: every rank but the last forwards S once); reduce and gather root 0,
    others S. With ``is_root=None`` (root unknown) rooted ops give the expected share
    (n-1)/n * S. Whatever the algorithm, a rooted op moves (n-1) chunks over the group in
    total. A group of one sends nothing. ``backend="gloo"`` uses gloo's algorithms (e.g.
    reduce_scatter sends what an all-reduce of S sends, 2(n-1)/n * S).
    """
    n = max(int(group_size), 1)
    members = list(range(n))
    kw = {"backend": backend}
    if op in _ROOTED_OPS and is_root is not None and n > 1:
        # Rank 0 plays the root; a non-root averages over the places it could hold.
        if is_root:
            return _sent_total(op, bytes, members, rank=0, root=0, **kw)
        places = members[1:]
        return sum(_sent_total(op, bytes, members, rank=r, root=0, **kw) for r in places) / len(
            places
        )
    return _sent_total(op, bytes, members, rank=0, peer=1, **kw)


def _sent_total(
    op: str,
    bytes: float,
    members: Sequence[int],
    rank: int,
    peer: int = -1,
    root: int = -1,
    backend: str = DEFAULT_BACKEND,
) -> float:
    dests = op_destinations(op, bytes, members, rank, peer, root, backend=backend)
    return float(sum(b for _, b in dests))


def _parse_splits(splits: Any) -> list[float] | None:
    """Per-destination byte counts from a ``split_bytes`` value; None when absent."""
    if splits is None or splits is pd.NA:
        return None
    if isinstance(splits, float) and math.isnan(splits):
        return None
    if isinstance(splits, str):
        parts = [p for p in splits.split(",") if p.strip()]
        return [float(p) for p in parts] if parts else None
    values = [float(v) for v in splits]
    return values or None


def _splits_key(splits: Any) -> str | None:
    """A hashable, canonical form of a ``split_bytes`` value (parquet gives lists as arrays)."""
    values = _parse_splits(splits)
    return None if values is None else ",".join(f"{v:g}" for v in values)


def _ranks_key(group_ranks: Any) -> str | None:
    """``group_ranks`` as its canonical string, whatever form the trace stored it in."""
    members = _parse_ranks(group_ranks)
    return ",".join(map(str, members)) if members else None


def _sends(
    ops: pd.DataFrame,
    extra_keys: Sequence[str] = (),
    backend: str = DEFAULT_BACKEND,
    with_messages: bool = False,
) -> pd.DataFrame:
    """Every transfer the op records imply under ``backend``'s algorithms, summed over
    identical records.

    One row per (sender ``rank``, ``dst_rank``, ``op``, ``extra_keys``...) with ``bytes``
    summed over all matching records of ``ops`` and ``estimated`` true when the bytes come
    from a rooted op whose root was not recorded (see :func:`op_destinations`). Each record
    counts once, as its own rank's sends: a recv adds nothing, its send carries the bytes.
    ``with_messages`` adds a ``messages`` column (:func:`op_messages`) and keeps transfers
    that carry messages but no payload (gloo barriers).
    """
    cols = ["rank", "dst_rank", "op", *extra_keys, "bytes", "estimated"]
    if with_messages:
        cols.append("messages")
    if ops.empty:
        return pd.DataFrame(columns=cols)
    frame = pd.DataFrame(
        {
            "rank": ops["rank"].astype("int64"),
            "op": ops["op"].astype(str),
            "size": pd.to_numeric(ops["bytes"], errors="coerce").fillna(0).astype("float64"),
            "group_ranks": _hashable(ops["group_ranks"], _ranks_key)
            if "group_ranks" in ops
            else None,
            "peer": _rank_column(ops, "peer"),
            "root": _rank_column(ops, "root"),
            "splits": _hashable(ops[SPLIT_COLUMN], _splits_key) if SPLIT_COLUMN in ops else None,
            "element_size": _element_sizes(ops),
            **{k: ops[k] for k in extra_keys},
        },
        index=ops.index,
    )
    # Ops repeat identically every step: model each distinct kind once, then weight by count.
    keys = ["rank", "op", "size", "group_ranks", "peer", "root", "splits", "element_size"]
    keys += list(extra_keys)
    kinds = frame.groupby(keys, sort=False, dropna=False).size().rename("n").reset_index()
    records = []
    for kind in kinds.itertuples(index=False, name=None):
        rank, op, size, group_ranks, peer, root, splits, elem, *extra, n = kind
        dests = op_destinations(
            op, size, group_ranks, rank, peer, root, splits, backend=backend, element_size=elem
        )
        estimated = op in _ROOTED_OPS and int(root) not in _parse_ranks(group_ranks)
        if not with_messages:
            records += [(int(rank), int(dst), op, *extra, b * n, estimated) for dst, b in dests]
            continue
        counts = dict(
            op_messages(op, size, group_ranks, rank, peer, root, backend, element_size=elem)
        )
        payload = dict(dests)
        for dst in dict.fromkeys([*payload, *counts]):
            b, c = payload.get(dst, 0.0) * n, counts.get(dst, 0.0) * n
            records.append((int(rank), int(dst), op, *extra, b, estimated, c))
    out = pd.DataFrame(records, columns=cols)
    return out.astype({"rank": "int64", "dst_rank": "int64", "bytes": "float64"})


def _element_sizes(ops: pd.DataFrame) -> pd.Series | int:
    """Bytes per element of each op (``bytes / numel``; 1 where unknown), which sets how gloo
    rounds its ring segments."""
    if "numel" not in ops:
        return 1
    numel = pd.to_numeric(ops["numel"], errors="coerce").fillna(0).astype("int64")
    size = pd.to_numeric(ops["bytes"], errors="coerce").fillna(0).astype("int64")
    ratio = size // numel.where(numel > 0, 1)
    return ratio.where((numel > 0) & (ratio > 0), 1).astype("int64")


def _hashable(values: pd.Series, canonical: Callable[[Any], str | None]) -> pd.Series:
    """``values`` ready to group by: string columns as they are (the trace format, and a
    per-row Python call on millions of ops is what would cost), anything else (lists from
    parquet list columns) through ``canonical``."""
    if pd.api.types.infer_dtype(values, skipna=True) in ("string", "empty"):
        return values
    return values.map(canonical)


def _rank_column(ops: pd.DataFrame, col: str) -> pd.Series | int:
    """A global-rank column as int64 with -1 for null/absent (older traces lack ``root``)."""
    if col not in ops:
        return -1
    return pd.to_numeric(ops[col], errors="coerce").fillna(-1).astype("int64")


@dataclass
class _Placement:
    """Which node each rank runs on.

    ``recorded`` is what the trace says (every rank that issued an op); a rank that issued none
    (only ever a peer or a root) is placed by ``ranks_per_node``, as ranks on a node are
    contiguous, and at node -1 when that is unknown too.
    """

    recorded: dict[int, int]
    ranks_per_node: int = 0

    @classmethod
    def from_ops(cls, ops: pd.DataFrame, ranks_per_node: Any = None) -> _Placement:
        recorded: dict[int, int] = {}
        if not ops.empty and {"rank", "node"} <= set(ops.columns):
            pairs = ops[["rank", "node"]].drop_duplicates("rank")
            recorded = {int(r): int(n) for r, n in pairs.itertuples(index=False, name=None)}
        return cls(recorded, _positive_int(ranks_per_node))

    def node(self, rank: int) -> int:
        """The node of global rank ``rank`` (-1 when it cannot be placed)."""
        rank = int(rank)
        if rank in self.recorded:
            return self.recorded[rank]
        return rank // self.ranks_per_node if self.ranks_per_node and rank >= 0 else -1


def _positive_int(value: Any) -> int:
    """``value`` as a non-negative int; 0 when absent, null or not a number."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return 0
    return max(number, 0)


WIRE_COLUMNS = [
    "node",
    "window_start_ns",
    "window_end_ns",
    "wire_tx_bytes",
    "wire_rx_bytes",
    "framework_tx_bytes",
    "framework_tx_bytes_with_local",
    "estimated_tx_bytes",
    "wire_over_framework",
    "covered",
]


def wire_vs_framework(
    ops: pd.DataFrame,
    counters: pd.DataFrame,
    meta: dict[str, Any],
    window: tuple[int, int] | None = None,
) -> pd.DataFrame:
    """Per node: bytes its interface sent vs bytes its ranks had to send to other nodes.

    ``framework_tx_bytes`` sums the transfers of :func:`op_destinations` over the node's
    ranks, counting only those to another node (ranks on the same node talk over loopback,
    which the experiment interface never sees); ``framework_tx_bytes_with_local`` counts them
    all.
    ``estimated_tx_bytes`` is the part of ``framework_tx_bytes`` coming from rooted ops
    (broadcast/reduce/gather/scatter) whose root is not recorded: their per-node split is an
    even-share estimate. An optional ``root`` column in ``ops`` (global rank, -1 or null when
    not applicable) makes them exact. ``wire_over_framework`` = wire_tx_bytes /
    framework_tx_bytes: about 1.0-1.1 when the trace is complete (TCP/IP headers, ACKs for
    received data, rendezvous traffic add a few percent), well above 1 when ops are missing
    from the trace, below 1 when the model overstates (e.g. a tree instead of a ring).

    The window defaults to the span of the recorded ops (first issue to last completion), so
    store/rendezvous traffic before and after training does not count. ``meta`` is the
    cell.json dict; ``ranks_per_node`` places ranks missing from ``ops`` on nodes.
    ``ops`` and ``counters`` must hold a single cell.

    Columns: cell params, node, window_start_ns, window_end_ns, wire_tx_bytes,
    wire_rx_bytes, framework_tx_bytes, framework_tx_bytes_with_local, estimated_tx_bytes,
    wire_over_framework, covered.
    """
    params = _params_from(meta, ops, counters)
    if window is None:
        if ops.empty:
            return pd.DataFrame(columns=[*params, *WIRE_COLUMNS])
        ends = _as_int_ns(ops["t_end_ns"]) if "t_end_ns" in ops else np.empty(0, "int64")
        issues = _as_int_ns(ops["t_issue_ns"])
        window = (int(issues.min()), int(max(issues.max(), ends.max() if len(ends) else 0)))

    framework = _framework_tx_per_node(ops, meta)
    wire = (
        wire_bytes(counters, window)
        if not counters.empty
        else pd.DataFrame(columns=["node", "wire_tx_bytes", "wire_rx_bytes", "covered"])
    )
    out = pd.merge(framework, wire, on="node", how="outer").sort_values("node")
    for col in ("framework_tx_bytes", "framework_tx_bytes_with_local", "estimated_tx_bytes"):
        out[col] = out[col].astype("float64").fillna(0.0)
    out["covered"] = out["covered"].astype("boolean").fillna(False).astype(bool)
    out["window_start_ns"], out["window_end_ns"] = window
    fw = out["framework_tx_bytes"].where(out["framework_tx_bytes"] > 0)
    out["wire_over_framework"] = out["wire_tx_bytes"].astype("float64") / fw
    out["node"] = out["node"].astype("int64")
    return _with_params(params, out.reset_index(drop=True)[WIRE_COLUMNS])


def _framework_tx_per_node(ops: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """Per node, the bytes its ranks send under :func:`op_destinations`: to other nodes
    (``framework_tx_bytes``), in all (``..._with_local``), and the estimated part."""
    cols = ["node", "framework_tx_bytes", "framework_tx_bytes_with_local", "estimated_tx_bytes"]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    place = _Placement.from_ops(ops, meta.get("params", {}).get("ranks_per_node"))
    sends = _sends(ops, backend=_backend_of(meta))
    src = sends["rank"].map(place.node)
    # A destination that cannot be placed (-1) counts as remote, like any other node.
    remote = src != sends["dst_rank"].map(place.node)
    inter = sends["bytes"].where(remote, 0.0)
    per_node = pd.DataFrame(
        {
            "node": src,
            "framework_tx_bytes": inter,
            "framework_tx_bytes_with_local": sends["bytes"],
            "estimated_tx_bytes": inter.where(sends["estimated"].astype(bool), 0.0),
        },
        columns=cols,
    )
    # Nodes whose ranks only receive still get a row (of zeros) to sit next to their counters.
    nodes = sorted(set(place.recorded.values()))
    out = per_node.groupby("node").sum().reindex(nodes, fill_value=0.0).rename_axis("node")
    return out.astype("float64").reset_index()[cols]


def _parse_ranks(group_ranks: Any) -> list[int]:
    """Global ranks from a ``group_ranks`` value ("0,1", or a sequence); [] when null."""
    if group_ranks is None or group_ranks is pd.NA:
        return []
    if isinstance(group_ranks, float) and math.isnan(group_ranks):
        return []
    if isinstance(group_ranks, str):
        return [int(r) for r in group_ranks.split(",") if r.strip()]
    return [int(r) for r in group_ranks]


def _params_from(meta: dict[str, Any], *frames: pd.DataFrame) -> dict[str, Any]:
    """Cell parameters from the tables themselves, falling back to cell.json."""
    for df in frames:
        if not df.empty and _param_cols(df):
            return {c: df[c].iloc[0] for c in _param_cols(df)}
    params = {"cell": meta.get("cell")}
    params.update(meta.get("params", {}))
    return params


# --------------------------------------------------------------------------------------------
# Communication matrix: who sends how much to whom
# --------------------------------------------------------------------------------------------

COMM_MATRIX_COLUMNS = ["src_rank", "dst_rank", "src_node", "dst_node", "op", "bytes"]
NODE_MATRIX_COLUMNS = ["src_node", "dst_node", "bytes"]
# Optional ops.parquet column naming the parallel dimension of an op's group (dp, tp, pp, ...);
# when present the rank matrix keeps it, so traffic can be split by dimension.
GROUP_KIND_COLUMN = "group_kind"


def comm_matrix(
    ops: pd.DataFrame,
    warmup_steps: int = 0,
    measured_steps: Iterable[int] | None = None,
    backend: str = DEFAULT_BACKEND,
) -> pd.DataFrame:
    """Rank x rank communication matrix: bytes each rank sends to each other rank per step.

    Transfers come from :func:`op_destinations` applied to every op record (each record counts
    once, as its own rank's sends), so each sender's row total equals its modelled send volume
    (:func:`ring_send_bytes` where the place in a ring or chain does not matter). ``bytes`` is
    the mean per measured step: the total over the measured steps divided by their number, so
    a step without a given transfer counts as zero. Measured steps are ``measured_steps`` when
    given (e.g. the non-warm-up steps of :func:`step_times`, which also counts steps that
    issued no op), else every step number >= ``warmup_steps`` found in ``ops``; set-up ops
    outside any step (``step == -1``) never count. ``src_node``/``dst_node`` come from the
    trace, ranks that issued no op are placed by the ``ranks_per_node`` column (-1 when it is
    absent). Rows are sparse: only pairs that exchanged bytes appear. A rooted op whose root
    was not recorded contributes its expected share (see :func:`op_destinations`).
    ``backend`` picks the algorithms (cell.json ``backend``; gloo and NCCL differ, e.g. in
    reduce_scatter volume and ring direction).

    Columns: cell params, src_rank, dst_rank, src_node, dst_node, op, [group_kind,] bytes
    (group_kind only when ``ops`` has that column).
    """
    params = _param_cols(ops)
    extra = [GROUP_KIND_COLUMN] if GROUP_KIND_COLUMN in ops.columns else []
    cols = [*COMM_MATRIX_COLUMNS[:-1], *extra, "bytes"]
    fixed_steps = None if measured_steps is None else {int(s) for s in measured_steps}
    frames = []
    for cell_params, cell_ops in _per_cell(ops):
        if fixed_steps is None:
            steps = set(cell_ops.loc[cell_ops["step"] >= max(warmup_steps, 0), "step"].tolist())
        else:
            steps = {s for s in fixed_steps if s >= 0}
        if not steps:
            continue
        sends = _sends(cell_ops[cell_ops["step"].isin(steps)], extra, backend)
        if sends.empty:
            continue
        # Placed from the whole cell, so a rank only seen outside measured steps still maps.
        place = _Placement.from_ops(cell_ops, cell_params.get("ranks_per_node"))
        sends = sends.rename(columns={"rank": "src_rank"})
        sends["src_node"] = sends["src_rank"].map(place.node).astype("int64")
        sends["dst_node"] = sends["dst_rank"].map(place.node).astype("int64")
        keys = cols[:-1]
        per_step = _groupby(sends, keys)["bytes"].sum().div(len(steps)).reset_index()
        frames.append(_with_params(cell_params, per_step[cols]))
    return _concat(frames, [*params, *cols])


def node_matrix(rank_matrix: pd.DataFrame) -> pd.DataFrame:
    """Node x node matrix from :func:`comm_matrix`: bytes per step each node sends to each node.

    The diagonal (``src_node == dst_node``) is traffic between ranks of one node, which goes
    over loopback (or NVLink/PCIe) and never reaches the experiment interface; the off-diagonal
    entries are what the network has to carry. The matrix is complete: every pair of the
    cell's nodes (0 .. ``nodes``-1 when that column is present, plus any node seen) has a row,
    zero where nothing flows, so the diagonal is explicit and heatmaps are square.

    Columns: cell params, src_node, dst_node, bytes.
    """
    params = _param_cols(rank_matrix)
    frames = []
    for cell_params, sub in _per_cell(rank_matrix):
        nodes = set(sub["src_node"].astype(int)) | set(sub["dst_node"].astype(int))
        nodes |= set(range(_positive_int(cell_params.get("nodes"))))
        order = sorted(nodes)
        grid = pd.MultiIndex.from_product([order, order], names=["src_node", "dst_node"])
        summed = (
            sub.groupby(["src_node", "dst_node"])["bytes"]
            .sum()
            .reindex(grid, fill_value=0.0)
            .reset_index()
        )
        frames.append(_with_params(cell_params, summed[NODE_MATRIX_COLUMNS]))
    return _concat(frames, [*params, *NODE_MATRIX_COLUMNS])


def node_traffic_split(node_mat: pd.DataFrame) -> tuple[float, float]:
    """``(inter-node, intra-node)`` bytes of one cell's :func:`node_matrix`: the off-diagonal
    and the diagonal sums."""
    if node_mat.empty:
        return 0.0, 0.0
    diagonal = node_mat["src_node"] == node_mat["dst_node"]
    return float(node_mat.loc[~diagonal, "bytes"].sum()), float(
        node_mat.loc[diagonal, "bytes"].sum()
    )


# --------------------------------------------------------------------------------------------
# Cross-validation: the wire against the recorded ops, per node and per node pair
# --------------------------------------------------------------------------------------------

# Header bytes each packet the interface counts carries: Ethernet 14 + IPv4 20 + TCP 20 + 12
# of timestamp option (Linux default). With GSO/TSO on veth one counted packet is one
# super-packet with one header set; an ACK-only packet is this header alone.
HEADER_BYTES_PER_PACKET = 14 + 20 + 32

# Largest |unexplained remainder| accepted, as a fraction of the framework-implied bytes, and
# an absolute floor per node, direction and measured step for nodes that move little. Measured
# over the default study and justified in docs/crossvalidation.md.
CROSSCHECK_TOLERANCE = 0.02
CROSSCHECK_FLOOR_BYTES_PER_STEP = 4096

_PACKET_COLUMNS = ("tx_packets", "rx_packets")

CROSSCHECK_COLUMNS = [
    "node",
    "direction",
    "backend",
    "window_start_ns",
    "window_end_ns",
    "measured_steps",
    "wire_bytes",
    "wire_packets",
    "framework_bytes",
    "ratio",
    "remainder_bytes",
    "remainder_bytes_per_step",
    "header_bytes",
    "protocol_bytes",
    "retrans_bytes",
    "edge_bytes",
    "unexplained_bytes",
    "unexplained_bytes_per_step",
    "unexplained_fraction",
    "tolerance_bytes",
    "passed",
]


def framework_node_bytes(
    ops: pd.DataFrame, backend: str = DEFAULT_BACKEND, ranks_per_node: Any = None
) -> pd.DataFrame:
    """Per node, the bytes its ranks send to and receive from ranks on *other* nodes under
    :func:`op_destinations` (what its experiment interface must carry as payload), and the
    protocol bytes of the messages that carry them: under gloo each message costs its sender
    two 48 B preambles (send-ready notice, data header) and its receiver one (recv-ready
    notice), see :func:`op_messages`; 0 for backends without a message model.

    ``ops`` is one cell's ops, already cut to the window of interest. Traffic between ranks of
    one node goes over loopback and is left out. A rank that cannot be placed counts as
    remote.

    Columns: node, framework_tx_bytes, framework_rx_bytes, protocol_tx_bytes,
    protocol_rx_bytes.
    """
    cols = [
        "node",
        "framework_tx_bytes",
        "framework_rx_bytes",
        "protocol_tx_bytes",
        "protocol_rx_bytes",
    ]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    place = _Placement.from_ops(ops, ranks_per_node)
    sends = _sends(ops, backend=backend, with_messages=True)
    src = sends["rank"].map(place.node)
    dst = sends["dst_rank"].map(place.node)
    remote = src != dst
    payload = sends["bytes"].where(remote, 0.0)
    messages = sends["messages"].where(remote, 0.0)
    sent, received = messages.groupby(src).sum(), messages.groupby(dst).sum()
    sums = {
        "framework_tx_bytes": payload.groupby(src).sum(),
        "framework_rx_bytes": payload.groupby(dst).sum(),
        "protocol_tx_bytes": _protocol_bytes(sent, received),
        "protocol_rx_bytes": _protocol_bytes(received, sent),
    }
    nodes = set(place.recorded.values())
    for series in sums.values():
        nodes |= {int(v) for v in series.index}
    nodes = sorted(n for n in nodes if n >= 0)
    out = pd.DataFrame({"node": nodes})
    for col, series in sums.items():
        out[col] = series.reindex(nodes, fill_value=0.0).to_numpy(dtype="float64")
    return out[cols]


def _protocol_bytes(own: pd.Series, reverse: pd.Series) -> pd.Series:
    """Preamble bytes on a link direction carrying ``own`` messages one way and acknowledging
    ``reverse`` messages coming the other way (gloo's TCP transport; 0 for other backends,
    whose message counts are 0)."""
    own, reverse = own.align(reverse, fill_value=0.0)
    return GLOO_PREAMBLE_BYTES * (GLOO_SENDER_PREAMBLES * own + GLOO_RECEIVER_PREAMBLES * reverse)


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


def _instance_keys(ops: pd.DataFrame) -> list[pd.Series] | None:
    """Columns that identify an op *instance* (all records of one collective or one send/recv
    pair): a collective's (``group``, ``seq``), a P2P pair's (``group``, sender, receiver,
    ``seq``). None when the trace lacks those columns."""
    if not {"group", "seq", "op", "rank", "peer"} <= set(ops.columns):
        return None
    p2p = ops["op"].isin(P2P_OPS)
    is_send = ops["op"] == "send"
    sender = ops["rank"].where(is_send | ~p2p, ops["peer"]).where(p2p, -1)
    receiver = ops["peer"].where(is_send, ops["rank"]).where(p2p, -1)
    return [
        ops["group"].astype(str).rename("group"),
        sender.astype("int64").rename("sender"),
        receiver.astype("int64").rename("receiver"),
        ops["seq"].astype("int64").rename("seq"),
    ]


def _ops_in_window(ops: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """The op records whose transfers happen inside ``window`` (the counters' window).

    No byte of an op moves before every member has issued it (gloo posts a send-ready
    notice and waits for the peer's recv-ready one), so an op instance is placed at its last
    member's issue time and all its records are kept or dropped together (instances as in
    :func:`_instance_keys`). Without those columns each record is placed at its own issue
    time. This keeps a collective that one rank issued just before the window (pipeline
    stages start their steps at different times) from counting on one side only. Whether the
    instance's bytes also *end* inside the window is up to the window: see
    :func:`quiet_window`.
    """
    if ops.empty:
        return ops
    issued = pd.to_numeric(ops["t_issue_ns"], errors="coerce")
    keys = _instance_keys(ops)
    if keys is not None:
        issued = issued.groupby(keys, dropna=False).transform("max")
    return ops[(issued >= window[0]) & (issued <= window[1])]


def quiet_window(
    ops: pd.DataFrame, window: tuple[int, int], ranks_per_node: Any = None
) -> tuple[int, int]:
    """``window`` with each edge moved forward, if needed, to an instant when no op that
    crosses nodes is moving bytes, so the interface counters and the ops counted by
    :func:`_ops_in_window` cover the same transfers.

    An op instance moves its bytes between its last member's issue (before that gloo sends
    nothing but a 48 B recv-ready notice) and its last member's completion (``t_end_ns``; an
    instance without one counts as instantaneous). Only instances whose members sit on more
    than one node matter: the others never reach the experiment interface. An edge that falls
    inside such an instance (or a chain of overlapping ones) moves to the end of that busy
    stretch: a warm-up op still running when the first measured step begins is then left out
    whole, a last-step op still running at the end is counted whole. Steps of different
    pipeline stages and data-parallel groups overlap, so the nominal edges (first rank's
    step start, last rank's step end) can fall in the middle of another rank's all-reduce;
    cutting there would count its bytes on the wire but not in the model, or the reverse.
    The window is returned unchanged when the trace lacks instance columns or when moving
    would leave it empty.
    """
    keys = _instance_keys(ops) if not ops.empty else None
    if keys is None or "t_end_ns" not in ops:
        return window
    issued = pd.to_numeric(ops["t_issue_ns"], errors="coerce")
    ended = pd.to_numeric(ops["t_end_ns"], errors="coerce").fillna(issued)
    place = _Placement.from_ops(ops, ranks_per_node)
    p2p = ops["op"].isin(P2P_OPS)
    group_ranks = ops["group_ranks"].astype(str)
    spans_nodes = {
        g: len({place.node(r) for r in _parse_ranks(g)}) > 1 for g in group_ranks.unique()
    }
    remote = group_ranks.map(spans_nodes).astype(bool)
    peer_node = pd.to_numeric(ops["peer"], errors="coerce").fillna(-1).map(place.node)
    remote = remote.where(~p2p, ops["rank"].map(place.node) != peer_node)
    frame = pd.DataFrame({"issued": issued, "ended": np.maximum(ended, issued), "remote": remote})
    inst = frame.groupby(keys, dropna=False).agg(
        start=("issued", "max"), end=("ended", "max"), remote=("remote", "any")
    )
    inst = inst[inst["remote"] & inst["start"].notna()].sort_values("start")
    if inst.empty:
        return window
    starts = inst["start"].to_numpy(dtype="int64")
    # Running maximum of the ends: busy[i] is where the stretch holding instance i ends at
    # the earliest, so an edge is inside a busy stretch when some earlier start has a later end.
    busy = np.maximum.accumulate(inst["end"].to_numpy(dtype="int64"))

    def moved(edge: int) -> int:
        while True:
            before = int(np.searchsorted(starts, edge, side="left"))
            if before == 0 or busy[before - 1] <= edge:
                break
            edge = int(busy[before - 1])
        # Then to the middle of the quiet gap around it: the counters are sampled, not
        # continuous, and an edge right at the end of a burst is interpolated between a sample
        # inside the burst and one after it, which puts part of the burst on the wrong side
        # (seen unshaped, where a 0.5 MB all-reduce takes under a millisecond). In the middle
        # of a gap of a few sample periods both neighbouring samples are quiet.
        prev_end = int(busy[before - 1]) if before > 0 else None
        next_start = int(starts[before]) if before < len(starts) else None
        if prev_end is not None and next_start is not None:
            return (prev_end + next_start) // 2
        return edge

    start, end = moved(int(window[0])), moved(int(window[1]))
    return (start, end) if start < end else window


def check_window(traces: CellTraces) -> tuple[tuple[int, int], int] | None:
    """The window the cross-validation compares the wire and the ops over, and the number of
    measured steps in it: :func:`training_window` with its edges moved to quiet instants
    (:func:`quiet_window`). None when the cell recorded no steps."""
    st = step_times(traces.steps, traces.warmup_steps)
    if st.empty:
        return None
    window = quiet_window(traces.ops, training_window(st), traces.params.get("ranks_per_node"))
    return window, int((~st["warmup"].astype(bool)).sum()) or len(st)


def _tolerance_bytes(framework: np.ndarray, steps: int, tolerance: float) -> np.ndarray:
    return np.maximum(tolerance * framework, CROSSCHECK_FLOOR_BYTES_PER_STEP * max(steps, 1))


def crosscheck(
    traces: CellTraces,
    tolerance: float = CROSSCHECK_TOLERANCE,
    backend: str | None = None,
) -> pd.DataFrame:
    """Wire bytes against the bytes the recorded ops imply, per node and direction.

    Over the training window (:func:`training_window`: first measured step's start to the
    last step's end), for each node and direction (``tx``, ``rx``):

    * ``wire_bytes``, ``wire_packets``: the interface counters' increase in the window;
    * ``framework_bytes``: payload the ops issued in the window imply for that node under the
      backend's algorithms (:func:`framework_node_bytes`); ``backend`` overrides cell.json's;
    * ``ratio`` = wire / framework; ``remainder_bytes`` = wire - framework (and per measured
      step);
    * ``header_bytes`` = :data:`HEADER_BYTES_PER_PACKET` x packets: every counted packet
      (a GSO super-packet or an ACK) carries one Ethernet+IPv4+TCP header set;
    * ``protocol_bytes``: the backend's per-message framing (gloo: 2 x 48 B preambles per
      message sent, 1 x 48 B per message received, :func:`framework_node_bytes`);
    * ``retrans_bytes``: TCP payload the node's connections to other nodes retransmitted in
      the window (tx) or that other nodes retransmitted to it (rx), from ``sockets.parquet``
      (:func:`retransmitted_bytes`); NaN for runs without socket statistics;
    * ``unexplained_bytes`` = remainder - headers - protocol (and per step),
      ``unexplained_fraction`` = unexplained / framework: what neither the ops nor the
      headers account for (store traffic, retransmissions, ops missing from the trace);
    * ``edge_bytes``: bytes the counters saw in the sample intervals straddling the window
      edges, which interpolation cannot place on either side (:func:`wire_counts`);
    * ``passed``: -``tolerance_bytes`` - edge_bytes <= unexplained <= ``tolerance_bytes`` +
      retrans_bytes + edge_bytes,
      ``tolerance_bytes`` = max(``tolerance`` x framework,
      :data:`CROSSCHECK_FLOOR_BYTES_PER_STEP` x measured steps). A retransmission adds its
      bytes to the counters only when the original was counted too (lost after the
      interface, e.g. at an ingress cap or in the receiver's backlog, or resent spuriously),
      so it explains an excess up to its size and never a shortfall.

    The window is :func:`check_window`'s: the training window with its edges moved to instants
    when no op crossing nodes is in flight (:func:`quiet_window`), ops counted by instance
    (:func:`_ops_in_window`).

    A cell without counters or measured steps gives an empty table with these columns.

    Columns: cell params, node, direction, backend, window_start_ns, window_end_ns,
    measured_steps, wire_bytes, wire_packets, framework_bytes, ratio, remainder_bytes,
    remainder_bytes_per_step, header_bytes, protocol_bytes, retrans_bytes, edge_bytes,
    unexplained_bytes, unexplained_bytes_per_step, unexplained_fraction, tolerance_bytes, passed.
    """
    params = traces.params
    empty = pd.DataFrame(columns=[*params, *CROSSCHECK_COLUMNS])
    checked = check_window(traces)
    if checked is None or traces.counters.empty:
        return empty
    window, n_steps = checked
    backend = backend or traces.backend
    framework = framework_node_bytes(
        _ops_in_window(traces.ops, window), backend, params.get("ranks_per_node")
    )
    wire = wire_counts(traces.counters, window)
    merged = pd.merge(wire, framework, on="node", how="outer").sort_values("node")
    merged = merged.fillna({c: 0.0 for c in merged.columns if c not in ("node", "covered")})
    retrans = retransmitted_bytes(traces.sockets, window)
    merged = merged.merge(retrans, on="node", how="left")
    frames = []
    for direction in ("tx", "rx"):
        wire_b = merged[f"{direction}_bytes"].astype("float64").to_numpy()
        packets = merged[f"{direction}_packets"].astype("float64").to_numpy()
        fw = merged[f"framework_{direction}_bytes"].astype("float64").to_numpy()
        remainder = wire_b - fw
        headers = HEADER_BYTES_PER_PACKET * packets
        protocol = merged[f"protocol_{direction}_bytes"].astype("float64").to_numpy()
        resent = merged[f"retrans_{direction}_bytes"].astype("float64").to_numpy()
        unexplained = remainder - headers - protocol
        allowed = _tolerance_bytes(fw, n_steps, tolerance)
        edge = merged[f"{direction}_edge_bytes"].astype("float64").to_numpy()
        # A retransmission is wire bytes no op asked for when its original was counted too
        # (lost after the interface: an ingress cap, the receiver's backlog), and none when
        # the original was dropped before it (an egress qdisc): an excess up to it is explained.
        # Bytes the counters saw inside a sample interval straddling an edge can belong to
        # either side: that much either way is not a disagreement, only unresolved.
        within = (unexplained >= -allowed - edge) & (
            unexplained <= allowed + np.nan_to_num(resent) + edge
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(fw > 0, wire_b / fw, np.nan)
            fraction = np.where(fw > 0, unexplained / fw, np.nan)
        frames.append(
            pd.DataFrame(
                {
                    "node": merged["node"].astype("int64").to_numpy(),
                    "direction": direction,
                    "backend": backend,
                    "window_start_ns": window[0],
                    "window_end_ns": window[1],
                    "measured_steps": n_steps,
                    "wire_bytes": wire_b,
                    "wire_packets": packets,
                    "framework_bytes": fw,
                    "ratio": ratio,
                    "remainder_bytes": remainder,
                    "remainder_bytes_per_step": remainder / n_steps,
                    "header_bytes": headers,
                    "protocol_bytes": protocol,
                    "retrans_bytes": resent,
                    "edge_bytes": edge,
                    "unexplained_bytes": unexplained,
                    "unexplained_bytes_per_step": unexplained / n_steps,
                    "unexplained_fraction": fraction,
                    "tolerance_bytes": allowed,
                    "passed": within,
                }
            )
        )
    out = pd.concat(frames, ignore_index=True)
    return _with_params(params, out[CROSSCHECK_COLUMNS])


# Packet-header capture of a cell (optional), next to its other trace tables.
WIRE_FLOWS_FILE = "wire_flows.parquet"
WIRE_FLOW_COLUMNS = ["t_ns", "src_node", "dst_node", "bytes", "packets"]

MATRIX_CHECK_COLUMNS = [
    "src_node",
    "dst_node",
    "backend",
    "measured_steps",
    "framework_bytes",
    "wire_bytes",
    "wire_packets",
    "header_bytes",
    "protocol_bytes",
    "wire_payload_bytes",
    "ratio",
    "unexplained_bytes",
    "tolerance_bytes",
    "passed",
]


def matrix_check(
    traces: CellTraces,
    wire_flows: pd.DataFrame,
    tolerance: float = CROSSCHECK_TOLERANCE,
    backend: str | None = None,
) -> pd.DataFrame:
    """The framework-derived node x node matrix against the one captured on the wire.

    ``wire_flows`` is ``trace/wire_flows.parquet`` (packet headers captured on the
    experiment interfaces, one row per 1 ms bin and node pair: ``t_ns`` bin start on the
    counters' clock, ``src_node``, ``dst_node``, ``bytes`` = IP total length + 14 B Ethernet
    header, ``packets``). Over the training window (bins starting inside it), for every
    ordered pair of distinct nodes: ``framework_bytes`` the ops issued in the window send from
    src to dst under the backend's algorithms (:func:`op_destinations`), ``wire_bytes`` and
    ``wire_packets`` captured, ``header_bytes`` = :data:`HEADER_BYTES_PER_PACKET` x packets
    (ACKs for the reverse direction are headers only, so they drop out here),
    ``protocol_bytes`` the backend's message framing (as in :func:`crosscheck`; the window is
    :func:`check_window`'s),
    ``wire_payload_bytes`` = wire - headers, ``ratio`` = payload / framework,
    ``unexplained_bytes`` = payload - protocol - framework and ``passed`` against the same
    tolerance as :func:`crosscheck`. Without captured flows (capture off, an empty file) the
    table is empty with these columns.

    Columns: cell params, src_node, dst_node, backend, measured_steps, framework_bytes,
    wire_bytes, wire_packets, header_bytes, protocol_bytes, wire_payload_bytes, ratio,
    unexplained_bytes, tolerance_bytes, passed.
    """
    params = traces.params
    empty = pd.DataFrame(columns=[*params, *MATRIX_CHECK_COLUMNS])
    checked = check_window(traces)
    if wire_flows is None or wire_flows.empty or checked is None:
        return empty
    window, n_steps = checked
    backend = backend or traces.backend
    in_window = wire_flows[(wire_flows["t_ns"] >= window[0]) & (wire_flows["t_ns"] < window[1])]
    wire = (
        in_window.groupby(["src_node", "dst_node"])[["bytes", "packets"]]
        .sum()
        .rename(columns={"bytes": "wire_bytes", "packets": "wire_packets"})
    )
    ops = _ops_in_window(traces.ops, window)
    framework = protocol = pd.Series(dtype="float64")
    place = _Placement.from_ops(traces.ops, params.get("ranks_per_node"))
    if not ops.empty:
        sends = _sends(ops, backend=backend, with_messages=True)
        sends["src_node"] = sends["rank"].map(place.node)
        sends["dst_node"] = sends["dst_rank"].map(place.node)
        framework = sends.groupby(["src_node", "dst_node"])["bytes"].sum()
        messages = sends.groupby(["src_node", "dst_node"])["messages"].sum()
        # The receiver's recv-ready notice of a message travels the opposite way. Rebuild the
        # index rather than swaplevel(): that swaps the level names too, and aligning by name
        # would put the notices back on the data direction.
        reverse = pd.Series(
            messages.to_numpy(),
            index=pd.MultiIndex.from_arrays(
                [
                    messages.index.get_level_values("dst_node"),
                    messages.index.get_level_values("src_node"),
                ],
                names=["src_node", "dst_node"],
            ),
        )
        protocol = _protocol_bytes(messages, reverse)
    nodes = set(range(_positive_int(params.get("nodes")))) | set(place.recorded.values())
    nodes |= {int(v) for v in wire.index.get_level_values(0)}
    nodes |= {int(v) for v in wire.index.get_level_values(1)}
    pairs = [(a, b) for a in sorted(nodes) for b in sorted(nodes) if a != b and a >= 0 and b >= 0]
    grid = pd.MultiIndex.from_tuples(pairs, names=["src_node", "dst_node"])
    out = pd.DataFrame(index=grid)
    out["framework_bytes"] = framework.reindex(grid, fill_value=0.0).astype("float64")
    out["wire_bytes"] = wire["wire_bytes"].reindex(grid, fill_value=0).astype("float64")
    out["wire_packets"] = wire["wire_packets"].reindex(grid, fill_value=0).astype("float64")
    out = out.reset_index()
    out["backend"] = backend
    out["measured_steps"] = n_steps
    out["header_bytes"] = HEADER_BYTES_PER_PACKET * out["wire_packets"]
    out["protocol_bytes"] = protocol.reindex(grid, fill_value=0.0).astype("float64").to_numpy()
    out["wire_payload_bytes"] = out["wire_bytes"] - out["header_bytes"]
    fw = out["framework_bytes"]
    out["ratio"] = out["wire_payload_bytes"] / fw.where(fw > 0)
    out["unexplained_bytes"] = out["wire_payload_bytes"] - out["protocol_bytes"] - fw
    out["tolerance_bytes"] = _tolerance_bytes(fw.to_numpy(), n_steps, tolerance)
    out["passed"] = out["unexplained_bytes"].abs() <= out["tolerance_bytes"]
    return _with_params(params, out[MATRIX_CHECK_COLUMNS])


CROSSCHECK_SUMMARY_COLUMNS = [
    "strategy",
    "backend",
    "cells",
    "cells_passed",
    "ratio_min",
    "ratio_median",
    "ratio_max",
    "unexplained_fraction_min",
    "unexplained_fraction_median",
    "unexplained_fraction_max",
]


def crosscheck_by_strategy(crosscheck_table: pd.DataFrame | Path) -> pd.DataFrame:
    """Per strategy: how many cells passed the cross-validation, and the spread of the wire /
    framework ratio and of the unexplained fraction over its cells.

    ``crosscheck_table`` is the aggregated :func:`crosscheck` table (or the aggregate
    directory / parquet file holding it). A cell passes when every node and direction does.
    Per cell the ratio and the unexplained fraction are taken over all its nodes' tx bytes
    (sum wire / sum framework; tx and rx carry the same bytes in a closed cluster); min,
    median and max are over the strategy's cells.

    Columns: strategy, backend, cells, cells_passed, ratio_min, ratio_median, ratio_max,
    unexplained_fraction_min, unexplained_fraction_median, unexplained_fraction_max.
    """
    table = crosscheck_table
    if not isinstance(table, pd.DataFrame):
        path = Path(table)
        table = pd.read_parquet(path / "crosscheck.parquet" if path.is_dir() else path)
    if table.empty or "strategy" not in table.columns:
        return pd.DataFrame(columns=CROSSCHECK_SUMMARY_COLUMNS)
    tx = table[table["direction"] == "tx"]
    per_cell = (
        tx.groupby(["strategy", "backend", "cell"], dropna=False)
        .agg(
            wire=("wire_bytes", "sum"),
            framework=("framework_bytes", "sum"),
            unexplained=("unexplained_bytes", "sum"),
        )
        .reset_index()
    )
    passed = table.groupby("cell")["passed"].all()
    per_cell["passed"] = per_cell["cell"].map(passed).astype(bool)
    fw = per_cell["framework"].where(per_cell["framework"] > 0)
    per_cell["ratio"] = per_cell["wire"] / fw
    per_cell["fraction"] = per_cell["unexplained"] / fw
    out = (
        per_cell.groupby(["strategy", "backend"], dropna=False)
        .agg(
            cells=("cell", "nunique"),
            cells_passed=("passed", "sum"),
            ratio_min=("ratio", "min"),
            ratio_median=("ratio", "median"),
            ratio_max=("ratio", "max"),
            unexplained_fraction_min=("fraction", "min"),
            unexplained_fraction_median=("fraction", "median"),
            unexplained_fraction_max=("fraction", "max"),
        )
        .reset_index()
    )
    out["cells_passed"] = out["cells_passed"].astype("int64")
    return out[CROSSCHECK_SUMMARY_COLUMNS]


# --------------------------------------------------------------------------------------------
# Socket statistics: what TCP itself saw
# --------------------------------------------------------------------------------------------

# Per node and connection at a low rate (docs/traces.md, sockets), next to the other traces.
SOCKETS_FILE = "sockets.parquet"
_CONNECTION = ["node", "src", "sport", "dst", "dport"]
_SOCKET_CUMULATIVE = ("total_retrans", "bytes_retrans", "bytes_sent")

SOCKET_COLUMNS = [
    "node",
    "window_start_ns",
    "window_end_ns",
    "connections",
    "rtt_median_ms",
    "rtt_p99_ms",
    "cwnd_max",
    "retrans_segments",
    "bytes_retrans",
    "bytes_sent",
    "retrans_share",
]


def _remote_connections(sockets: pd.DataFrame) -> pd.DataFrame:
    """Rows of connections to another address (a connection to the node's own experiment
    address runs over loopback and never reaches the interface), numbers as float64 (the
    file's nullable UInt64 turns into NaN)."""
    rows = sockets
    if {"src", "dst"} <= set(rows.columns):
        rows = rows[rows["src"].astype(str) != rows["dst"].astype(str)]
    numeric = [c for c in rows.columns if c not in _CONNECTION and c not in PARAM_COLUMNS]
    out = rows.copy()
    for col in numeric:
        out[col] = pd.to_numeric(out[col], errors="coerce").astype("float64")
    for col in _CONNECTION:
        if col not in out:
            out[col] = ""
    return out


def _connection_increase(rows: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """Per connection, how much each cumulative counter of :data:`_SOCKET_CUMULATIVE` grew
    over ``window``: max - min over the samples from the last one at or before the window's
    start to the first one at or after its end (the samples bracketing the window, so a
    counter that moved inside it is never missed at a sampling rate of a few Hz).

    Columns: node, src, sport, dst, dport, in_window (a sample inside the window), and one
    per cumulative counter present.
    """
    present = [c for c in _SOCKET_CUMULATIVE if c in rows.columns]
    records = []
    for key, conn in rows.groupby(_CONNECTION, sort=True, dropna=False):
        t = conn["t_ns"].to_numpy(dtype="int64")
        order = np.argsort(t, kind="stable")
        t = t[order]
        first = max(int(np.searchsorted(t, window[0], side="right")) - 1, 0)
        last = min(int(np.searchsorted(t, window[1], side="left")), len(t) - 1)
        rec = dict(zip(_CONNECTION, key, strict=True))
        rec["in_window"] = bool(((t >= window[0]) & (t <= window[1])).any())
        for col in present:
            values = conn[col].to_numpy(dtype="float64")[order][first : last + 1]
            finite = values[np.isfinite(values)]
            rec[col] = float(finite.max() - finite.min()) if len(finite) else float("nan")
        records.append(rec)
    return pd.DataFrame(records, columns=[*_CONNECTION, "in_window", *present])


def socket_stats(traces: CellTraces) -> pd.DataFrame:
    """TCP's own view of each node's training traffic, one row per node, over the
    cross-validation window (:func:`check_window`).

    From ``sockets.parquet`` (``struct tcp_info`` per node and connection at ~10 Hz), over the
    node's connections to other nodes (its own experiment address excluded: that is
    loopback):

    * ``connections``: connections with a sample inside the window;
    * ``rtt_median_ms``, ``rtt_p99_ms``: smoothed RTT (``rtt_us``) over those samples;
    * ``cwnd_max``: largest congestion window (segments);
    * ``retrans_segments``, ``bytes_retrans``, ``bytes_sent``: growth of ``total_retrans``,
      ``bytes_retrans`` and ``bytes_sent`` (which includes retransmissions) per connection
      over the window (max - min over the samples bracketing it), summed over connections;
    * ``retrans_share`` = bytes_retrans / bytes_sent (NaN when nothing was sent).

    Runs without socket statistics (no file, an empty one, no steps) give an empty table
    with these columns.

    Columns: cell params, node, window_start_ns, window_end_ns, connections, rtt_median_ms,
    rtt_p99_ms, cwnd_max, retrans_segments, bytes_retrans, bytes_sent, retrans_share.
    """
    params = traces.params
    empty = pd.DataFrame(columns=[*params, *SOCKET_COLUMNS])
    checked = check_window(traces)
    sockets = traces.sockets
    if checked is None or sockets.empty or not {"node", "t_ns"} <= set(sockets.columns):
        return empty
    window = checked[0]
    rows = _remote_connections(sockets)
    nodes = sorted(int(n) for n in pd.unique(sockets["node"]))
    inside = rows[(rows["t_ns"] >= window[0]) & (rows["t_ns"] <= window[1])]
    grown = _connection_increase(rows, window)
    records = []
    for node in nodes:
        here = inside[inside["node"] == node]
        conns = grown[(grown["node"] == node) & grown["in_window"]]
        rtt_ms = here["rtt_us"].dropna() / 1000.0 if "rtt_us" in here else pd.Series([], "f8")
        cwnd = here["cwnd"].dropna() if "cwnd" in here else pd.Series([], dtype="float64")
        sums = {
            c: float(conns[c].sum(min_count=1)) if c in conns else np.nan
            for c in _SOCKET_CUMULATIVE
        }
        sent = sums["bytes_sent"]
        records.append(
            {
                "node": node,
                "window_start_ns": window[0],
                "window_end_ns": window[1],
                "connections": len(conns),
                "rtt_median_ms": float(rtt_ms.median()) if len(rtt_ms) else np.nan,
                "rtt_p99_ms": float(rtt_ms.quantile(0.99)) if len(rtt_ms) else np.nan,
                "cwnd_max": float(cwnd.max()) if len(cwnd) else np.nan,
                "retrans_segments": sums["total_retrans"],
                "bytes_retrans": sums["bytes_retrans"],
                "bytes_sent": sent,
                "retrans_share": sums["bytes_retrans"] / sent if sent > 0 else np.nan,
            }
        )
    out = pd.DataFrame(records, columns=SOCKET_COLUMNS)
    return _with_params(params, out)


def retransmitted_bytes(sockets: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """Per node, the TCP payload retransmitted over ``window`` on connections between nodes:
    ``retrans_tx_bytes`` by the node's own connections, ``retrans_rx_bytes`` by other nodes'
    connections to the node's address (each node's address is the ``src`` of its rows).
    Growth of ``bytes_retrans`` per connection as in :func:`socket_stats`. Without socket
    statistics the table is empty (and :func:`crosscheck` shows NaN).

    Columns: node, retrans_tx_bytes, retrans_rx_bytes.
    """
    cols = ["node", "retrans_tx_bytes", "retrans_rx_bytes"]
    if sockets.empty or not {"node", "t_ns", "bytes_retrans"} <= set(sockets.columns):
        return pd.DataFrame(columns=cols).astype({"node": "int64"})
    rows = _remote_connections(sockets)
    grown = _connection_increase(rows, window)
    node_of = (
        {
            str(a): int(n)
            for n, a in sockets[["node", "src"]].drop_duplicates().itertuples(index=False)
        }
        if "src" in sockets
        else {}
    )
    tx = grown.groupby("node")["bytes_retrans"].sum()
    rx = grown.assign(dst_node=grown["dst"].astype(str).map(node_of)).dropna(subset=["dst_node"])
    rx = rx.groupby(rx["dst_node"].astype("int64"))["bytes_retrans"].sum()
    nodes = sorted(int(n) for n in pd.unique(sockets["node"]))
    return pd.DataFrame(
        {
            "node": nodes,
            "retrans_tx_bytes": tx.reindex(nodes, fill_value=0.0).to_numpy(dtype="float64"),
            "retrans_rx_bytes": rx.reindex(nodes, fill_value=0.0).to_numpy(dtype="float64"),
        }
    )


# --------------------------------------------------------------------------------------------
# One-row cell summary
# --------------------------------------------------------------------------------------------

SUMMARY_COLUMNS = [
    "world_size",
    "bw_bps",
    "measured_steps",
    "step_time_mean_s",
    "step_time_std_s",
    "framework_bytes_per_step",
    "framework_bytes_per_step_per_rank",
    "messages_per_step",
    "p2p_byte_share",
    "internode_bytes_per_step",
    "intranode_bytes_per_step",
    "wire_tx_bytes_per_step_per_node",
    "throughput_mean_bps",
    "bw_utilization",
    "peak_to_mean_10ms",
    "cov_10ms",
    "shape_resolved_10ms",
    "wire_over_framework",
]


def cell_summary(traces: CellTraces, node_mat: pd.DataFrame | None = None) -> pd.DataFrame:
    """The headline numbers of one cell, one row, over its measured (non-warm-up) steps.

    * step_time_mean_s / step_time_std_s: step duration across ranks (sample std, ddof=1).
    * framework_bytes_per_step (all ranks) and ..._per_rank (divided by world_size),
      messages_per_step: ops issued by all ranks; steps without any op count as zero.
    * p2p_byte_share: share of framework bytes in send/recv.
    * internode_bytes_per_step / intranode_bytes_per_step: bytes per measured step the
      ranks send, under :func:`op_destinations`, to ranks on other nodes (the off-diagonal
      of :func:`node_matrix`: what the network carries) and on their own node (the
      diagonal: loopback). ``node_mat`` is this cell's node matrix when the caller already
      has it; otherwise it is computed over the measured steps of ``traces.steps``.
    * wire_tx_bytes_per_step_per_node: interface tx bytes inside the measured window divided
      by the measured steps, averaged over nodes.
    * throughput_mean_bps: tx rate over the window, averaged over nodes; bw_utilization
      divides it by the cap (NaN when uncapped).
    * peak_to_mean_10ms, cov_10ms: tx burstiness at 10 ms bins averaged over nodes (NaN when
      the counters were sampled too coarsely; shape_resolved_10ms says so).
    * wire_over_framework: total wire tx over total modelled inter-node framework tx for the
      whole run (see :func:`wire_vs_framework`).

    Columns: cell params, then SUMMARY_COLUMNS.
    """
    params = traces.params
    st = step_times(traces.steps, traces.warmup_steps)
    measured = st[~st["warmup"].astype(bool)] if not st.empty else st
    n_measured = len(measured)
    nan = float("nan")
    row: dict[str, Any] = dict(params)
    world_size = traces.meta.get("world_size")
    bw_bps = traces.meta.get("bw_bps")
    row["world_size"] = world_size
    row["bw_bps"] = float(bw_bps) if bw_bps else nan
    row["measured_steps"] = n_measured
    durations = measured["duration_s"].astype("float64") if n_measured else pd.Series([nan])
    row["step_time_mean_s"] = float(durations.mean())
    row["step_time_std_s"] = float(durations.std(ddof=1)) if n_measured > 1 else nan

    measured_ops = (
        traces.ops[traces.ops["step"].isin(measured["step"])]
        if not traces.ops.empty and n_measured
        else traces.ops.iloc[0:0]
    )
    total_bytes = float(measured_ops["bytes"].sum()) if not measured_ops.empty else 0.0
    per_step = total_bytes / n_measured if n_measured else nan
    row["framework_bytes_per_step"] = per_step
    row["framework_bytes_per_step_per_rank"] = per_step / world_size if world_size else nan
    row["messages_per_step"] = len(measured_ops) / n_measured if n_measured else nan
    p2p = measured_ops["bytes"][measured_ops["op"].isin(P2P_OPS)].sum() if total_bytes else 0
    row["p2p_byte_share"] = float(p2p) / total_bytes if total_bytes else nan
    if node_mat is None:
        node_mat = node_matrix(
            comm_matrix(traces.ops, measured_steps=measured["step"], backend=traces.backend)
        )
    inter, intra = node_traffic_split(node_mat)
    row["internode_bytes_per_step"] = inter if n_measured else nan
    row["intranode_bytes_per_step"] = intra if n_measured else nan

    for col in (
        "wire_tx_bytes_per_step_per_node",
        "throughput_mean_bps",
        "bw_utilization",
        "peak_to_mean_10ms",
        "cov_10ms",
        "wire_over_framework",
    ):
        row[col] = nan
    row["shape_resolved_10ms"] = False
    if n_measured and not traces.counters.empty:
        window = training_window(st)
        wire = wire_bytes(traces.counters, window)
        duration_s = (window[1] - window[0]) / _NS_PER_S
        row["wire_tx_bytes_per_step_per_node"] = float(wire["wire_tx_bytes"].mean()) / n_measured
        row["throughput_mean_bps"] = float(wire["wire_tx_bytes"].mean()) * 8 / duration_s
        if bw_bps:
            row["bw_utilization"] = row["throughput_mean_bps"] / float(bw_bps)
        shape = traffic_shape(traces.counters, window, (SUMMARY_BIN_MS,))
        tx = shape[shape["direction"] == "tx"]
        row["peak_to_mean_10ms"] = float(tx["peak_to_mean"].mean())
        row["cov_10ms"] = float(tx["cov"].mean())
        row["shape_resolved_10ms"] = bool(tx["resolved"].all()) if len(tx) else False
    if not traces.ops.empty and not traces.counters.empty:
        wf = wire_vs_framework(traces.ops, traces.counters, traces.meta)
        fw_total = float(wf["framework_tx_bytes"].sum())
        if fw_total > 0:
            row["wire_over_framework"] = float(wf["wire_tx_bytes"].sum()) / fw_total
    return pd.DataFrame([row], columns=[*params, *SUMMARY_COLUMNS])


# --------------------------------------------------------------------------------------------
# Files in, files out (what the Snakemake scripts call)
# --------------------------------------------------------------------------------------------


def compute_cell_metrics(cell_dir: Path, out_dir: Path) -> None:
    """Compute every per-cell metric table of ``cell_dir`` and write them to ``out_dir``.

    Writes summary, op_volume (per rank), msg_sizes, throughput (bins 1/10/100 ms stacked,
    column ``bin_ms``), shape (inside the training window), step_times, wire, comm_matrix
    (rank x rank bytes per measured step), node_matrix (node x node), crosscheck (wire vs
    recorded ops per node and direction, :func:`crosscheck`), matrix_check (node x node
    matrix vs the captured ``wire_flows.parquet`` when the cell has one,
    :func:`matrix_check`) and sockets (TCP's rtt, cwnd and retransmissions per node,
    :func:`socket_stats`), each as ``<name>.parquet``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    traces = load_cell(Path(cell_dir))
    params = traces.params
    st = step_times(traces.steps, traces.warmup_steps)
    # The same measured steps as the summary: steps that issued no op still count as steps.
    measured_steps = st.loc[~st["warmup"].astype(bool), "step"] if not st.empty else []
    rank_mat = comm_matrix(
        traces.ops, traces.warmup_steps, measured_steps=measured_steps, backend=traces.backend
    )
    node_mat = node_matrix(rank_mat)
    tables: dict[str, pd.DataFrame] = {
        "summary": cell_summary(traces, node_mat=node_mat),
        "comm_matrix": rank_mat,
        "node_matrix": node_mat,
        "op_volume": op_volume(traces.ops, per_rank=True),
        "msg_sizes": message_sizes(traces.ops, traces.warmup_steps),
        "step_times": st,
    }
    if traces.counters.empty:
        tables["throughput"] = pd.DataFrame(columns=[*params, *THROUGHPUT_COLUMNS])
        tables["shape"] = pd.DataFrame(columns=[*params, *SHAPE_COLUMNS])
        tables["wire"] = pd.DataFrame(columns=[*params, *WIRE_COLUMNS])
    else:
        tables["throughput"] = _concat(
            (throughput(traces.counters, b) for b in DEFAULT_BIN_MS),
            [*params, *THROUGHPUT_COLUMNS],
        )
        tables["shape"] = (
            traffic_shape(traces.counters, training_window(st), DEFAULT_BIN_MS)
            if not st.empty
            else pd.DataFrame(columns=[*params, *SHAPE_COLUMNS])
        )
        tables["wire"] = wire_vs_framework(traces.ops, traces.counters, traces.meta)
    tables["crosscheck"] = crosscheck(traces)
    tables["matrix_check"] = matrix_check(traces, _read_optional(Path(cell_dir) / WIRE_FLOWS_FILE))
    tables["sockets"] = socket_stats(traces)
    for name in METRIC_TABLES:
        tables[name].to_parquet(out_dir / f"{name}.parquet", index=False)


def aggregate_cells(metric_dirs: list[Path], out_dir: Path) -> None:
    """Concatenate each metric table across cells into ``out_dir/<table>.parquet``.

    Tables carry their cell parameters, so this is a plain concat. A table no cell produced is
    still written (empty) so downstream rules always find their inputs.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in METRIC_TABLES:
        frames = [
            pd.read_parquet(p) for d in metric_dirs if (p := Path(d) / f"{name}.parquet").exists()
        ]
        non_empty = [f for f in frames if not f.empty]
        if non_empty:
            table = pd.concat(non_empty, ignore_index=True)
        elif frames:
            table = frames[0]
        else:
            table = pd.DataFrame()
        table.to_parquet(out_dir / f"{name}.parquet", index=False)
