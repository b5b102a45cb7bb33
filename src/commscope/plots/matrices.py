"""Communication matrices: node x node and rank x rank bytes per measured step, as heatmaps on
one colour scale (also used for predicted scenarios, :mod:`.scenarios`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from commscope.collectives.matrix import positive_int
from commscope.contracts import PARAM_COLUMNS
from commscope.plots._style import _new_figure, _no_data, _plural, _read_optional, _save, _styled

# Cells larger than this are drawn without numbers in every square: they would not fit.
_MAX_ANNOTATED = 8
_MATRIX_PANEL_COLS = 3
# Node frames in a colour that stands out on both ends of the light-to-dark "rocket" scale.
_NODE_FRAME = {"color": "tab:cyan", "linewidth": 1.8}
# A shared colour scale turns logarithmic when panels differ by more than this factor, as in
# plot_bytes_per_step: a linear scale would paint the small strategy all white.
_LOG_SCALE_RATIO = 100


def representative_cells(table: pd.DataFrame, summary: pd.DataFrame | None = None) -> pd.DataFrame:
    """One cell per (model, strategy) to draw a communication matrix for.

    The cell with the most nodes (then the most ranks per node) shows the most structure; among
    those the one with the highest cap, no cap first (``bw_bps`` from ``summary``; a cell
    missing there counts as uncapped), because traffic volume does not depend on the cap and an
    uncapped run is the least perturbed; then the first repeat and the first cell id, so the
    choice is deterministic. ``table`` is any table with cell parameters (e.g. node_matrix).

    Columns: the cell parameter columns of ``table`` (at least cell, strategy), sorted by
    model and strategy.
    """
    params = [c for c in PARAM_COLUMNS if c in table.columns]
    if table.empty or "cell" not in table or "strategy" not in table:
        return pd.DataFrame(columns=params)
    cells = table.drop_duplicates("cell")[params].copy()
    cap = pd.Series(np.nan, index=cells.index)
    if summary is not None and {"cell", "bw_bps"} <= set(summary.columns):
        caps = summary.drop_duplicates("cell").set_index("cell")["bw_bps"].astype("float64")
        cap = cells["cell"].map(caps)
    cells["_cap"] = cap.astype("float64").fillna(math.inf)
    order = [
        ("model", True),
        ("strategy", True),
        ("nodes", False),
        ("ranks_per_node", False),
        ("_cap", False),
        ("repeat", True),
        ("cell", True),
    ]
    by = [(c, asc) for c, asc in order if c in cells.columns]
    cells = cells.sort_values([c for c, _ in by], ascending=[a for _, a in by], kind="stable")
    keys = [c for c in ("model", "strategy") if c in cells.columns]
    return cells.groupby(keys, sort=True).head(1).drop(columns="_cap").reset_index(drop=True)


def plot_comm_matrices(
    node_matrix: Path,
    comm_matrix: Path,
    summary: pd.DataFrame,
    out_nodes: Path,
    out_ranks: Path,
) -> list[Path]:
    """Draw ``comm_matrix_nodes.png`` (to ``out_nodes``) and ``comm_matrix_ranks.png`` (to
    ``out_ranks``); return their paths.

    Both show bytes per measured step (MB, one colour scale shared by all panels), one panel
    per strategy (and model, when several) for the cell :func:`representative_cells` picks
    (caps from the aggregated ``summary``): node x node from ``node_matrix`` (the aggregated
    ``node_matrix.parquet``), whose framed diagonal is traffic inside a node, and rank x rank
    from ``comm_matrix`` (``comm_matrix.parquet``), with lines at node boundaries. Rows send,
    columns receive. A missing table (an aggregate made before the matrices existed) gives a
    "no data" figure rather than failing.
    """
    return [
        plot_node_matrix(_read_optional(node_matrix), summary, out_nodes),
        plot_rank_matrix(_read_optional(comm_matrix), summary, out_ranks),
    ]


@_styled
def plot_node_matrix(node_mat: pd.DataFrame, summary: pd.DataFrame, out_png: Path) -> Path:
    """Node x node heatmaps, one per strategy; see :func:`plot_comm_matrices`."""
    panels = []
    for cell in representative_cells(node_mat, summary).to_dict("records"):
        rows = node_mat[node_mat["cell"] == cell["cell"]]
        grid = rows.pivot_table(
            index="src_node", columns="dst_node", values="bytes", aggfunc="sum", fill_value=0.0
        )
        nodes = sorted(set(grid.index) | set(grid.columns))
        grid = grid.reindex(index=nodes, columns=nodes, fill_value=0.0)
        panels.append((_panel_title(cell), grid, nodes))
    return _draw_matrices(
        panels,
        Path(out_png),
        unit="node",
        title="bytes per measured step between nodes (MB); dashed frames: inside a node",
    )


@_styled
def plot_rank_matrix(rank_mat: pd.DataFrame, summary: pd.DataFrame, out_png: Path) -> Path:
    """Rank x rank heatmaps, one per strategy; see :func:`plot_comm_matrices`."""
    panels = []
    for cell in representative_cells(rank_mat, summary).to_dict("records"):
        rows = rank_mat[rank_mat["cell"] == cell["cell"]]
        node_of = {
            **dict(zip(rows["dst_rank"], rows["dst_node"], strict=True)),
            **dict(zip(rows["src_rank"], rows["src_node"], strict=True)),
        }
        world = positive_int(cell.get("nodes")) * positive_int(cell.get("ranks_per_node"))
        ranks = sorted(set(node_of) | set(range(world)))
        rpn = positive_int(cell.get("ranks_per_node"))
        # Ranks that never sent nor received still get a row, placed the way ranks are.
        nodes = [int(node_of.get(r, r // rpn if rpn else -1)) for r in ranks]
        grid = rows.pivot_table(
            index="src_rank", columns="dst_rank", values="bytes", aggfunc="sum", fill_value=0.0
        ).reindex(index=ranks, columns=ranks, fill_value=0.0)
        panels.append((_panel_title(cell), grid, nodes))
    return _draw_matrices(
        panels,
        Path(out_png),
        unit="rank",
        title="bytes per measured step between ranks (MB); lines separate nodes",
    )


def _panel_title(cell: dict[str, Any]) -> str:
    """Strategy (and model) over the cell's shape, cap and repeat."""
    shape = ""
    if "nodes" in cell and "ranks_per_node" in cell:
        shape = f"{_plural(cell['nodes'], 'node')} × {_plural(cell['ranks_per_node'], 'rank')}"
    details = ", ".join(
        x
        for x in (
            shape,
            f"bw {cell['bw']}" if "bw" in cell else "",
            f"repeat {cell['repeat']}" if "repeat" in cell else "",
        )
        if x
    )
    model = f" — {cell['model']}" if "model" in cell else ""
    return f"{cell['strategy']}{model}\n{details}"


