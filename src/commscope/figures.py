"""Figures from the metric tables (never from raw traces: analysis lives in :mod:`metrics`).

Figures are drawn on :class:`matplotlib.figure.Figure` objects with an Agg canvas, not
through pyplot: no global figure registry (no leaks in long Snakemake jobs), no display, and the
output depends only on the data (file names, colours and orders are all sorted), so reruns
produce the same PNG bytes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter

from commscope.metrics import PARAM_COLUMNS, size_cdf, step_times

DPI = 110
STUDY_FIGURES = (
    "msg_size_cdf",
    "step_time_vs_bw",
    "bytes_per_step_by_op",
    "comm_matrix_nodes",
    "comm_matrix_ranks",
)
# Parameters that, besides strategy and model, tell series apart in sweep plots.
_SERIES_AXES = ("nodes", "ranks_per_node", "delay", "jitter", "loss")
_MAX_STEP_LINES = 60

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
    """Colour per name, assigned in sorted order so a strategy keeps its colour everywhere."""
    ordered = sorted({str(n) for n in names})
    return dict(zip(ordered, sns.color_palette("colorblind", max(len(ordered), 1)), strict=False))


def _no_data(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _wrap_cell_id(cell: str, width: int = 80) -> str:
    """Break a long cell id at its '/' separators so the title stays inside the figure."""
    lines, line = [], ""
    for part in str(cell).split("/"):
        candidate = f"{line}/{part}" if line else part
        if line and len(candidate) > width:
            lines.append(line + "/")
            line = part
        else:
            line = candidate
    lines.append(line)
    return "\n".join(lines)


def human_bytes(value: float, _pos: object = None) -> str:
    """SI byte size for axis ticks: 1 kB = 1000 B."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:g} {unit}"
    return f"{value:g} B"


# --------------------------------------------------------------------------------------------
# Per cell
# --------------------------------------------------------------------------------------------


@_styled
def plot_cell_throughput(
    metrics_dir: Path, steps_path: Path, out_png: Path, bin_ms: int = 10
) -> Path:
    """Transmit throughput of every node over time, one line per node, for one cell.

    Reads ``throughput.parquet`` (and, when present, ``summary.parquet`` for the bandwidth cap
    and ``step_times.parquet`` for the warm-up flag) from ``metrics_dir`` and the cell's
    ``steps.parquet``. Dotted vertical lines mark step boundaries, shading the warm-up steps,
    a dashed line the cap. Time is in seconds since the first step started.
    """
    metrics_dir = Path(metrics_dir)
    tp = pd.read_parquet(metrics_dir / "throughput.parquet")
    tp = tp[tp["bin_ms"] == bin_ms]
    st = step_times(pd.read_parquet(steps_path), warmup_steps=0)
    st_path = metrics_dir / "step_times.parquet"
    if st_path.exists():
        warm = pd.read_parquet(st_path)[["step", "warmup"]]
        st = st.drop(columns="warmup").merge(warm, on="step", how="left")
        st["warmup"] = st["warmup"].astype("boolean").fillna(False).astype(bool)
    cell = _first(tp, "cell") or _first(st, "cell") or str(metrics_dir)
    cap_bps = _cap_bps(metrics_dir / "summary.parquet")

    fig, (ax,) = _new_figure()
    if not st.empty:
        origin = int(st["t_start_ns"].min())
    else:
        origin = int(tp["t_start_ns"].min()) if not tp.empty else 0
    title = f"tx throughput, {bin_ms} ms bins\n{_wrap_cell_id(cell)}"
    if tp.empty:
        _no_data(ax, f"counter samples at {bin_ms} ms")
    else:
        palette = _palette([f"node {n}" for n in tp["node"].unique()])
        for node, sub in tp.sort_values("t_start_ns").groupby("node", sort=True):
            edges_ns = np.append(sub["t_start_ns"].to_numpy(), sub["t_start_ns"].iloc[-1])
            edges_ns[-1] += int(bin_ms * 1_000_000)
            label = f"node {node}"
            mbps = sub["tx_bps"].to_numpy() / 1e6
            # A steps-post line, not ax.stairs: a patch with 10**5 edges is slow to lay out.
            ax.plot(
                (edges_ns - origin) / 1e9,
                np.append(mbps, mbps[-1]),
                drawstyle="steps-post",
                label=label,
                color=palette[label],
                linewidth=1.1,
                alpha=0.9,
            )
        if not bool(tp["resolved"].all()):
            title += "\n(bins finer than the counter sampling: rates are smeared)"
        _mark_steps(ax, st, origin)
        if cap_bps:
            ax.axhline(cap_bps / 1e6, color="0.3", linestyle="--", linewidth=1, label="cap")
        ax.set_ylim(bottom=0)
        # Outside the axes: bursts reach the top right as often as anywhere else.
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ax.set_xlabel("time since first step (s)")
    ax.set_ylabel("tx throughput (Mbit/s)")
    ax.set_title(title, fontsize="small")
    return _save(fig, out_png)


