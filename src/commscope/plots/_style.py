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
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 110

P = ParamSpec("P")
R = TypeVar("R")


def _styled(func: Callable[P, R]) -> Callable[P, R]:
    """Draw with seaborn's whitegrid look at notebook scale, without touching global rcParams.

    Matplotlib reads rcParams when each artist is created (titles, legends, lines), so the
    whole plotting function runs inside the style context, not just the figure creation.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        style = {**sns.axes_style("whitegrid"), **sns.plotting_context("notebook", 0.9)}
        with matplotlib.rc_context(style):
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


def _palette(names: Sequence[str]) -> dict[str, tuple]:
    """Colour per name, assigned in sorted order so a strategy keeps its colour everywhere.

    The colour-blind palette has 10 colours and repeats after them (the default study has 12
    strategies: DDP and TP were both blue), so names past the tenth get :data:`_MORE_COLOURS`,
    which are unlike any of the ten, and only past the twentieth do colours repeat."""
    ordered = sorted({str(n) for n in names})
    colours = [*sns.color_palette("colorblind", 10), *sns.color_palette(_MORE_COLOURS)]
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
