"""The per-cell throughput figure: which interval it zooms on, which widths it draws, that the
table's 100 µs rows over the zoomed step alone draw it as rows over the whole window did, and
that it draws an in-kernel (sparse 100 µs) cell, an old table without 100 µs rows and an empty
one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from synthetic import MS, T0_NS
from test_counter_resolution import CAP_BYTES_PER_BIN, sparse_counters

from commscope.metrics.counters import throughput_table
from commscope.metrics.steps import training_window, zoom_window
from commscope.plots.cell import _rows, _widths, _zoom_interval, plot_cell_throughput

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CELL = "strategy~ddp/model~gpt-tiny/nodes~2/bw~50mbit/repeat~0"


def _steps(bounds_ms: list[tuple[float, float]], warmup: int = 1) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "cell": CELL,
            "step": np.arange(len(bounds_ms)),
            "t_start_ns": [T0_NS + int(a * MS) for a, _ in bounds_ms],
            "t_end_ns": [T0_NS + int(b * MS) for _, b in bounds_ms],
            "warmup": [i < warmup for i in range(len(bounds_ms))],
        }
    )


def _capped_cell(tmp_path: Path, fine_over_window: bool = False) -> Path:
    """Two nodes at a 50 Mbit/s cap, busy for the first 60 % of each 200 ms step, in the
    in-kernel source's form; its throughput (as the metrics write it: 100 µs rows over the last
    step; with ``fine_over_window`` over every measured step, as they were written before),
    step_times and summary tables on disk."""
    step = np.zeros(2000, dtype="int64")
    step[:1200] = CAP_BYTES_PER_BIN
    bins = np.tile(step, 4)
    bins[-1] = 1
    counters = pd.concat([sparse_counters(bins, node=n) for n in (0, 1)], ignore_index=True).assign(
        cell=CELL
    )
    st = _steps([(0, 200), (200, 400), (400, 600), (600, 800)])
    out = tmp_path / "metrics"
    out.mkdir(parents=True)
    zoom = None if fine_over_window else zoom_window(st)
    throughput_table(counters, training_window(st), zoom=zoom).to_parquet(
        out / "throughput.parquet"
    )
    st.to_parquet(out / "step_times.parquet")
    pd.DataFrame({"cell": [CELL], "bw_bps": [50e6]}).to_parquet(out / "summary.parquet")
    return out


def _plot(metrics: Path, out_png: Path) -> Path:
    return plot_cell_throughput(
        metrics / "throughput.parquet",
        metrics / "step_times.parquet",
        metrics / "summary.parquet",
        out_png,
    )


def test_the_figure_draws_a_sparse_100us_cell_deterministically(tmp_path: Path) -> None:
    metrics = _capped_cell(tmp_path)
    tp = pd.read_parquet(metrics / "throughput.parquet")
    assert _widths(tp) == [100 * MS, 10 * MS, MS, 100_000]
    first = _plot(metrics, tmp_path / "a.png")
    second = _plot(metrics, tmp_path / "b.png")
    data = first.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 20_000  # four rows of lines, not an empty canvas
    assert data == second.read_bytes()


def test_100us_rows_over_the_zoomed_step_alone_draw_the_same_figure(tmp_path: Path) -> None:
    metrics = _capped_cell(tmp_path / "zoom")
    before = _capped_cell(tmp_path / "window", fine_over_window=True)
    tp, tp_before = (pd.read_parquet(m / "throughput.parquet") for m in (metrics, before))
    fine = tp[tp["bin_ms"] == 0.1]
    # The typical (here: last, the steps are equal) measured step, 600-800 ms, both nodes; 1 ms
    # and coarser rows as before.
    assert len(fine) == 2 * 2000
    assert fine["t_start_ns"].min() == T0_NS + 600 * MS
    assert fine["t_start_ns"].max() == T0_NS + 800 * MS - 100_000
    assert (tp_before["bin_ms"] == 0.1).sum() == 2 * 6000
    pd.testing.assert_frame_equal(
        tp[tp["bin_ms"] >= 1].reset_index(drop=True),
        tp_before[tp_before["bin_ms"] >= 1].reset_index(drop=True),
        check_exact=True,
    )
    st = pd.read_parquet(metrics / "step_times.parquet")
    zoom = _zoom_interval(tp, st, 100_000)
    assert zoom == _zoom_interval(tp_before, st, 100_000)
    pd.testing.assert_frame_equal(
        _rows(tp, 100_000, zoom).reset_index(drop=True),
        _rows(tp_before, 100_000, zoom).reset_index(drop=True),
        check_exact=True,
    )
    drawn = _plot(metrics, tmp_path / "zoom.png").read_bytes()
    assert drawn == _plot(before, tmp_path / "window.png").read_bytes()


def test_zoom_is_the_last_measured_step_on_the_zoom_grid() -> None:
    st = _steps([(0, 200), (200, 400.03), (400.03, 600.07)])
    tp = pd.DataFrame(columns=["node", "bin_ms", "t_start_ns", "tx_bps"])
    zoom = _zoom_interval(tp, st, 100_000)
    # The last step, 400.03-600.07 ms, widened to whole 100 µs bins.
    assert zoom == (T0_NS + 400 * MS, T0_NS + 600 * MS + 100_000)


def test_zoom_on_a_long_step_is_its_busiest_stretch() -> None:
    # One 2 s step (after a warm-up one); its traffic is a burst from 1.3 s to 1.5 s.
    st = _steps([(0, 100), (100, 2100)])
    t = T0_NS + np.arange(1000, 21000) * 100_000
    busy = (t >= T0_NS + 1300 * MS) & (t < T0_NS + 1500 * MS)
    tp = pd.DataFrame(
        {"node": 0, "bin_ms": 0.1, "t_start_ns": t, "tx_bps": np.where(busy, 50e6, 0.0)}
    )
    lo, hi = _zoom_interval(tp, st, 100_000)
    assert hi - lo == 400 * MS
    assert lo <= T0_NS + 1300 * MS and hi >= T0_NS + 1500 * MS


def test_an_old_table_without_100us_rows_zooms_at_1ms(tmp_path: Path) -> None:
    metrics = _capped_cell(tmp_path)
    tp = pd.read_parquet(metrics / "throughput.parquet")
    tp[tp["bin_ms"] >= 1].to_parquet(metrics / "throughput.parquet")
    assert _widths(pd.read_parquet(metrics / "throughput.parquet"))[-1] == MS
    assert _plot(metrics, tmp_path / "old.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize("empty", ["throughput", "step_times"])
def test_an_empty_table_gives_a_no_data_figure(tmp_path: Path, empty: str) -> None:
    metrics = _capped_cell(tmp_path)
    table = pd.read_parquet(metrics / f"{empty}.parquet")
    table.iloc[0:0].to_parquet(metrics / f"{empty}.parquet")
    assert _plot(metrics, tmp_path / "none.png").read_bytes()[:8] == PNG_MAGIC


def test_the_frozen_look_is_seaborns() -> None:
    """The figures' style and colour-blind palette are seaborn's, written out so a cell's figure
    job need not import seaborn (commscope.plots._style): they must stay what seaborn gives."""
    import seaborn as sns

    from commscope.plots._style import COLORBLIND, SEABORN_STYLE

    style = {**sns.axes_style("whitegrid"), **sns.plotting_context("notebook", 0.9)}
    style.pop("image.cmap")  # seaborn's own colormap: every heatmap here names its colormap
    assert style == SEABORN_STYLE
    assert sns.color_palette("colorblind", 10).as_hex() == COLORBLIND