def _first(df: pd.DataFrame, col: str) -> str | None:
    return str(df[col].iloc[0]) if col in df.columns and not df.empty else None


def _cap_bps(summary_path: Path) -> float | None:
    if not summary_path.exists():
        return None
    summary = pd.read_parquet(summary_path)
    if summary.empty or "bw_bps" not in summary:
        return None
    cap = summary["bw_bps"].iloc[0]
    return float(cap) if pd.notna(cap) and cap else None


def _mark_steps(ax: Axes, st: pd.DataFrame, origin: int) -> None:
    if st.empty:
        return
    starts = (st["t_start_ns"].to_numpy() - origin) / 1e9
    # Hundreds of boundary lines would paint the plot grey: thin them out evenly and say so.
    stride = max(1, math.ceil(len(starts) / _MAX_STEP_LINES))
    lines = np.append(starts[::stride], (st["t_end_ns"].max() - origin) / 1e9)
    ax.vlines(
        lines,
        0,
        1,
        transform=ax.get_xaxis_transform(),
        colors="0.55",
        linestyles=":",
        linewidth=0.8,
        zorder=0,
        label="step start" if stride == 1 else f"every {stride}th step start",
    )
    warm = st[st["warmup"]]
    for i, (a, b) in enumerate(zip(warm["t_start_ns"], warm["t_end_ns"], strict=True)):
        ax.axvspan(
            (a - origin) / 1e9,
            (b - origin) / 1e9,
            color="0.9",
            zorder=-1,
            label="warm-up" if i == 0 else None,
        )


# --------------------------------------------------------------------------------------------
# Across cells
# --------------------------------------------------------------------------------------------


def plot_study(aggregate_dir: Path, out_dir: Path) -> list[Path]:
    """Draw the cross-cell figures from the aggregated tables; return their paths.

    ``msg_size_cdf.png``: message-size CDF per strategy (measured steps only, log x).
    ``step_time_vs_bw.png``: mean step time vs bandwidth cap per strategy, error bars are the
    standard deviation over repeats; the uncapped cells sit at the right, labelled "no cap".
    ``bytes_per_step_by_op.png``: framework bytes per measured step by op type and strategy.
    ``comm_matrix_nodes.png``, ``comm_matrix_ranks.png``: node x node and rank x rank bytes per
    measured step, one representative cell per strategy (see :func:`plot_comm_matrices`).
    One panel per model when several models were run. Every figure is always written (with a
    "no data" note when its table is empty) so pipeline outputs are predictable.
    """
    aggregate_dir, out_dir = Path(aggregate_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        plot_size_cdf(pd.read_parquet(aggregate_dir / "msg_sizes.parquet"), out_dir),
        plot_step_time_vs_bw(pd.read_parquet(aggregate_dir / "summary.parquet"), out_dir),
        plot_bytes_per_step(
            pd.read_parquet(aggregate_dir / "op_volume.parquet"),
            pd.read_parquet(aggregate_dir / "step_times.parquet"),
            out_dir,
        ),
        *plot_comm_matrices(aggregate_dir, out_dir),
    ]


