"""Burst size and duration per strategy, side by side (the study figure ``bursts.png``), from
the aggregated :mod:`commscope.metrics.temporal` on/off table."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from commscope.metrics.study import strategy_label, unshaped_rows
from commscope.plots._style import _new_figure, _no_data, _save, _styled, strategy_palette
from commscope.units import bytes_tick

# (column prefix of temporal_onoff, axis label)
_PANELS = (("burst_bytes", "burst size (log)"), ("burst_ms", "burst duration (ms, log)"))


def burst_rows(onoff: pd.DataFrame) -> pd.DataFrame:
    """The rows the figure draws: transmit side of every node, unshaped cells (no cap, delay,
    jitter or loss), at least one burst; one row per (cell, node)."""
    if onoff.empty:
        return onoff
    return unshaped_rows(onoff[(onoff["direction"] == "tx") & (onoff["n_bursts"] > 0)])


def plot_bursts(
    onoff: pd.DataFrame, out_png: Path, palette: Mapping[str, tuple] | None = None
) -> Path:
    """Draw :func:`bursts_figure` to ``out_png``."""
    return _save(bursts_figure(onoff, palette), out_png)


@_styled
def bursts_figure(onoff: pd.DataFrame, palette: Mapping[str, tuple] | None = None) -> Figure:
    """Two panels, burst size and burst duration, one column per strategy: for every node of
    every unshaped cell of the strategy its median burst (dot), the 90th percentile (bar top)
    and the largest burst (cross), log y. ``palette``: the study's colour per strategy
    (:func:`~commscope.plots.study.study_palette`); the figure's own strategies without one.
    Bursts are runs of "on" 100 µs bins (docs/temporal.md:
    on above 10 % of the cell's peak bin on an unshaped link)."""
    rows = burst_rows(onoff)
    fig, axes = _new_figure(len(_PANELS), width=6.0, height=4.2)
    if rows.empty:
        for ax in axes:
            _no_data(ax, "bursts on an unshaped link")
        return fig
    rows = rows.assign(strategy=strategy_label(rows).astype(str))
    strategies = sorted(rows["strategy"].unique())
    if palette is None:
        palette = strategy_palette(strategies)
    for ax, (prefix, label) in zip(axes, _PANELS, strict=True):
        for x, name in enumerate(strategies):
            sub = rows[rows["strategy"].astype(str) == name]
            # Spread a strategy's nodes and cells a little so their points do not hide each other.
            offsets = np.linspace(-0.2, 0.2, len(sub)) if len(sub) > 1 else np.zeros(1)
            med = sub[f"{prefix}_median"].to_numpy(float)
            p90 = sub[f"{prefix}_p90"].to_numpy(float)
            top = sub[f"{prefix}_max"].to_numpy(float)
            colour = palette.get(name) or strategy_palette([name])[name]
            ax.vlines(x + offsets, med, p90, color=colour, linewidth=2)
            ax.scatter(x + offsets, med, color=colour, s=28, zorder=3)
            ax.scatter(x + offsets, top, color=colour, marker="x", s=22, zorder=3)
        ax.set_yscale("log")
        ax.set_xticks(range(len(strategies)), strategies, rotation=30, ha="right")
        ax.set_ylabel(label)
        if prefix == "burst_bytes":
            ax.yaxis.set_major_formatter(FuncFormatter(bytes_tick))
    axes[0].set_title("burst size per node (dot median, bar to p90, x largest)")
    axes[1].set_title("burst duration per node")
    fig.suptitle("Bursts on the unshaped link, 100 µs bins, transmit side")
    return fig
