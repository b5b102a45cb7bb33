"""What every figure shares: the look, an Agg canvas, colours and deterministic saving.

Figures are drawn on :class:`matplotlib.figure.Figure` objects with an Agg canvas, not
through pyplot: no global figure registry (no leaks in long Snakemake jobs), no display, and the
output depends only on the data (file names, colours and orders are all sorted), so reruns
produce the same PNG bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import matplotlib
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

DPI = 110

P = ParamSpec("P")
R = TypeVar("R")


# seaborn's look, frozen: ``{**sns.axes_style("whitegrid"), **sns.plotting_context("notebook",
# 0.9)}`` without its "image.cmap" (seaborn's own colormap, known to matplotlib only once seaborn
# is imported; every heatmap here names its colormap). Written out, so that a figure job need not
# import seaborn: its import (scipy.stats with it) was 2.3 s of the 4.5 s a cell's figure job
# spent on two cores, 76 times a study. tests/unit/test_cell_figure.py checks it against seaborn.
SEABORN_STYLE: dict[str, Any] = {
    "axes.axisbelow": True,
    "axes.edgecolor": ".8",
    "axes.facecolor": "white",
    "axes.grid": True,
    "axes.labelcolor": ".15",
    "axes.labelsize": 10.8,
    "axes.linewidth": 1.25,
    "axes.spines.bottom": True,
    "axes.spines.left": True,
    "axes.spines.right": True,
    "axes.spines.top": True,
    "axes.titlesize": 10.8,
    "figure.facecolor": "white",
    "font.family": ["sans-serif"],
    "font.sans-serif": [
        "Arial", "DejaVu Sans", "Liberation Sans", "Bitstream Vera Sans", "sans-serif",
    ],
    "font.size": 10.8,
    "grid.color": ".8",
    "grid.linestyle": "-",
    "grid.linewidth": 1,
    "legend.fontsize": 9.9,
    "legend.title_fontsize": 10.8,
    "lines.linewidth": 1.5,
    "lines.markersize": 6,
    "lines.solid_capstyle": "round",
    "patch.edgecolor": "w",
    "patch.force_edgecolor": True,
    "patch.linewidth": 1,
    "text.color": ".15",
    "xtick.bottom": False,
    "xtick.color": ".15",
    "xtick.direction": "out",
    "xtick.labelsize": 9.9,
    "xtick.major.size": 6,
    "xtick.major.width": 1.25,
    "xtick.minor.size": 4,
    "xtick.minor.width": 1,
    "xtick.top": False,
    "ytick.color": ".15",
    "ytick.direction": "out",
    "ytick.labelsize": 9.9,
    "ytick.left": False,
    "ytick.major.size": 6,
    "ytick.major.width": 1.25,
    "ytick.minor.size": 4,
    "ytick.minor.width": 1,
    "ytick.right": False,
}  # fmt: skip
# seaborn's "colorblind" palette (``sns.color_palette("colorblind", 10).as_hex()``), frozen as
# the style is (checked by the same test).
COLORBLIND: list[str] = [
    "#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc",
    "#ca9161", "#fbafe4", "#949494", "#ece133", "#56b4e9",
]  # fmt: skip


def _styled(func: Callable[P, R]) -> Callable[P, R]:
    """Draw with seaborn's whitegrid look at notebook scale (:data:`SEABORN_STYLE`), without
    touching global rcParams.

    Matplotlib reads rcParams when each artist is created (titles, legends, lines), so the
    whole plotting function runs inside the style context, not just the figure creation.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with matplotlib.rc_context(SEABORN_STYLE):
            return func(*args, **kwargs)

    return wrapper


def _new_figure(ncols: int = 1, width: float = 7.5, height: float = 4.2) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    # An explicit Agg canvas: headless on cluster nodes and CI, and no global backend switch
    # (matplotlib.use) that would surprise a notebook importing this module.
    FigureCanvasAgg(fig)
    return fig, list(fig.subplots(1, ncols, squeeze=False)[0])


def _save(fig: Figure, out_png: Path) -> Path:
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    # No timestamp or version in the PNG metadata: same data, same bytes.
    fig.savefig(out_png, dpi=DPI, metadata={"Software": None})
    return out_png


def _new_grid(
    panels: int, ncols: int = 3, width: float = 4.4, height: float = 3.4
) -> tuple[Figure, list]:
    """A figure of ``panels`` panels, ``ncols`` to a row at most, the rest wrapped onto new
    rows: returns the figure and the ``panels`` axes in reading order (unused grid places are
    hidden). Panels side by side without a limit made a 9-model study's figures 7,425 px wide
    strips that a 1280 px page shows 77 px tall; three to a row keeps every panel readable."""
    panels = max(panels, 1)
    ncols = min(ncols, panels)
    nrows = -(-panels // ncols)
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    grid = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in grid[panels:]:
        ax.set_visible(False)
    return fig, grid[:panels]


def _legend_below(fig: Figure, handles: dict[str, Any], title: str) -> None:
    """One legend for the whole figure, below its panels (never on the data), its entries in
    name order, as many columns as the longest label leaves room for."""
    if not handles:
        return
    labels = sorted(handles)
    width = fig.get_figwidth() * 10  # ~characters of small text across the figure
    fig.legend(
        [handles[label] for label in labels],
        labels,
        title=title,
        loc="outside lower center",
        ncols=max(1, min(len(labels), 6, int(width // (max(map(len, labels)) + 4)))),
        fontsize="small",
    )


def strategy_palette(names: Sequence[str]) -> dict[str, tuple]:
    """The one colour per strategy of every study figure: pass the study's strategy labels
    (every strategy, replays as ``replayed NAME``: :func:`commscope.metrics.study.strategy_label`
    of the summary), not a figure's own subset, so a strategy has the same colour in every
    figure of the report even where a figure shows only some strategies."""
    return _palette(names)


def _palette(names: Sequence[str]) -> dict[str, tuple]:
    """Colour per name, assigned in sorted order so a strategy keeps its colour everywhere.

    The colour-blind palette has 10 colours and repeats after them (the default study has 12
    strategies: DDP and TP were both blue), so names past the tenth get :data:`_MORE_COLOURS`,
    which are unlike any of the ten, and only past the twentieth do colours repeat."""
    ordered = sorted({str(n) for n in names})
    colours = [to_rgb(c) for c in (*COLORBLIND, *_MORE_COLOURS)]
    return {name: colours[i % len(colours)] for i, name in enumerate(ordered)}


# Ten more colours, each far from every colour of seaborn's colour-blind palette.
_MORE_COLOURS = [
    "#000000",
    "#7a7a00",
    "#000080",
    "#800000",
    "#008080",
    "#ff00ff",
    "#7fff00",
    "#a0522d",
    "#4b0082",
    "#ffd700",
]


def _no_data(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _plural(count: Any, noun: str) -> str:
    return f"{count} {noun}" if str(count) == "1" else f"{count} {noun}s"


def _frame(table: pd.DataFrame | str | Path) -> pd.DataFrame:
    """A table, or the parquet file holding it."""
    return table if isinstance(table, pd.DataFrame) else pd.read_parquet(table)


def _read_optional(path: Path | None) -> pd.DataFrame:
    """The parquet table at ``path``; an empty frame when there is none."""
    return pd.read_parquet(path) if path is not None and Path(path).exists() else pd.DataFrame()