def _models(df: pd.DataFrame) -> list[str]:
    return sorted(df["model"].astype(str).unique()) if "model" in df and not df.empty else [""]


def _model_rows(df: pd.DataFrame, model: str) -> pd.DataFrame:
    return df[df["model"].astype(str) == model] if model else df


@_styled
def plot_size_cdf(msgs: pd.DataFrame, out_dir: Path) -> Path:
    """Message-size CDF per strategy (one panel per model); see :func:`plot_study`."""
    if "measured" in msgs and bool(msgs["measured"].any()):
        msgs = msgs[msgs["measured"].astype(bool)]
    cdf = size_cdf(msgs, by=["model", "strategy"]) if not msgs.empty else pd.DataFrame()
    models = _models(cdf)
    fig, axes = _new_figure(len(models))
    palette = _palette(cdf["strategy"].astype(str)) if not cdf.empty else {}
    for ax, model in zip(axes, models, strict=True):
        rows = _model_rows(cdf, model)
        if rows.empty:
            _no_data(ax, "messages")
            continue
        for strategy, sub in rows.groupby("strategy", sort=True):
            # Start the staircase at 0 just left of the smallest size so the jump is visible.
            x = np.concatenate([[sub["bytes"].iloc[0]], sub["bytes"].to_numpy()])
            y = np.concatenate([[0.0], sub["cum_fraction"].to_numpy()])
            ax.step(x, y, where="post", label=str(strategy), color=palette[str(strategy)])
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(human_bytes))
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("message size (payload per rank, log scale)")
        ax.set_ylabel("fraction of messages ≤ size")
        ax.set_title(f"message sizes{f' — {model}' if model else ''}")
        ax.legend(title="strategy", fontsize="small")
    return _save(fig, out_dir / "msg_size_cdf.png")


def _series_label(row: pd.Series, varying: list[str]) -> str:
    extra = ", ".join(f"{c}={row[c]}" for c in varying)
    return f"{row['strategy']} ({extra})" if extra else str(row["strategy"])


@_styled
def plot_step_time_vs_bw(summary: pd.DataFrame, out_dir: Path) -> Path:
    """Step time vs bandwidth cap per strategy (one panel per model); see :func:`plot_study`."""
    models = _models(summary)
    fig, axes = _new_figure(len(models))
    if summary.empty:
        _no_data(axes[0], "cells")
        return _save(fig, out_dir / "step_time_vs_bw.png")
    df = summary.copy()
    df["cap_mbps"] = df["bw_bps"].astype("float64") / 1e6
    finite = df["cap_mbps"].dropna()
    # Uncapped cells get a position right of the largest cap (log axis: a factor, not a sum),
    # and their own tick label, instead of being dropped or drawn at a made-up rate.
    no_cap_x = float(finite.max() * 4) if not finite.empty else 1.0
    df["x"] = df["cap_mbps"].fillna(no_cap_x)
    varying = [c for c in _SERIES_AXES if c in df and df[c].nunique(dropna=False) > 1]
    keys = ["model", "strategy", *varying, "bw", "x"]
    agg = (
        df.groupby(keys, sort=True, dropna=False)["step_time_mean_s"]
        .agg(mean="mean", std="std", repeats="count")
        .reset_index()
    )
    agg["std"] = agg["std"].fillna(0.0)  # a single repeat has no spread to show
    agg["label"] = agg.apply(_series_label, axis=1, varying=varying)
    palette = _palette(agg["strategy"].astype(str))
    markers = ["o", "s", "^", "D", "v", "P", "X"]
    for ax, model in zip(axes, models, strict=True):
        rows = _model_rows(agg, model)
        for i, (label, sub) in enumerate(rows.groupby("label", sort=True)):
            sub = sub.sort_values("x")
            ax.errorbar(
                sub["x"],
                sub["mean"] * 1e3,
                yerr=sub["std"] * 1e3,
                label=label,
                color=palette[str(sub["strategy"].iloc[0])],
                marker=markers[i % len(markers)],
                capsize=3,
                linewidth=1.3,
            )
        ax.set_xscale("log")
        ticks = sorted(set(finite.tolist()))
        labels = [f"{t:g}" for t in ticks]
        if df["cap_mbps"].isna().any():
            ticks.append(no_cap_x)
            labels.append("no cap")
            if not finite.empty:
                ax.axvline(math.sqrt(finite.max() * no_cap_x), color="0.7", ls=":", lw=0.8)
        ax.set_xticks(ticks, labels)
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
        ax.set_ylim(bottom=0)
        ax.set_xlabel("bandwidth cap (Mbit/s, log scale)")
        ax.set_ylabel("step time (ms), mean ± sd over repeats")
        ax.set_title(f"step time vs bandwidth{f' — {model}' if model else ''}")
        ax.legend(title="strategy", fontsize="small")
    return _save(fig, out_dir / "step_time_vs_bw.png")