def _mb_label(value_bytes: float, scale: float = 1e6) -> str:
    """Bytes shown in units of ``scale`` (MB by default) with as many digits as a small cell
    needs."""
    mb = value_bytes / scale
    if mb == 0:
        return "0"
    if mb >= 100:
        return f"{mb:.0f}"
    if mb >= 0.01:
        return f"{mb:.2f}"
    return f"{mb:.2g}"


def _draw_matrices(
    panels: list[tuple[str, pd.DataFrame, list[int]]],
    out_png: Path,
    *,
    unit: str,
    title: str,
    scale: tuple[float, str] = (1e6, "MB"),
    vmax_bytes: float | None = None,
    log_scale: bool | None = None,
) -> Path:
    """Heatmaps of square byte matrices on one shared colour scale.

    ``panels`` are (title, matrix of bytes with sender rows and receiver columns, node of each
    row). For ``unit="node"`` the diagonal squares are framed (traffic inside a node); for
    ``unit="rank"`` lines mark where the node changes along the axes. ``scale`` is the
    display unit (bytes per unit, name); ``vmax_bytes`` fixes the top of the colour scale, so
    figures drawn separately stay comparable. ``log_scale`` None: logarithmic when the
    positive values span more than a factor 100.
    """
    per_unit, unit_name = scale
    if not panels:
        fig, (ax,) = _new_figure(1, width=6.0, height=4.0)
        _no_data(ax, "communication matrix")
        ax.set_title(title, fontsize="small")
        return _save(fig, out_png)
    ncols = min(len(panels), _MATRIX_PANEL_COLS)
    nrows = math.ceil(len(panels) / ncols)
    size = max(len(m) for _, m, _ in panels)
    side = min(max(3.4, 0.32 * size + 1.6), 8.0)
    fig = Figure(figsize=(side * ncols + 1.2, side * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(nrows, ncols, squeeze=False).flat)

    values = np.concatenate([m.to_numpy(dtype="float64").ravel() for _, m, _ in panels]) / per_unit
    norm, is_log = _colour_norm(values, vmax_bytes, per_unit, log_scale)
    label = f"{unit_name} per step" + (" (log scale; white = 0)" if is_log else "")
    # Zero-byte pairs are masked under a log norm: white, like a linear scale's zero.
    cmap = sns.color_palette("rocket_r", as_cmap=True).with_extremes(bad="white")
    mesh = None
    for ax, (panel_title, matrix, nodes) in zip(axes, panels, strict=False):
        mesh = _heatmap(ax, matrix, nodes, unit=unit, cmap=cmap, norm=norm, per_unit=per_unit)
        ax.set_title(panel_title, fontsize="small")
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    if mesh is not None:
        fig.colorbar(mesh, ax=axes[: len(panels)], label=label, shrink=0.85)
    fig.suptitle(title, fontsize="medium")
    return _save(fig, out_png)


def _colour_norm(
    values: np.ndarray, vmax_bytes: float | None, per_unit: float, log_scale: bool | None
) -> tuple[Normalize, bool]:
    """The shared colour scale of :func:`_draw_matrices` over ``values`` (in display units),
    and whether it is logarithmic."""
    vmax = float(values.max()) if values.size else 0.0
    if vmax_bytes is not None:
        vmax = max(vmax, float(vmax_bytes) / per_unit)
    positive = values[values > 0]
    if log_scale is None:
        log_scale = bool(positive.size) and vmax / float(positive.min()) > _LOG_SCALE_RATIO
    if log_scale and positive.size:
        return LogNorm(vmin=float(positive.min()), vmax=vmax), True
    return Normalize(vmin=0.0, vmax=vmax if vmax > 0 else 1.0), False


def _heatmap(
    ax: Axes,
    matrix: pd.DataFrame,
    nodes: list[int],
    *,
    unit: str,
    cmap: Any,
    norm: Normalize,
    per_unit: float,
) -> Any:
    """One panel of :func:`_draw_matrices`; returns its mesh (for the shared colour bar)."""
    annotate = len(matrix) <= _MAX_ANNOTATED
    sns.heatmap(
        matrix / per_unit,
        ax=ax,
        cmap=cmap,
        norm=norm,
        cbar=False,
        square=True,
        annot=matrix.map(lambda b: _mb_label(b, per_unit)).to_numpy() if annotate else False,
        fmt="",
        annot_kws={"fontsize": "small"},
        linewidths=0.5 if annotate else 0.0,
        linecolor="0.9",
    )
    _mark_nodes(ax, nodes, unit)
    ax.set_xlabel(f"receiving {unit}")
    ax.set_ylabel(f"sending {unit}")
    ax.tick_params(axis="y", rotation=0)
    return ax.collections[0]


def _mark_nodes(ax: Axes, nodes: list[int], unit: str) -> None:
    """Frame each node's own traffic: the diagonal squares of a node matrix, the diagonal
    blocks (lines where the node changes) of a rank matrix."""
    if unit == "node":
        for i in range(len(nodes)):
            ax.add_patch(
                Rectangle(
                    (i, i),
                    1,
                    1,
                    fill=False,
                    edgecolor=_NODE_FRAME["color"],
                    linewidth=_NODE_FRAME["linewidth"],
                    linestyle="--",
                    zorder=3,
                )
            )
        return
    for i in range(1, len(nodes)):
        if nodes[i] != nodes[i - 1]:
            ax.axhline(i, **_NODE_FRAME)
            ax.axvline(i, **_NODE_FRAME)
