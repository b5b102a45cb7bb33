"""Throughput and shape at the in-kernel accounting's resolution: a sparse cumulative series
of 100 µs bins (a sample at the end of every non-empty bin, one at the start of a non-empty bin
after an empty one, none across idle stretches) and the ``resolution_ns`` column that says so."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from synthetic import COUNTER_BASE, MS, T0_NS, constant_rate_counters

from commscope import metrics as m
from commscope.metrics.counters import bin_width_ns, throughput_table

approx = pytest.approx
RES_NS = 100_000  # 100 µs, the default bin width of the in-kernel accounting
# 50 Mbit/s serialised as MTU frames: 625 bytes in every busy 100 µs bin.
CAP_BYTES_PER_BIN = 625


def sparse_counters(
    bin_bytes: np.ndarray,
    node: int = 0,
    t0_ns: int = T0_NS,
    res_ns: int = RES_NS,
    rx_bin_bytes: np.ndarray | None = None,
) -> pd.DataFrame:
    """Counters as the in-kernel source writes them: bins of ``res_ns`` from ``t0_ns`` (a
    multiple of ``res_ns``) with ``bin_bytes[k]`` bytes in bin k; cumulative from a kernel-like
    base; rx defaults to tx. Samples fall only on bin edges where the count is known."""
    tx = np.asarray(bin_bytes, dtype="int64")
    rx = tx if rx_bin_bytes is None else np.asarray(rx_bin_bytes, dtype="int64")
    busy = (tx > 0) | (rx > 0)
    after_idle = busy & np.concatenate([[True], ~busy[:-1]])
    k = np.arange(len(tx))
    # Edge index e is the instant t0 + e * res; the cumulative count there is the sum of bins < e.
    edges = np.unique(np.concatenate([k[busy] + 1, k[after_idle]]))
    cum_tx = np.concatenate([[0], np.cumsum(tx)])[edges]
    cum_rx = np.concatenate([[0], np.cumsum(rx)])[edges]
    return pd.DataFrame(
        {
            "node": node,
            "iface": "exp0",
            "t_ns": t0_ns + edges * res_ns,
            "tx_bytes": COUNTER_BASE + cum_tx,
            "rx_bytes": COUNTER_BASE + cum_rx,
            "tx_packets": cum_tx // 1514,
            "rx_packets": cum_rx // 1514,
            "resolution_ns": np.int64(res_ns),
        }
    )


def _bursty_bins(seed: int = 3) -> np.ndarray:
    """2 s of 100 µs bins: random frames in bursts, a 1.2 s idle gap in the middle, busy first
    and last bins (so the sampled span is the whole 2 s)."""
    rng = np.random.default_rng(seed)
    n = 20_000
    bins = rng.integers(1, 40, n) * 1514 * (rng.random(n) < 0.3)
    bins[5_000:17_000] = 0  # idle: no sample for 1.2 s
    bins[0] = bins[-1] = 1514
    return bins


def _bytes(tp: pd.DataFrame, col: str = "tx_bps") -> np.ndarray:
    return (tp[col] * (tp["bin_ms"] * MS) / 8e9).to_numpy()


def test_sparse_100us_bins_come_back_exactly_and_sum_at_coarser_widths() -> None:
    bins = _bursty_bins()
    counters = sparse_counters(bins)
    for bin_ms, per in ((0.1, 1), (1, 10), (10, 100), (100, 1000)):
        tp = m.throughput(counters, bin_ms)
        expected = bins.reshape(-1, per).sum(axis=1)
        assert len(tp) == len(expected), bin_ms
        # Origin 0: every edge is a whole multiple of the width, hence a source bin edge.
        assert (tp["t_start_ns"] % bin_width_ns(bin_ms) == 0).all()
        assert tp["t_start_ns"].iloc[0] == T0_NS
        assert _bytes(tp) == approx(expected, abs=1e-6), bin_ms
        assert tp["resolved"].all()
        assert tp["bin_ms"].dtype == np.float64


def test_idle_gap_without_samples_gives_zero_throughput() -> None:
    bins = _bursty_bins()
    tp = m.throughput(sparse_counters(bins), 0.1)
    gap = (tp["t_start_ns"] >= T0_NS + 5_000 * RES_NS) & (
        tp["t_start_ns"] < T0_NS + 17_000 * RES_NS
    )
    assert gap.sum() == 12_000
    assert (tp.loc[gap, ["tx_bps", "rx_bps"]] == 0).all().all()
    # The 1 s bins across the gap hold only the bursts either side of it.
    coarse = m.throughput(sparse_counters(bins), 1000)
    assert _bytes(coarse) == approx(bins.reshape(2, -1).sum(axis=1), abs=1e-6)


def test_a_width_off_the_source_grid_still_conserves_bytes() -> None:
    # 0.25 ms is no multiple of 100 µs: edges fall inside source bins and are interpolated,
    # but nothing is lost or invented over the whole span.
    bins = _bursty_bins()
    tp = m.throughput(sparse_counters(bins), 0.25)
    assert _bytes(tp).sum() == approx(bins.sum())
    assert tp["resolved"].all()  # coarser than the source: only the edges are smeared


def test_capped_link_is_flat_at_100us_and_shape_sees_the_duty_cycle() -> None:
    # 50 Mbit/s frames for 20 ms of every 100 ms, over 1 s.
    period = np.zeros(1000, dtype="int64")
    period[:200] = CAP_BYTES_PER_BIN
    bins = np.tile(period, 10)
    bins[-1] = 1  # a last busy bin so the span covers the whole second
    counters = sparse_counters(bins)
    window = (T0_NS + 10 * MS + 37, T0_NS + 900 * MS)  # an edge off the bin grid
    shape = m.traffic_shape(counters, window)
    tx = shape[shape["direction"] == "tx"].set_index("bin_ms")
    assert list(tx.index) == [0.1, 1.0, 10.0, 100.0]
    fine = tx.loc[0.1]
    # Only whole bins inside the window: from 10.1 ms (the next 100 µs edge) to 900 ms.
    assert fine["n_bins"] == 8899
    assert fine["peak_bps"] == approx(50e6)
    assert fine["resolution_ms"] == approx(0.1)
    assert fine["resolved"]
    # 100 ms bins each hold one burst: the bursts average out.
    assert tx.loc[100.0, "peak_to_mean"] == approx(1.0)
    assert tx.loc[100.0, "n_bins"] == 8
    # 10 ms bins from 20 ms: on 2 of every 10 bins (bin 10-20 ms too), duty cycle 1/5.
    ten = tx.loc[10.0]
    assert ten["peak_bps"] == approx(50e6)
    assert ten["n_bins"] == 88


def test_resolved_follows_resolution_ns_not_the_sample_spacing() -> None:
    # Isolated frames, one every 50 ms: every source bin is exact, peak/mean is 1/duty.
    bins = np.zeros(10_000, dtype="int64")
    bins[::500] = 1514
    bins[-1] = 1514
    counters = sparse_counters(bins)
    shape = m.traffic_shape(counters, (T0_NS, T0_NS + 1000 * MS))
    tx = shape[shape["direction"] == "tx"].set_index("bin_ms")
    assert tx["resolved"].all()
    assert tx.loc[0.1, "peak_to_mean"] == approx(10_000 / 21)
    # A source that declares a 1 ms resolution cannot resolve 100 µs, although its samples
    # here lie 100 µs apart: flagged, not dropped.
    coarse = counters.assign(resolution_ns=1_000_000)
    assert tx.loc[0.1, "sample_interval_ms"] == approx(0.1)
    tp = m.throughput(coarse, 0.1)
    assert len(tp) == 10_000
    assert not tp["resolved"].any()
    assert m.throughput(coarse, 1)["resolved"].all()
    row = m.traffic_shape(coarse, (T0_NS, T0_NS + 1000 * MS))
    row = row[(row["bin_ms"] == 0.1) & (row["direction"] == "tx")].iloc[0]
    assert not row["resolved"]
    assert math.isnan(row["peak_to_mean"])
    assert row["resolution_ms"] == approx(1.0)
    # And the other way: samples 1 ms apart from a source that declares 100 µs bins.
    sampled = constant_rate_counters(8e6, duration_ms=100).assign(resolution_ns=RES_NS)
    assert m.throughput(sampled, 0.1)["resolved"].all()


def test_tables_without_resolution_ns_fall_back_to_the_median_interval() -> None:
    # A 1 kHz sampler's table as written before the column existed.
    counters = constant_rate_counters(8e6, duration_ms=200)
    assert "resolution_ns" not in counters
    tp = throughput_table(counters, (T0_NS, T0_NS + 100 * MS))
    by_width = tp.groupby("bin_ms")
    assert sorted(by_width.groups) == [0.1, 1.0, 10.0, 100.0]
    assert not tp.loc[tp["bin_ms"] == 0.1, "resolved"].any()
    assert tp.loc[tp["bin_ms"] >= 1, "resolved"].all()
    # Steady between samples, so even the smeared 100 µs bins carry the right rate.
    assert tp.loc[tp["bin_ms"] == 0.1, "tx_bps"].to_numpy() == approx(8e6, rel=1e-9)
    shape = m.traffic_shape(counters, (T0_NS, T0_NS + 200 * MS))
    assert shape["resolution_ms"].to_numpy() == approx(shape["sample_interval_ms"].to_numpy())
    # A column holding only nulls (old rows concatenated with new ones) is the same as none.
    assert m.throughput(counters.assign(resolution_ns=pd.NA), 0.1)["resolved"].sum() == 0


def test_throughput_table_keeps_100us_bins_to_the_measured_window() -> None:
    bins = _bursty_bins()
    counters = sparse_counters(bins)
    window = (T0_NS + 100 * MS, T0_NS + 300 * MS)
    tp = throughput_table(counters, window)
    fine = tp[tp["bin_ms"] == 0.1]
    assert len(fine) == 2000
    assert fine["t_start_ns"].min() == window[0]
    assert fine["t_start_ns"].max() == window[1] - RES_NS
    # 1 ms and coarser cover the whole sampled span (2 s), start-up and tear-down included.
    assert (tp["bin_ms"] == 1.0).sum() == 2000
    assert (tp["bin_ms"] == 100.0).sum() == 20
    # No window (no steps recorded): no 100 µs rows at all.
    assert set(throughput_table(counters, None)["bin_ms"]) == {1.0, 10.0, 100.0}


def test_throughput_table_keeps_100us_bins_to_the_zoomed_step() -> None:
    counters = sparse_counters(_bursty_bins())
    window = (T0_NS + 100 * MS, T0_NS + 300 * MS)
    whole = throughput_table(counters, window)
    # A last step starting off the 100 µs grid and ending past the window's end: its bins
    # widened to whole ones (the figure's zoom snaps outwards), cut to the window.
    zoom = (T0_NS + 250 * MS + 30_000, T0_NS + 300 * MS + 70_000)
    tp = throughput_table(counters, window, zoom=zoom)
    fine = tp[tp["bin_ms"] == 0.1]
    assert len(fine) == 500
    assert fine["t_start_ns"].min() == T0_NS + 250 * MS
    assert fine["t_start_ns"].max() == window[1] - RES_NS
    # The same rows as the whole window's over that stretch; 1 ms and coarser unchanged.
    inside = whole[(whole["bin_ms"] == 0.1) & (whole["t_start_ns"] >= T0_NS + 250 * MS)]
    pd.testing.assert_frame_equal(
        fine.reset_index(drop=True), inside.reset_index(drop=True), check_exact=True
    )
    pd.testing.assert_frame_equal(
        tp[tp["bin_ms"] >= 1].reset_index(drop=True),
        whole[whole["bin_ms"] >= 1].reset_index(drop=True),
        check_exact=True,
    )
    # A step on the grid, inside the window: exactly its bins.
    step = (T0_NS + 150 * MS, T0_NS + 170 * MS)
    fine = throughput_table(counters, window, zoom=step).query("bin_ms == 0.1")
    assert fine["t_start_ns"].tolist() == list(range(step[0], step[1], RES_NS))


def test_bin_ms_survives_parquet_and_groupby(tmp_path) -> None:
    counters = sparse_counters(_bursty_bins())
    tp = throughput_table(counters, (T0_NS, T0_NS + 2000 * MS))
    tp.to_parquet(tmp_path / "tp.parquet", index=False)
    back = pd.read_parquet(tmp_path / "tp.parquet")
    assert back["bin_ms"].dtype == np.float64
    counts = back.groupby("bin_ms").size()
    assert counts.loc[0.1] == 20_000
    assert counts.loc[100.0] == 20
    assert (back["bin_ms"] == 100_000 / 1e6).sum() == 20_000