def bytes_per_step_by_op(op_volume: pd.DataFrame, step_table: pd.DataFrame) -> pd.DataFrame:
    """Mean framework bytes per measured step, per (model, strategy, op), over cells.

    Steps in which an op did not occur count as zero, by dividing each cell's total by its
    number of measured steps. Columns: model, strategy, op, bytes_per_step, cells.
    """
    cols = ["model", "strategy", "op", "bytes_per_step", "cells"]
    if op_volume.empty or step_table.empty:
        return pd.DataFrame(columns=cols)
    measured = step_table[~step_table["warmup"].astype(bool)][["cell", "step"]]
    n_steps = measured.groupby("cell").size().rename("n_steps")
    vol = op_volume.merge(measured, on=["cell", "step"], how="inner")
    per_cell = vol.groupby(["cell", "model", "strategy", "op"], sort=True)["bytes"].sum()
    per_cell = per_cell.reset_index().join(n_steps, on="cell")
    per_cell["bytes_per_step"] = per_cell["bytes"] / per_cell["n_steps"]
    out = (
        per_cell.groupby(["model", "strategy", "op"], sort=True)
        .agg(bytes_per_step=("bytes_per_step", "mean"), cells=("cell", "nunique"))
        .reset_index()
    )
    return out[cols]


@_styled
def plot_bytes_per_step(op_volume: pd.DataFrame, step_table: pd.DataFrame, out_dir: Path) -> Path:
    """Bar chart of framework bytes per step by op and strategy; see :func:`plot_study`."""
    data = bytes_per_step_by_op(op_volume, step_table)
    data = data[data["bytes_per_step"] > 0]
    models = _models(data)
    fig, axes = _new_figure(len(models))
    palette = _palette(data["op"].astype(str)) if not data.empty else {}
    for ax, model in zip(axes, models, strict=True):
        rows = _model_rows(data, model)
        if rows.empty:
            _no_data(ax, "communication in measured steps")
            continue
        rows = rows.assign(mb=rows["bytes_per_step"] / 1e6)
        sns.barplot(
            data=rows,
            x="strategy",
            y="mb",
            hue="op",
            hue_order=sorted(rows["op"].unique()),
            order=sorted(rows["strategy"].unique()),
            palette=palette,
            errorbar=None,
            ax=ax,
        )
        # Strategies differ by orders of magnitude (DDP vs PP): a linear axis hides the small.
        if rows["mb"].max() / rows["mb"].min() > 100:
            ax.set_yscale("log")
        ax.set_xlabel("strategy")
        ax.set_ylabel("MB per step (all ranks, payload)")
        ax.set_title(f"bytes per step by op{f' — {model}' if model else ''}")
        ax.legend(title="op", fontsize="small")
    return _save(fig, out_dir / "bytes_per_step_by_op.png")


# --------------------------------------------------------------------------------------------
# Communication matrices
# --------------------------------------------------------------------------------------------

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


