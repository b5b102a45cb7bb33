"""Metrics of one sweep cell, computed from its trace tables (ARCHITECTURE.md §5, §6).

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
* *ring bytes* (:func:`ring_send_bytes`) are what one rank must transmit for an op under the
  bandwidth-optimal (ring) algorithm; :func:`wire_vs_framework` compares their inter-node part
  with the interface counters.
* *traffic shape* is computed from the interface counters binned at several widths; a bin width
  finer than the sampling interval cannot show bursts, so such rows are flagged and hold NaN
  rather than an interpolated, artificially smooth number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# Columns that identify a sweep cell, in the order they lead every output table.
PARAM_COLUMNS: tuple[str, ...] = (
    "cell",
    "strategy",
    "model",
    "nodes",
    "ranks_per_node",
    "bw",
    "delay",
    "jitter",
    "loss",
    "steps",
    "repeat",
)

# Tables written by compute_cell_metrics() and concatenated by aggregate_cells().
METRIC_TABLES: tuple[str, ...] = (
    "summary",
    "op_volume",
    "msg_sizes",
    "throughput",
    "shape",
    "step_times",
    "wire",
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
# Ops whose per-rank traffic depends on a root rank that ops.parquet does not record.
_ROOTED_OPS = frozenset({"broadcast", "reduce", "gather", "scatter"})
KNOWN_OPS = frozenset(
    _RING_OPS | _ROOTED_OPS | {"alltoall", "send", "recv", "barrier"},
)

_NS_PER_S = 1_000_000_000
_NS_PER_MS = 1_000_000


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


@dataclass
class CellTraces:
    """The trace tables of one sweep cell plus its ``cell.json`` metadata."""

    ops: pd.DataFrame
    steps: pd.DataFrame
    counters: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def warmup_steps(self) -> int:
        """Steps at the start of the run excluded from every summary (default 0)."""
        return int(self.meta.get("warmup_steps") or 0)

    @property
    def params(self) -> dict[str, Any]:
        """The cell's parameters, ``cell`` id first, as they lead every output table."""
        params = {"cell": self.meta.get("cell")}
        params.update(self.meta.get("params", {}))
        return params


def load_cell(cell_dir: Path) -> CellTraces:
    """Read ``cell.json``, ``ops.parquet``, ``steps.parquet`` and ``counters.parquet``.

    A missing ``ops`` or ``counters`` table (a run without communication, a node without a
    sampler) loads as an empty frame so the metrics degrade to NaN instead of failing;
    ``cell.json`` and ``steps.parquet`` are required.
    """
    cell_dir = Path(cell_dir)
    meta = json.loads((cell_dir / "cell.json").read_text())
    steps = pd.read_parquet(cell_dir / "steps.parquet")
    ops = _read_optional(cell_dir / "ops.parquet")
    counters = _read_optional(cell_dir / "counters.parquet")
    return CellTraces(ops=ops, steps=steps, counters=counters, meta=meta)


