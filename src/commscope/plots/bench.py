"""Microbenchmark figures, drawn only from the analysis tables (:mod:`commscope.bench.analysis`).

Agg canvases, no pyplot (as the rest of :mod:`commscope.plots`): no global state, deterministic
output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from commscope.contracts import BENCH_FIGURES
from commscope.metrics.study import alpha_beta_curve
from commscope.plots._style import DPI
from commscope.units import binary_size_label

# The figures of the microbenchmark stage, by name (file stem: <name>.png).


def _grid(ops: list[str]) -> tuple[Figure, list]:
    cols = min(3, max(len(ops), 1))
    rows = math.ceil(len(ops) / cols) if ops else 1
    fig = Figure(figsize=(4.2 * cols, 3.4 * rows), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(max(len(ops), 1))]
    return fig, axes


def _per_op_figure(
    summary: pd.DataFrame,
    path: Path,
    ylabel: str,
    legend_title: str,
    draw: Callable[[Axes, str, str, pd.DataFrame, Any], None],
) -> Path:
    """One log-log panel per op, one colour per link setting: ``draw(ax, op, link, rows,
    colour)`` plots that link's rows of the op (sorted by size); the rest is shared."""
    ops = sorted(summary["op"].unique())
    links = sorted(summary["link"].unique())
    colors = dict(zip(links, sns.color_palette("colorblind", len(links)), strict=True))
    style = {**sns.axes_style("whitegrid"), **sns.plotting_context("notebook", 0.85)}
    with matplotlib.rc_context(style):
        fig, axes = _grid(ops)
        for ax, op in zip(axes, ops, strict=False):
            for link in links:
                d = summary[(summary["op"] == op) & (summary["link"] == link)].sort_values("bytes")
                if not d.empty:
                    draw(ax, op, link, d, colors[link])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(binary_size_label))
            ax.set_title(op)
            ax.set_xlabel("size (nccl-tests convention)")
            ax.set_ylabel(ylabel)
        axes[0].legend(fontsize=7, title=legend_title, title_fontsize=7)
        fig.tight_layout()
        fig.savefig(path)
    return Path(path)


def busbw_vs_size(summary: pd.DataFrame, path: Path) -> Path:
    """busbw (Mbit/s) vs message size per op, one line per link setting, its cap dashed."""

    def draw(ax: Axes, op: str, link: str, d: pd.DataFrame, color: Any) -> None:
        label = link.replace("/", " ")
        ax.plot(d["bytes"], d["busbw_Bps"] * 8 / 1e6, "o-", ms=3, color=color, label=label)
        cap = float(d["cap_Bps"].iloc[0])
        if np.isfinite(cap):
            ax.axhline(cap * 8 / 1e6, ls="--", lw=1, color=color)

    return _per_op_figure(summary, path, "busbw (Mbit/s)", "link (dashed: cap)", draw)


def time_vs_size(summary: pd.DataFrame, fit: pd.DataFrame, path: Path) -> Path:
    """Median time vs size per op (points, min-max bars) with the alpha-beta fit (lines)."""

    def draw(ax: Axes, op: str, link: str, d: pd.DataFrame, color: Any) -> None:
        err = [d["time_s"] - d["time_min_s"], d["time_max_s"] - d["time_s"]]
        ax.errorbar(d["bytes"], d["time_s"], yerr=err, fmt="o", ms=3, color=color,
                    label=link.replace("/", " "))  # fmt: skip
        f = fit[(fit["op"] == op) & (fit["link"] == link)]
        if f.empty:
            return
        sizes, t = alpha_beta_curve(f.iloc[0], op, d["bytes"].min(), d["bytes"].max())
        ax.plot(sizes, t, "-", lw=1, color=color)

    return _per_op_figure(summary, path, "time (s)", "link (line: alpha-beta fit)", draw)


def bench_figure_paths(out_dir: Path) -> dict[str, Path]:
    """The :data:`BENCH_FIGURES` files in ``out_dir``, by figure name."""
    return {name: Path(out_dir) / f"{name}.png" for name in BENCH_FIGURES}


def draw_bench_figures(
    summary: pd.DataFrame, fit: pd.DataFrame, figures: Mapping[str, Path]
) -> list[Path]:
    """Write each of :data:`BENCH_FIGURES` to ``figures[name]``; return the paths in that
    order."""
    for path in figures.values():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    return [
        busbw_vs_size(summary, figures["busbw_vs_size"]),
        time_vs_size(summary, fit, figures["time_vs_size"]),
    ]


def bench_figures(summary: pd.DataFrame, fit: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Write :data:`BENCH_FIGURES` as ``<name>.png`` into ``out_dir`` (a convenience for tests
    and interactive use)."""
    return draw_bench_figures(summary, fit, bench_figure_paths(out_dir))


def bench_figures_from(summary: Path, fit: Path, figures: Mapping[str, Path]) -> list[Path]:
    """:func:`draw_bench_figures` from the ``summary.parquet`` and ``fit.parquet`` files given,
    to the files ``figures`` names."""
    return draw_bench_figures(pd.read_parquet(summary), pd.read_parquet(fit), figures)