def plot_comm_matrices(aggregate_dir: Path, out_dir: Path) -> list[Path]:
    """Draw ``comm_matrix_nodes.png`` and ``comm_matrix_ranks.png``; return their paths.

    Both show bytes per measured step (MB, one colour scale shared by all panels), one panel
    per strategy (and model, when several) for the cell :func:`representative_cells` picks:
    node x node from ``node_matrix.parquet``, whose framed diagonal is traffic inside a node,
    and rank x rank from ``comm_matrix.parquet``, with lines at node boundaries. Rows send,
    columns receive. Tables missing from ``aggregate_dir`` (an aggregate made before the
    matrices existed) give "no data" figures rather than failing.
    """
    aggregate_dir, out_dir = Path(aggregate_dir), Path(out_dir)
    summary = _read_optional(aggregate_dir / "summary.parquet")
    return [
        plot_node_matrix(_read_optional(aggregate_dir / "node_matrix.parquet"), summary, out_dir),
        plot_rank_matrix(_read_optional(aggregate_dir / "comm_matrix.parquet"), summary, out_dir),
    ]


def _read_optional(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if Path(path).exists() else pd.DataFrame()


@_styled
def plot_node_matrix(node_mat: pd.DataFrame, summary: pd.DataFrame, out_dir: Path) -> Path:
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
        out_dir / "comm_matrix_nodes.png",
        unit="node",
        title="bytes per measured step between nodes (MB); dashed frames: inside a node",
    )