def _read_optional(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


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


def ring_send_bytes(op: str, bytes: float, group_size: int, is_root: bool | None = None) -> float:
    """Bytes one rank transmits for one op under the bandwidth-optimal (ring) algorithm.

    ``bytes`` is the op's input payload on this rank as recorded in ops.parquet, ``n`` the
    group size:

    ============== =========================== ============================================
    op             bytes sent by this rank     why
    ============== =========================== ============================================
    allreduce      2(n-1)/n * bytes            ring reduce-scatter, then ring all-gather
    reduce_scatter (n-1)/n * bytes             input is the full tensor S_total
    allgather      (n-1) * bytes               input is the shard: (n-1)/n * S_total
    alltoall       (n-1)/n * bytes             input holds n equal chunks, one stays local
    scatter        root: (n-1)/n * bytes,      the root's input holds n chunks, one stays
                   others: 0                   local
    broadcast      root: bytes, others:        chain along the ring from the root: every
                   (n-2)/(n-1) * bytes         rank but the last forwards S once
    reduce         root: 0, others: bytes      chain along the ring into the root
    gather         root: 0, others: bytes      each rank sends its input to the root
    send           bytes
    recv, barrier  0                           barrier payloads are a few bytes: ignored
    ============== =========================== ============================================

    Whatever the algorithm, a rooted op moves (n-1) chunks in total over the group. When the
    root is unknown (``is_root=None``) these return the even share (n-1)/n * bytes: exact for
    the group total, an estimate per rank. A group of one sends nothing.
    """
    n = int(group_size)
    if op not in KNOWN_OPS:
        raise ValueError(f"no traffic model for op {op!r}; known ops: {sorted(KNOWN_OPS)}")
    if op == "send":
        return float(bytes)
    if op in ("recv", "barrier") or n <= 1:
        return 0.0
    share = (n - 1) / n * bytes
    if op == "allreduce":
        return 2 * share
    if op == "allgather":
        return float((n - 1) * bytes)
    if op in ("reduce_scatter", "alltoall"):
        return share
    # Rooted ops: broadcast, reduce, gather, scatter.
    if is_root is None:
        return share
    if op == "scatter":
        return share if is_root else 0.0
    if op == "broadcast":
        return float(bytes) if is_root else (n - 2) / (n - 1) * bytes
    return 0.0 if is_root else float(bytes)


def _internode_fraction(
    op: str,
    rank: int,
    members: Sequence[int],
    peer: int,
    node_of: dict[int, int],
    root: int = -1,
) -> float:
    """Fraction of a rank's ring bytes that leave its node.

    Ring collectives, and the chain broadcast/reduce, send everything to the ring successor,
    taken as the next member in ``group_ranks`` order (gloo and NCCL rings follow rank order;
    for node-contiguous layouts the per-node crossing count is the same in either direction).
    A gather sends to the root; all-to-all and scatter (from the root) spread bytes evenly
    over the other members, as does a gather whose root is unknown (``root`` < 0: averaged
    over possible roots).
    """
    here = node_of.get(rank)
    if op == "send":
        return float(node_of.get(peer) != here)
    if op == "gather" and root >= 0:
        return float(node_of.get(root) != here)
    if op in _RING_OPS or op in ("broadcast", "reduce"):
        if rank not in members or len(members) < 2:
            return 0.0
        succ = members[(members.index(rank) + 1) % len(members)]
        return float(node_of.get(succ) != here)
    others = [m for m in members if m != rank]
    if not others:
        return 0.0
    return sum(node_of.get(m) != here for m in others) / len(others)


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

    ``framework_tx_bytes`` sums :func:`ring_send_bytes` over the node's ranks, counting only
    the part that crosses to another node (ranks on the same node talk over loopback, which
    the experiment interface never sees); ``framework_tx_bytes_with_local`` counts it all.
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
    cols = ["node", "framework_tx_bytes", "framework_tx_bytes_with_local", "estimated_tx_bytes"]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    node_of = dict(ops[["rank", "node"]].drop_duplicates("rank").itertuples(index=False, name=None))
    rpn = int(meta.get("params", {}).get("ranks_per_node") or 0)
    ops = ops.assign(
        root=pd.to_numeric(ops["root"], errors="coerce").fillna(-1).astype("int64")
        if "root" in ops
        else -1
    )
    # Ops repeat identically every step: model each distinct kind once, then weight by count.
    keys = ["rank", "op", "bytes", "group_size", "group_ranks", "peer", "root"]
    kinds = ops.groupby(keys, sort=False, dropna=False).size().rename("n").reset_index()
    records = []
    for rank, op, size, group_size, group_ranks, peer, root, n in kinds.itertuples(
        index=False, name=None
    ):
        members = _parse_ranks(group_ranks)
        for m in [*members, int(peer), int(root)]:
            if m >= 0 and m not in node_of and rpn > 0:
                node_of[m] = m // rpn
        rooted = op in _ROOTED_OPS
        is_root = (int(rank) == root) if rooted and root >= 0 else None
        sent = ring_send_bytes(op, size, group_size, is_root=is_root) * n
        if op == "broadcast" and root in members and int(rank) in members:
            # With the root known the chain is known too: root -> successor -> ... and the
            # root's ring predecessor, last in the chain, forwards nothing; all others send S.
            last = members[(members.index(root) - 1) % len(members)]
            sent = 0.0 if int(rank) == last else float(size) * n
        share = _internode_fraction(op, int(rank), members, int(peer), node_of, int(root))
        inter = sent * share
        records.append(
            {
                "node": node_of[int(rank)],
                "framework_tx_bytes": inter,
                "framework_tx_bytes_with_local": sent,
                "estimated_tx_bytes": inter if rooted and is_root is None else 0.0,
            }
        )
    return pd.DataFrame(records, columns=cols).groupby("node", as_index=False).sum()


def _parse_ranks(group_ranks: Any) -> list[int]:
    if group_ranks is None or (isinstance(group_ranks, float) and math.isnan(group_ranks)):
        return []
    return [int(r) for r in str(group_ranks).split(",") if r.strip()]


def _params_from(meta: dict[str, Any], *frames: pd.DataFrame) -> dict[str, Any]:
    """Cell parameters from the tables themselves, falling back to cell.json."""
    for df in frames:
        if not df.empty and _param_cols(df):
            return {c: df[c].iloc[0] for c in _param_cols(df)}
    params = {"cell": meta.get("cell")}
    params.update(meta.get("params", {}))
    return params


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
    "wire_tx_bytes_per_step_per_node",
    "throughput_mean_bps",
    "bw_utilization",
    "peak_to_mean_10ms",
    "cov_10ms",
    "shape_resolved_10ms",
    "wire_over_framework",
]


def cell_summary(traces: CellTraces) -> pd.DataFrame:
    """The headline numbers of one cell, one row, over its measured (non-warm-up) steps.

    * step_time_mean_s / step_time_std_s: step duration across ranks (sample std, ddof=1).
    * framework_bytes_per_step (all ranks) and ..._per_rank (divided by world_size),
      messages_per_step: ops issued by all ranks; steps without any op count as zero.
    * p2p_byte_share: share of framework bytes in send/recv.
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
    column ``bin_ms``), shape (inside the training window), step_times and wire, each as
    ``<name>.parquet``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    traces = load_cell(Path(cell_dir))
    params = traces.params
    st = step_times(traces.steps, traces.warmup_steps)
    tables: dict[str, pd.DataFrame] = {
        "summary": cell_summary(traces),
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
