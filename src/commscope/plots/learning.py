"""Learning runs: training loss over steps per cell, and the MoE routing of every iteration,
from the tables of :func:`commscope.metrics.learning.aggregate_learning`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from commscope.plots._style import DPI


def plot_learning(loss: Path, routing: Path, out_dir: Path) -> list[Path]:
    """Loss over steps per cell (``learning_loss.png``) from ``loss`` (``loss.parquet``), and
    for MoE cells the routing of every iteration (``learning_moe_routing.png``) from ``routing``
    (``routing.parquet``), into ``out_dir``. A figure whose table is empty is not written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    loss_table = pd.read_parquet(loss)
    route = pd.read_parquet(routing)
    written = []
    if not loss_table.empty:
        written.append(_plot_loss(loss_table, out_dir / "learning_loss.png"))
    if not route.empty:
        written.append(_plot_routing(route, out_dir / "learning_moe_routing.png"))
    return written


def _figure(**subplots: object) -> tuple[Figure, object]:
    # Agg canvas, no pyplot: no global backend switch, no figure registry to close.
    fig = Figure(figsize=subplots.pop("figsize"))
    FigureCanvasAgg(fig)
    return fig, fig.subplots(**subplots)


def _plot_loss(loss: pd.DataFrame, path: Path) -> Path:
    fig, ax = _figure(figsize=(8, 4))
    for _cell, frame in loss.groupby("cell"):
        label = f"{frame.strategy.iloc[0]} / {frame.model.iloc[0]} / {frame.bw.iloc[0]}"
        ax.plot(frame.step, frame.train_loss, label=label, lw=1)
    ax.set(xlabel="step", ylabel="training loss (mean over ranks)", title="training loss")
    if loss.cell.nunique() <= 12:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path


def _plot_routing(route: pd.DataFrame, path: Path) -> Path:
    """The first MoE layer of the cell with the most steps."""
    longest = route.groupby("cell").step.max().idxmax()
    cell = route[route.cell == longest]
    layer = sorted(cell.layer.unique())[0]
    frame = cell[cell.layer == layer]
    fig, (top, bottom) = _figure(figsize=(8, 6), nrows=2, ncols=1, sharex=True)
    share = frame.pivot_table(index="step", columns="dst_rank", values="tokens")
    share = share.div(share.sum(axis=1), axis=0)
    share.plot.area(ax=top, colormap="viridis", lw=0)
    title = f"MoE routing, {layer}: {frame.strategy.iloc[0]} / {frame.model.iloc[0]}"
    top.set(ylabel="share of dispatched tokens", title=title)
    top.legend(title="EP rank", fontsize=7)
    nonuni = frame.drop_duplicates("step")
    sns.lineplot(data=nonuni, x="step", y="nonuniform", ax=bottom, label="non-uniform factor")
    bottom.set(ylabel="(max - min) / mean received")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path