@_styled
def plot_rank_matrix(rank_mat: pd.DataFrame, summary: pd.DataFrame, out_dir: Path) -> Path:
    """Rank x rank heatmaps, one per strategy; see :func:`plot_comm_matrices`."""
    panels = []
    for cell in representative_cells(rank_mat, summary).to_dict("records"):
        rows = rank_mat[rank_mat["cell"] == cell["cell"]]
        node_of = {
            **dict(zip(rows["dst_rank"], rows["dst_node"], strict=True)),
            **dict(zip(rows["src_rank"], rows["src_node"], strict=True)),
        }
        world = _positive(cell.get("nodes")) * _positive(cell.get("ranks_per_node"))
        ranks = sorted(set(node_of) | set(range(world)))
        rpn = _positive(cell.get("ranks_per_node"))
        # Ranks that never sent nor received still get a row, placed the way ranks are.
        nodes = [int(node_of.get(r, r // rpn if rpn else -1)) for r in ranks]
        grid = rows.pivot_table(
            index="src_rank", columns="dst_rank", values="bytes", aggfunc="sum", fill_value=0.0
        ).reindex(index=ranks, columns=ranks, fill_value=0.0)
        panels.append((_panel_title(cell), grid, nodes))
    return _draw_matrices(
        panels,
        out_dir / "comm_matrix_ranks.png",
        unit="rank",
        title="bytes per measured step between ranks (MB); lines separate nodes",
    )


def _positive(value: Any) -> int:
    """``value`` as a non-negative int; 0 when absent, null or not a number."""
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return 0


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


def _plural(count: Any, noun: str) -> str:
    return f"{count} {noun}" if str(count) == "1" else f"{count} {noun}s"


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
    vmax = float(values.max()) if values.size else 0.0
    if vmax_bytes is not None:
        vmax = max(vmax, float(vmax_bytes) / per_unit)
    positive = values[values > 0]
    # Zero-byte pairs are masked under a log norm: white, like a linear scale's zero.
    cmap = sns.color_palette("rocket_r", as_cmap=True).with_extremes(bad="white")
    norm: Normalize
    label = f"{unit_name} per step"
    if log_scale is None:
        log_scale = bool(positive.size) and vmax / float(positive.min()) > _LOG_SCALE_RATIO
    if log_scale and positive.size:
        norm = LogNorm(vmin=float(positive.min()), vmax=vmax)
        label += " (log scale; white = 0)"
    else:
        norm = Normalize(vmin=0.0, vmax=vmax if vmax > 0 else 1.0)

    mesh = None
    for ax, (panel_title, matrix, nodes) in zip(axes, panels, strict=False):
        mb = matrix / per_unit
        annotate = len(matrix) <= _MAX_ANNOTATED
        sns.heatmap(
            mb,
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
        mesh = ax.collections[0]
        _mark_nodes(ax, nodes, unit)
        ax.set_xlabel(f"receiving {unit}")
        ax.set_ylabel(f"sending {unit}")
        ax.tick_params(axis="y", rotation=0)
        ax.set_title(panel_title, fontsize="small")
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    if mesh is not None:
        fig.colorbar(mesh, ax=axes[: len(panels)], label=label, shrink=0.85)
    fig.suptitle(title, fontsize="medium")
    return _save(fig, out_png)


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


# --------------------------------------------------------------------------------------------
# Predicted scenarios (commscope.predict.scenarios)
# --------------------------------------------------------------------------------------------

_GB = (1e9, "GB")


def _frame(table: pd.DataFrame | str | Path) -> pd.DataFrame:
    """A table, or the parquet file holding it."""
    return table if isinstance(table, pd.DataFrame) else pd.read_parquet(table)


def _scenario_panel(node_mat: pd.DataFrame) -> tuple[str, pd.DataFrame, list[int]]:
    """(title, node x node bytes summed over traffic types, node of each row) of one
    scenario's ``node_matrix.parquet``."""
    grid = node_mat.pivot_table(
        index="src_node", columns="dst_node", values="bytes", aggfunc="sum", fill_value=0.0
    )
    nodes = sorted(set(grid.index) | set(grid.columns))
    grid = grid.reindex(index=nodes, columns=nodes, fill_value=0.0)
    first = node_mat.iloc[0] if len(node_mat) else pd.Series(dtype=object)
    diagonal = float(np.trace(grid.to_numpy())) if len(grid) else 0.0
    total = float(grid.to_numpy().sum())
    share = f"; {(total - diagonal) / total:.1%} of bytes cross nodes" if total > 0 else ""
    title = str(first.get("scenario", ""))
    if "pp" in first:
        title += (
            f"\n{first.get('model', '')} (p, t, d) = ({first['pp']}, {first['tp']}, "
            f"{first['dp']}), {first.get('mapping', '')}"
        )
    if "nodes" in first:
        title += f"\n{_plural(first['nodes'], 'node')} × {first.get('gpus_per_node', '?')} GPUs"
    return title + share, grid, nodes


@_styled
def plot_scenario_heatmap(
    node_mat: pd.DataFrame | str | Path, out_png: Path, vmax_bytes: float | None = None
) -> Path:
    """Node x node heatmap of one predicted scenario (``node_matrix.parquet``, or the table), GB per
    step, all traffic types summed; annotated up to 8 nodes; framed diagonal: inside a node.
    The colour scale is logarithmic: tensor-parallel traffic inside a node is typically ~100x
    what crosses the network, which a linear scale would paint white. ``vmax_bytes`` fixes
    the scale's top so separately drawn scenarios compare."""
    node_mat = _frame(node_mat)
    panels = [_scenario_panel(node_mat)] if len(node_mat) else []
    return _draw_matrices(
        panels,
        Path(out_png),
        unit="node",
        title="predicted GB per step between nodes\n(dashed frames: inside a node)",
        scale=_GB,
        vmax_bytes=vmax_bytes,
        log_scale=True,
    )


@_styled
def plot_scenario_heatmaps(node_mats: Sequence[pd.DataFrame | str | Path], out_png: Path) -> Path:
    """Node x node heatmaps of several predicted scenarios side by side on one logarithmic
    colour scale (GB per step), e.g. default vs customized mapping: the same bytes, on
    different links."""
    frames = [_frame(m) for m in node_mats]
    panels = [_scenario_panel(m) for m in frames if len(m)]
    return _draw_matrices(
        panels,
        Path(out_png),
        unit="node",
        title="predicted GB per step between nodes, one (logarithmic) colour scale; dashed "
        "frames: inside a node",
        scale=_GB,
        log_scale=True,
    )
