"""The metrics at scale (issue 12; benchmarks/analysis.py, docs/analysis.md) give what they gave
before, to the bit.

The counter functions were rewritten to group, clean and bin without pandas copies of the
counters, to share the cleaned series between the tables of a cell, and to yield the throughput
table in parts; the per-cell files are written from the counters read without their parameter
columns and the throughput table part by part; the aggregation copies row groups. The previous
counter functions are kept below, frozen, as the reference (``Ref*``/``ref_*``), and the
files are compared with the in-memory tables and with plain ``pd.concat`` + ``to_parquet``.

One thing changed on purpose: the throughput table's 100 µs rows now cover only the step the
cell figure zooms into (``zoom_window``), not the whole measured window. Its 1 ms and coarser
rows are the reference's bit for bit, its 100 µs rows the reference's that overlap the zoom;
the shape table and the summary keep their 100 µs statistics over the whole window.
Inputs are the benchmark's synthetic cells (both wire sources) at a small size, plus the
irregularities a real sampler produces: late, repeated and out-of-order samples, a counter
reset, two interfaces on a node, several cells in one table.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from commscope import metrics as m
from commscope.contracts import (
    METRIC_TABLES,
    PARAM_COLUMNS,
    WIRE_FLOW_COLUMNS,
    table_file,
    with_params,
)
from commscope.metrics import _parquet as pq_parts
from commscope.metrics import counter_series as cs
from commscope.metrics import counters as c
from commscope.metrics import io
from commscope.metrics._common import shared_results
from commscope.metrics.crosscheck import summed_flows
from commscope.units import NS_PER_MS, NS_PER_S


def _benchmark() -> Any:
    """benchmarks/analysis.py, whose synthetic cells these tests use at a small size."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "analysis.py"
    spec = importlib.util.spec_from_file_location("commscope_benchmark_analysis", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _benchmark()
SMALL = {"ops": 1_500, "samples": 12_000, "nodes": 3}


# --------------------------------------------------------------------------------------------
# The reference: the counter functions as they were before issue 12 (frozen)
# --------------------------------------------------------------------------------------------


@dataclass
class RefSeries:
    t_ns: np.ndarray
    cum: dict[str, np.ndarray]
    sample_interval_ns: float
    declared_resolution_ns: int | None = None

    @classmethod
    def from_frame(cls, df: pd.DataFrame, columns: Sequence[str]) -> RefSeries:
        t = df["t_ns"].to_numpy(dtype="int64")
        if len(t) > 1 and not bool(np.all(np.diff(t) > 0)):
            df = df.sort_values("t_ns", kind="stable").drop_duplicates("t_ns", keep="last")
            t = df["t_ns"].to_numpy(dtype="int64")
        cum = {}
        for col in columns:
            v = df[col].to_numpy(dtype="float64")
            d = np.clip(np.diff(v), 0.0, None)
            cum[col] = np.concatenate([[0.0], np.cumsum(d)])
        interval = float(np.median(np.diff(t))) if len(t) > 1 else math.inf
        res = None
        if "resolution_ns" in df.columns:
            values = pd.to_numeric(df["resolution_ns"], errors="coerce").dropna()
            values = values[values > 0]
            res = int(values.max()) if len(values) else None
        return cls(t, cum, interval, res)

    @property
    def resolution_ns(self) -> float:
        if self.declared_resolution_ns is not None:
            return float(self.declared_resolution_ns)
        return self.sample_interval_ns

    def resolved(self, bin_ns: int) -> bool:
        if self.declared_resolution_ns is not None:
            return bin_ns >= self.declared_resolution_ns
        return self.sample_interval_ns <= bin_ns * cs.RESOLUTION_SLACK

    def at(self, col: str, when_ns: np.ndarray) -> np.ndarray:
        ref = self.t_ns[0]
        return np.interp(
            (np.asarray(when_ns, dtype="int64") - ref).astype("float64"),
            (self.t_ns - ref).astype("float64"),
            self.cum[col],
        )

    def straddle(self, col: str, when_ns: int) -> float:
        i = int(np.searchsorted(self.t_ns, when_ns, side="left"))
        if i == 0 or i >= len(self.t_ns) or self.t_ns[i] == when_ns:
            return 0.0
        return float(self.cum[col][i] - self.cum[col][i - 1])

    def bins(self, origin: int, bin_ns: int, start: int | None, end: int | None) -> np.ndarray:
        lo = int(self.t_ns[0]) if start is None else max(int(self.t_ns[0]), start)
        hi = int(self.t_ns[-1]) if end is None else min(int(self.t_ns[-1]), end)
        if hi <= lo:
            return np.empty(0, dtype="int64")
        k_first = -((origin - lo) // bin_ns)
        k_last = (hi - origin) // bin_ns
        if k_last <= k_first:
            return np.empty(0, dtype="int64")
        return origin + np.arange(k_first, k_last + 1, dtype="int64") * bin_ns

    def rates(self, col: str, edges: np.ndarray) -> np.ndarray:
        return np.diff(self.at(col, edges)) * (8 * NS_PER_S) / np.diff(edges)


def ref_per_cell(df: pd.DataFrame) -> Iterator[tuple[dict[str, Any], pd.DataFrame]]:
    params = [p for p in PARAM_COLUMNS if p in df.columns]
    if df.empty:
        return
    if "cell" not in df.columns:
        yield {p: df[p].iloc[0] for p in params}, df
        return
    for _, sub in df.groupby("cell", sort=True, dropna=False):
        yield {p: sub[p].iloc[0] for p in params}, sub


def ref_concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def ref_series(
    counters: pd.DataFrame, columns: Sequence[str] = ("tx_bytes", "rx_bytes")
) -> Iterator[tuple[int, str, RefSeries]]:
    iface = "iface" if "iface" in counters.columns else None
    for key, sub in counters.groupby(["node", iface] if iface else ["node"], sort=True):
        key = key if isinstance(key, tuple) else (key,)
        yield int(key[0]), str(key[1]) if iface else "", RefSeries.from_frame(sub, columns)


def _params(df: pd.DataFrame) -> list[str]:
    return [p for p in PARAM_COLUMNS if p in df.columns]


def ref_table_specs(window: tuple[int, int] | None) -> list[tuple[float, tuple[int, int] | None]]:
    """The throughput table's widths as they were: 1 ms and coarser over the sampled span,
    100 µs over the whole measured ``window`` (none without one)."""
    specs: list[tuple[float, tuple[int, int] | None]] = []
    for bin_ms in (0.1, 1.0, 10.0, 100.0):
        if bin_ms >= 1.0:
            specs.append((bin_ms, None))
        elif window is not None:
            specs.append((bin_ms, window))
    return specs


def ref_throughput(
    counters: pd.DataFrame, specs: list[tuple[float, tuple[int, int] | None]], origin: int
) -> pd.DataFrame:
    frames = []
    for params, cell in ref_per_cell(counters):
        parts: dict[str, list[np.ndarray]] = {col: [] for col in c.THROUGHPUT_COLUMNS}
        for node, iface, series in ref_series(cell):
            for bin_ms, limits in specs:
                bin_ns = c.bin_width_ns(bin_ms)
                lo, hi = (None, None) if limits is None else limits
                edges = series.bins(origin, bin_ns, lo, hi)
                n = len(edges) - 1
                if n < 1:
                    continue
                parts["node"].append(np.full(n, node, dtype="int64"))
                parts["iface"].append(np.full(n, iface, dtype=object))
                parts["bin_ms"].append(np.full(n, bin_ms, dtype="float64"))
                parts["t_start_ns"].append(edges[:-1])
                for col in ("tx_bytes", "rx_bytes"):
                    parts[col.replace("_bytes", "_bps")].append(series.rates(col, edges))
                parts["resolved"].append(np.full(n, series.resolved(bin_ns), dtype=bool))
        if parts["node"]:
            out = pd.DataFrame({col: np.concatenate(v) for col, v in parts.items()})
            out["iface"] = out["iface"].astype("str")
            frames.append(with_params(params, out))
    return ref_concat(frames, [*_params(counters), *c.THROUGHPUT_COLUMNS])


def ref_traffic_shape(
    counters: pd.DataFrame, window: tuple[int, int], widths: Sequence[float]
) -> pd.DataFrame:
    nan = float("nan")
    rows = []
    for params, cell in ref_per_cell(counters):
        records = []
        for node, iface, series in ref_series(cell):
            for bin_ms in widths:
                bin_ns = c.bin_width_ns(bin_ms)
                edges = series.bins(0, bin_ns, window[0], window[1])
                resolved = series.resolved(bin_ns)
                for direction in ("tx", "rx"):
                    stats = {"n_bins": 0, "mean_bps": nan, "peak_bps": nan}
                    stats |= {"peak_to_mean": nan, "cov": nan}
                    if len(edges) >= 2:
                        rate = series.rates(f"{direction}_bytes", edges)
                        mean = float(rate.mean())
                        stats |= {"n_bins": len(rate), "mean_bps": mean}
                        if resolved:
                            stats["peak_bps"] = float(rate.max())
                            if mean > 0:
                                stats["peak_to_mean"] = stats["peak_bps"] / mean
                                stats["cov"] = float(rate.std(ddof=0)) / mean
                    records.append(
                        {
                            "node": node,
                            "iface": iface,
                            "direction": direction,
                            "bin_ms": float(bin_ms),
                            **stats,
                            "sample_interval_ms": series.sample_interval_ns / NS_PER_MS,
                            "resolution_ms": series.resolution_ns / NS_PER_MS,
                            "resolved": resolved,
                        }
                    )
        if records:
            rows.append(with_params(params, pd.DataFrame(records)))
    return ref_concat(rows, [*_params(counters), *c.SHAPE_COLUMNS])


def ref_counted_wire_bytes(counters: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    edges = np.asarray(window, dtype="int64")
    records: dict[int, dict[str, Any]] = {}
    for node, _iface, series in ref_series(counters):
        rec = records.setdefault(
            node, {"node": node, "wire_tx_bytes": 0.0, "wire_rx_bytes": 0.0, "covered": True}
        )
        for col in ("tx_bytes", "rx_bytes"):
            rec[f"wire_{col}"] += float(np.diff(series.at(col, edges))[0])
        rec["covered"] &= bool(series.t_ns[0] <= edges[0] and series.t_ns[-1] >= edges[1])
    return pd.DataFrame(
        list(records.values()), columns=["node", "wire_tx_bytes", "wire_rx_bytes", "covered"]
    )


def ref_wire_counts(counters: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    cols = ["node", "tx_bytes", "rx_bytes", "tx_packets", "rx_packets"]
    cols += ["tx_edge_bytes", "rx_edge_bytes", "covered"]
    edges = np.asarray(window, dtype="int64")
    present = [col for col in (*cols[1:5],) if col in counters.columns]
    records: dict[int, dict[str, Any]] = {}
    for node, _iface, series in ref_series(counters, present):
        rec = records.setdefault(node, {col: 0.0 for col in cols[1:-1]} | {"covered": True})
        for col in present:
            rec[col] += float(np.diff(series.at(col, edges))[0])
        for col in ("tx_bytes", "rx_bytes"):
            rec[f"{col.split('_')[0]}_edge_bytes"] += sum(
                series.straddle(col, int(e)) for e in edges
            )
        rec["covered"] &= bool(series.t_ns[0] <= edges[0] and series.t_ns[-1] >= edges[1])
    out = pd.DataFrame([{"node": n, **r} for n, r in records.items()])
    return out[cols]


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def _shape() -> Any:
    return bench.CellShape.of(SMALL["ops"], SMALL["samples"], SMALL["nodes"])


def _with_cell(frame: pd.DataFrame, repeat: int = 0) -> pd.DataFrame:
    params = {**bench._params(_shape()), "repeat": repeat}
    return bench._with_params(frame.copy(), params)


def sampler_counters() -> pd.DataFrame:
    """The benchmark's 1 kHz sampler counters, with what a real sampler adds: a node with a
    second interface, repeated and out-of-order samples, a counter reset, a missing
    resolution on some rows of another node."""
    counters = bench.synthetic_sampler_counters(_shape())
    second = counters[counters["node"] == 1].assign(iface="eth1")
    second["tx_bytes"] //= 3
    counters = pd.concat([counters, second], ignore_index=True)
    rows = counters.index[counters["node"] == 2]
    counters.loc[rows[100:110], "t_ns"] = counters.loc[rows[100], "t_ns"]  # repeated instant
    counters.loc[rows[5000:], "tx_bytes"] -= 10**9  # reset: clamped, never negative
    swap = rows[[300, 301]]
    counters.loc[swap, "t_ns"] = counters.loc[swap[::-1], "t_ns"].to_numpy()  # out of order
    counters["resolution_ns"] = pd.array([pd.NA] * len(counters), dtype="Int64")
    counters.loc[counters["node"] == 3, "resolution_ns"] = 1_000_000
    return _with_cell(counters.sample(frac=1.0, random_state=4).sort_values("node"))


def bpf_counters() -> pd.DataFrame:
    """The benchmark's sparse BPF counters (``resolution_ns`` 100 µs)."""
    return _with_cell(bench.synthetic_bpf_tables(_shape())[0])


def two_cells() -> pd.DataFrame:
    """Two cells' BPF counters in one table (repeats 0 and 1)."""
    one = bench.synthetic_bpf_tables(_shape())[0]
    return pd.concat([_with_cell(one, 1), _with_cell(one, 0)], ignore_index=True)


INPUTS = {"sampler": sampler_counters, "bpf": bpf_counters, "two_cells": two_cells}


def _window(counters: pd.DataFrame) -> tuple[int, int]:
    t = counters["t_ns"]
    span = int(t.max() - t.min())
    return int(t.min() + span // 5 + 123_457), int(t.max() - span // 7)


def _zoom(window: tuple[int, int]) -> tuple[int, int]:
    """A last step near the window's end, off the 100 µs grid at both ends, ending past the
    window (as a step's end may, by less than a bin)."""
    return window[1] - (window[1] - window[0]) // 9 - 33_333, window[1] + 47_111


def assert_reference_cut_to_the_zoom(
    got: pd.DataFrame, reference: pd.DataFrame, zoom: tuple[int, int]
) -> None:
    """``got`` is the reference table (:func:`ref_table_specs`) with its 100 µs rows cut to
    those that overlap ``zoom``: every other row bit for bit, in the same order."""
    width = (reference["bin_ms"] * NS_PER_MS).round().astype("int64")
    fine = reference["bin_ms"] < 1.0
    overlaps = (reference["t_start_ns"] + width > zoom[0]) & (reference["t_start_ns"] < zoom[1])
    expected = reference[~fine | overlaps].reset_index(drop=True)
    pd.testing.assert_frame_equal(got.reset_index(drop=True), expected, check_exact=True)
    # Not vacuous: the zoom holds 100 µs rows, and fewer than the window did.
    assert 0 < int((got["bin_ms"] < 1.0).sum()) < int(fine.sum())


# --------------------------------------------------------------------------------------------
# The counter functions against the reference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", INPUTS)
@pytest.mark.parametrize("shared", [False, True])
def test_counter_tables_equal_the_reference_bit_for_bit(name: str, shared: bool) -> None:
    counters = INPUTS[name]()
    window = _window(counters)
    zoom = _zoom(window)
    with shared_results() if shared else _nothing():
        for bin_ms, origin, win in ((0.1, 0, window), (1.0, 0, None), (7.3, 12_345, window)):
            pd.testing.assert_frame_equal(
                m.throughput(counters, bin_ms, origin, win),
                ref_throughput(counters, [(bin_ms, win)], origin),
                check_exact=True,
            )
        assert_reference_cut_to_the_zoom(
            c.throughput_table(counters, window, zoom=zoom),
            ref_throughput(counters, ref_table_specs(window), 0),
            zoom,
        )
        widths = (*c.DEFAULT_BIN_MS, 3.0)
        for _ in range(2):  # the second time from what shared_results kept
            pd.testing.assert_frame_equal(
                m.traffic_shape(counters, window, widths),
                ref_traffic_shape(counters, window, widths),
                check_exact=True,
            )
        one = counters[counters["cell"] == counters["cell"].iloc[0]]
        pd.testing.assert_frame_equal(
            m.counted_wire_bytes(one, window), ref_counted_wire_bytes(one, window)
        )
        pd.testing.assert_frame_equal(m.wire_counts(one, window), ref_wire_counts(one, window))


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_throughput_parts_stack_to_the_table() -> None:
    counters = bpf_counters()
    window = _window(counters)
    zoom = _zoom(window)
    specs = c.throughput_specs(window, zoom=zoom)
    ((params, parts),) = list(c.throughput_parts(counters, specs, max_rows=997))
    parts = list(parts)
    assert max(len(p) for p in parts) == 997
    stacked = with_params(params, c.throughput_frame(parts))
    table = c.throughput_table(counters, window, zoom=zoom)
    pd.testing.assert_frame_equal(stacked, table, check_exact=True)


def test_nothing_is_kept_outside_shared_results() -> None:
    counters = bpf_counters()
    window = _window(counters)
    before = m.counted_wire_bytes(counters, window)
    counters["tx_bytes"] *= 2  # the same frame, changed in place
    after = m.counted_wire_bytes(counters, window)
    assert after["wire_tx_bytes"].tolist() == [2 * b for b in before["wire_tx_bytes"]]


# --------------------------------------------------------------------------------------------
# The files against the in-memory tables, the aggregation against pd.concat
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["counters", "bpf"])
def cell_files(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small benchmark cell of either wire source, its metrics written by
    compute_cell_metrics (light reads, throughput in parts of 1,000 rows)."""
    root = tmp_path_factory.mktemp(f"cell-{request.param}")
    bench.write_cell(root, SMALL["ops"], SMALL["samples"], SMALL["nodes"], request.param)
    # Small parts: many parts, row groups and dictionary chunks, and msg_sizes in parts too.
    small = {(c, "THROUGHPUT_PART_ROWS"): 1_000, (pq_parts, "PART_ROWS"): 700}
    small[(pq_parts, "SMALL_ROWS")] = 100
    saved = {key: getattr(*key) for key in small}
    for (module, name), value in small.items():
        setattr(module, name, value)
    try:
        m.compute_cell_metrics(root / "trace", root / "metrics")
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)
    return root


def test_written_tables_equal_the_in_memory_ones(cell_files: Path) -> None:
    tables = m.cell_metric_tables(
        m.load_cell(cell_files / "trace"), pd.read_parquet(cell_files / "trace/wire_flows.parquet")
    )
    written = cell_files / "metrics"
    for name in ("throughput", "msg_sizes"):  # written in parts
        assert pq.ParquetFile(written / table_file(name)).metadata.num_row_groups > 1, name
    for name in METRIC_TABLES:
        path = written / table_file(name)
        pd.testing.assert_frame_equal(pd.read_parquet(path), tables[name], check_exact=True)
        # The stored schema too (types, pandas metadata): as to_parquet writes the frame.
        reference = cell_files / f"reference-{name}.parquet"
        tables[name].to_parquet(reference, index=False)
        assert pq.read_schema(path).equals(pq.read_schema(reference), check_metadata=True), name


def test_written_throughput_is_the_reference_cut_to_the_zoomed_step(cell_files: Path) -> None:
    traces = m.load_cell(cell_files / "trace")
    st = m.step_times(traces.steps, traces.warmup_steps)
    window, zoom = m.training_window(st), m.zoom_window(st)
    written = cell_files / "metrics"
    reference = ref_throughput(traces.counters, ref_table_specs(window), 0)
    got = pd.read_parquet(written / table_file("throughput"))
    assert_reference_cut_to_the_zoom(got, reference, zoom)
    # The typical measured step, as the cell figure picks it.
    measured = st[~st["warmup"]]
    assert zoom[1] == int(measured["t_end_ns"].max()) == window[1]
    assert zoom[0] == int(measured["t_start_ns"].max())
    # The shape table and the summary keep their 100 µs statistics over the whole window.
    widths = c.DEFAULT_BIN_MS
    shape = ref_traffic_shape(traces.counters, window, widths)
    pd.testing.assert_frame_equal(
        pd.read_parquet(written / table_file("shape")), shape, check_exact=True
    )
    fine = shape[(shape["bin_ms"] == 0.1) & (shape["direction"] == "tx")]
    # Every whole 100 µs bin of the window (whose edges are off the grid).
    assert (fine["n_bins"] == window[1] // 100_000 + (-window[0]) // 100_000).all()
    summary = pd.read_parquet(written / table_file("summary")).iloc[0]
    for stat in ("peak_to_mean", "cov"):  # NaN both on the 1 kHz sampler (not resolved)
        np.testing.assert_equal(float(summary[f"{stat}_100us"]), float(fine[stat].mean()))


def _reference_concat(paths: list[Path]) -> pd.DataFrame:
    """The aggregation as it was: pd.concat of the non-empty tables."""
    frames = [pd.read_parquet(p) for p in paths if p.exists()]
    kept = [f for f in frames if not f.empty]
    return pd.concat(kept, ignore_index=True) if kept else (frames or [pd.DataFrame()])[0]


def test_aggregation_equals_pd_concat(cell_files: Path, tmp_path: Path) -> None:
    # A second cell (another repeat) written from the same tables, and an empty one.
    dirs = [cell_files / "metrics", tmp_path / "repeat1", tmp_path / "empty"]
    for name in METRIC_TABLES:
        table = pd.read_parquet(cell_files / "metrics" / table_file(name))
        for d in dirs[1:]:
            d.mkdir(exist_ok=True)
        other = table.assign(repeat=1) if "repeat" in table else table
        other.to_parquet(dirs[1] / table_file(name), index=False)
        table.iloc[0:0].to_parquet(dirs[2] / table_file(name), index=False)
    # One table whose files disagree on a column's type takes the pandas path.
    summary = pd.read_parquet(dirs[1] / "summary.parquet")
    summary.assign(wire_fallback=None).to_parquet(dirs[1] / "summary.parquet", index=False)
    out = tmp_path / "aggregate"
    m.aggregate_cells(dirs, out)
    for name in METRIC_TABLES:
        paths = [d / table_file(name) for d in dirs]
        reference = tmp_path / f"reference-{name}.parquet"
        _reference_concat(paths).to_parquet(reference, index=False)
        got = pd.read_parquet(out / table_file(name))
        pd.testing.assert_frame_equal(got, pd.read_parquet(reference), check_exact=True)
        assert pq.read_schema(out / table_file(name)).equals(
            pq.read_schema(reference), check_metadata=True
        ), name
    assert len(pd.read_parquet(out / "throughput.parquet")) == 2 * len(
        pd.read_parquet(cell_files / "metrics" / "throughput.parquet")
    )


# --------------------------------------------------------------------------------------------
# The pieces on their own
# --------------------------------------------------------------------------------------------


def test_median_of_intervals_is_numpys() -> None:
    rng = np.random.default_rng(5)
    for n in (1, 2, 7, 4096, 4097, 20_000, 20_001):
        few = rng.choice(rng.integers(1, 10**9, 4), n) * 100_000  # a sparse series' intervals
        many = rng.integers(999_000, 1_001_000, n)  # a sampler's
        for values in (few, many):
            assert cs._median(values) == float(np.median(values))


def test_summed_flows_give_matrix_check_the_same_sums() -> None:
    window = (1_000, 2_000)
    flows = pd.DataFrame(
        {
            "t_ns": [500, 1_000, 1_500, 1_999, 2_000, 1_200],
            "src_node": [0, 0, 1, 0, 0, 2],
            "dst_node": [1, 1, 0, 1, 1, 0],
            "bytes": [10, 20, 30, 40, 50, 0],
            "packets": [1, 2, 3, 4, 5, 0],
        }
    )
    batches = [flows.iloc[:2], flows.iloc[2:2], flows.iloc[2:]]
    summed = summed_flows(batches, window)
    inside = flows[(flows["t_ns"] >= 1_000) & (flows["t_ns"] < 2_000)]
    expected = inside.groupby(["src_node", "dst_node"])[["bytes", "packets"]].sum()
    got = summed.set_index(["src_node", "dst_node"])[["bytes", "packets"]]
    pd.testing.assert_frame_equal(got, expected)
    assert (summed["t_ns"] == window[0]).all()
    # No bin in the window: one row outside it (the table is not empty); no table: empty.
    outside = summed_flows([flows.iloc[:1]], window)
    assert len(outside) == 1 and not (window[0] <= outside["t_ns"].iloc[0] < window[1])
    assert summed_flows([], window).empty


def test_window_flows_read_by_arrow_sum_as_summed_flows(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    n = 5_000
    flows = pd.DataFrame(
        {
            "t_ns": np.sort(rng.integers(0, 10**9, n)),
            "src_node": rng.integers(0, 4, n),
            "dst_node": rng.integers(0, 4, n),
            "bytes": rng.integers(0, 10**6, n),
            "packets": rng.integers(0, 100, n),
            "cell": "a/b",
        }
    )
    path = tmp_path / "wire_flows.parquet"
    flows.to_parquet(path, index=False, row_group_size=700)  # 8 row groups
    empty = tmp_path / "empty.parquet"
    flows.iloc[0:0].to_parquet(empty, index=False)
    # Across row groups, inside one, before and after every bin, and an empty table.
    windows = [(123_456_789, 876_543_210), (10**8, 10**8 + 10**6), (-5, 0), (2 * 10**9, 3 * 10**9)]
    for table, window in [*((path, w) for w in windows), (empty, windows[0])]:
        whole = pd.read_parquet(table, columns=list(WIRE_FLOW_COLUMNS))
        pd.testing.assert_frame_equal(
            io._window_flows(table, window), summed_flows([whole], window), check_exact=True
        )


def test_write_frame_writes_categorical_parameters_back_as_text(tmp_path: Path) -> None:
    n = 3_000
    frame = pd.DataFrame(
        {
            "cell": pd.Categorical(["a/b"] * n),
            "strategy": pd.Categorical(["ddp", "tp"] * (n // 2)),  # not constant
            "rank": np.arange(n) % 4,
            "op": pd.array(["allreduce", "send", "recv"] * (n // 3), dtype="str"),
        }
    )
    plain = frame.astype({"cell": "str", "strategy": "str"})
    saved = (pq_parts.SMALL_ROWS, pq_parts.PART_ROWS)
    pq_parts.SMALL_ROWS, pq_parts.PART_ROWS = 10, 1_000
    try:
        pq_parts.write_frame(frame, tmp_path / "mixed.parquet", plain=["cell", "strategy"])
        constant = frame.drop(columns="strategy")
        pq_parts.write_frame(constant, tmp_path / "parts.parquet", plain=["cell"])
    finally:
        pq_parts.SMALL_ROWS, pq_parts.PART_ROWS = saved
    plain.to_parquet(tmp_path / "reference.parquet", index=False)
    plain.drop(columns="strategy").to_parquet(tmp_path / "reference-parts.parquet", index=False)
    for got, ref in (("mixed", "reference"), ("parts", "reference-parts")):
        pd.testing.assert_frame_equal(
            pd.read_parquet(tmp_path / f"{got}.parquet"),
            pd.read_parquet(tmp_path / f"{ref}.parquet"),
            check_exact=True,
        )
        assert pq.read_schema(tmp_path / f"{got}.parquet").equals(
            pq.read_schema(tmp_path / f"{ref}.parquet"), check_metadata=True
        )
    assert pq.ParquetFile(tmp_path / "parts.parquet").metadata.num_row_groups == 3
