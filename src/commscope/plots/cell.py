"""One cell's figure: every node's throughput over the measured steps, at several resolutions."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from commscope.metrics.counters import bin_width_ns
from commscope.metrics.steps import training_window, zoom_window
from commscope.plots._style import COLORBLIND, _no_data, _save, _styled
from commscope.units import NS_PER_MS, NS_PER_S

_MAX_STEP_LINES = 60


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


# The overview rows (coarse to fine) and the zoom; widths the table lacks are left out, and
# the zoom takes the finest width there is (old tables stop at 1 ms).
OVERVIEW_BIN_MS: tuple[float, ...] = (100.0, 10.0, 1.0)
ZOOM_BIN_MS = 0.1
# The zoom shows one measured step, or its busiest stretch of this length when the step is
# longer: at 100 µs a longer stretch is more lines than pixels.
_ZOOM_MAX_NS = 400 * NS_PER_MS
# Line width of the last node drawn, and how much wider the first node's line is (the ones
# between are spread evenly).
_LINE_WIDTH = 0.8
_CASING = 1.3
# Up to this many nodes the zoom has a row per node, each this high relative to an overview row.
_MAX_ZOOM_ROWS = 8
_ZOOM_ROW_HEIGHT = 0.55


@_styled
def plot_cell_throughput(throughput: Path, step_times: Path, summary: Path, out_png: Path) -> Path:
    """Every node's tx and rx throughput over the measured steps, at several resolutions.

    Draws the cell's metric tables ``throughput.parquet`` (rows of every ``bin_ms``, the
    100 µs ones only over the zoomed step, :func:`~commscope.metrics.steps.zoom_window`),
    ``step_times.parquet`` (step boundaries and the warm-up flag) and ``summary.parquet`` (the
    bandwidth cap). Small multiples share one time axis over the measured window (the steps
    after warm-up, :func:`~commscope.metrics.steps.training_window`; rendezvous, start-up and
    warm-up are left out): one row per width of :data:`OVERVIEW_BIN_MS`, every node in its own
    colour. Below them, the typical measured step (its busiest :data:`_ZOOM_MAX_NS` when longer)
    at the finest width there is (100 µs), one row per node, where single bins can be told
    apart. tx is drawn upwards and rx downwards, so the two directions never hide each other;
    the cap is a dashed line either way, step boundaries dotted lines, the zoomed interval
    shaded in the rows above. A row whose bins are finer than the counters resolve says so in
    its title (its rates are smeared averages).
    """
    tp = pd.read_parquet(throughput)
    st = pd.read_parquet(step_times)
    if not st.empty:
        st["warmup"] = st["warmup"].astype("boolean").fillna(False).astype(bool)
    cell = _first(tp, "cell") or _first(st, "cell") or str(Path(throughput).parent)
    cap_bps = _cap_bps(Path(summary))
    widths = _widths(tp)
    overview = [w for w in widths if w in {bin_width_ns(b) for b in OVERVIEW_BIN_MS}]
    zoom_ns = widths[-1] if widths else bin_width_ns(ZOOM_BIN_MS)
    nodes = sorted(tp["node"].unique()) if not tp.empty else []
    # One zoom row per node; past a handful of nodes, one row for all (it stays readable).
    zoom_groups = [[n] for n in nodes] if 0 < len(nodes) <= _MAX_ZOOM_ROWS else [nodes]

    n_over = max(len(overview), 1)
    heights = [1.0] * n_over + [_ZOOM_ROW_HEIGHT] * len(zoom_groups)
    fig = Figure(figsize=(11.0, 2.0 * sum(heights) + 1.4), layout="constrained")
    FigureCanvasAgg(fig)
    gs = fig.add_gridspec(len(heights), 1, height_ratios=heights)
    over_axes = [fig.add_subplot(gs[0])]
    over_axes += [fig.add_subplot(gs[i], sharex=over_axes[0]) for i in range(1, n_over)]
    zoom_axes = [fig.add_subplot(gs[n_over])]
    zoom_axes += [
        fig.add_subplot(gs[n_over + i], sharex=zoom_axes[0], sharey=zoom_axes[0])
        for i in range(1, len(zoom_groups))
    ]
    fig.suptitle(
        f"Throughput per node over the measured steps\n{_wrap_cell_id(cell, 110)}",
        fontsize="small",
    )
    if tp.empty or st.empty:
        for ax in [*over_axes, *zoom_axes]:
            _no_data(ax, "counter samples" if tp.empty else "steps")
        return _save(fig, out_png)

    window = training_window(st)
    measured = st[~st["warmup"]] if bool((~st["warmup"]).any()) else st
    palette = _node_palette(nodes)
    origin = window[0]
    zoom = _zoom_interval(tp, st, zoom_ns)
    scale, unit = _rate_unit(tp, window, cap_bps)

    for ax, width_ns in zip(over_axes, overview or [zoom_ns], strict=False):
        rows = _rows(tp, width_ns, window)
        _draw_rates(ax, rows, width_ns, nodes, palette, origin, scale, NS_PER_S)
        _mark_steps(ax, measured, origin, NS_PER_S)
        _draw_cap(ax, cap_bps, scale)
        ax.axvspan(
            (zoom[0] - origin) / NS_PER_S,
            (zoom[1] - origin) / NS_PER_S,
            color="#f3e3a0",
            alpha=0.6,
            zorder=-2,
            label="zoomed below",
        )
        ax.set_xlim(0, (window[1] - origin) / NS_PER_S)
        ax.set_title(_row_title(rows, width_ns, "measured steps"), fontsize="small", loc="left")
        ax.set_ylabel(f"rx      {unit}      tx")
        if ax is not over_axes[-1]:
            ax.tick_params(labelbottom=False)
    over_axes[-1].set_xlabel("time since the first measured step started (s)")

    zoom_rows = _rows(tp, zoom_ns, zoom)
    for ax, group in zip(zoom_axes, zoom_groups, strict=True):
        _draw_rates(ax, zoom_rows, zoom_ns, group, palette, zoom[0], scale, NS_PER_MS)
        _mark_steps(ax, measured, zoom[0], NS_PER_MS)
        _draw_cap(ax, cap_bps, scale)
        ax.set_xlim(0, (zoom[1] - zoom[0]) / NS_PER_MS)
        if len(group) == 1:
            label = _node_label(group[0])
            ax.set_ylabel(label, color=palette[label], fontweight="bold")
        else:
            ax.set_ylabel(f"rx   {unit}   tx")
        if ax is not zoom_axes[-1]:
            ax.tick_params(labelbottom=False)
    title = _row_title(zoom_rows, zoom_ns, f"zoom on the {_zoom_step(measured, zoom)}")
    if len(zoom_groups) > 1:
        title += f"; {unit}, tx up, rx down"
    zoom_axes[0].set_title(title, fontsize="small", loc="left")
    zoom_axes[-1].set_xlabel(
        f"time since {(zoom[0] - origin) / NS_PER_S:.3f} s on the axes above (ms)"
    )
    for ax in [*over_axes, *zoom_axes]:
        # Rates are magnitudes both ways: rx is drawn downwards only to keep it off tx.
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{abs(y):g}"))
        ax.axhline(0, color="0.2", linewidth=0.6, zorder=1)
        # No vertical grid: the only vertical lines are the step boundaries.
        ax.grid(axis="x", visible=False)

    # One legend for the figure, under the axes (bursts reach any corner inside them).
    handles, labels = over_axes[0].get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))
    fig.legend(
        list(seen.values()),
        list(seen.keys()),
        loc="outside lower center",
        ncols=len(seen),
        fontsize="small",
        frameon=False,
    )
    return _save(fig, out_png)


def _node_palette(nodes: list) -> dict[str, tuple]:
    """A colour per node: seaborn's colour-blind palette, reordered so that the first four
    nodes get blue, orange, green and pink (its fourth colour, vermilion, is too close to
    orange to tell two overlapping lines apart)."""
    base = [to_rgb(c) for c in COLORBLIND]
    order = [0, 1, 2, 4, 7, 5, 9, 8, 3, 6]
    colours = [base[i] for i in order]
    return {_node_label(n): colours[i % len(colours)] for i, n in enumerate(sorted(nodes))}


def _node_label(node: object) -> str:
    return f"node {node}"


def _widths(tp: pd.DataFrame) -> list[int]:
    """Bin widths in the table as integer ns, coarsest first (``bin_ms`` is a float)."""
    if tp.empty:
        return []
    return sorted({bin_width_ns(b) for b in tp["bin_ms"].unique()}, reverse=True)


def _rows(tp: pd.DataFrame, width_ns: int, interval: tuple[int, int]) -> pd.DataFrame:
    """Bins of one width that lie inside ``interval``, in time order."""
    ns = (tp["bin_ms"].astype("float64") * NS_PER_MS).round().astype("int64")
    t = tp["t_start_ns"]
    keep = (ns == width_ns) & (t >= interval[0]) & (t + width_ns <= interval[1])
    return tp[keep].sort_values(["node", "t_start_ns"], kind="stable")


def _rate_unit(tp: pd.DataFrame, window: tuple[int, int], cap_bps: float | None) -> tuple:
    """Scale and axis label for the rates shown over ``window``."""
    inside = tp[(tp["t_start_ns"] >= window[0]) & (tp["t_start_ns"] < window[1])]
    peak = max(
        float(inside[["tx_bps", "rx_bps"]].abs().max().max()) if not inside.empty else 0.0,
        cap_bps or 0.0,
    )
    # Mbit/s up to 5 Gbit/s (tick labels of at most four digits), Gbit/s above.
    if peak >= 5e9:
        return 1e9, "Gbit/s"
    return 1e6, "Mbit/s"


def _draw_rates(
    ax: Axes,
    rows: pd.DataFrame,
    width_ns: int,
    nodes: list,
    palette: dict[str, tuple],
    origin: int,
    scale: float,
    per: float,
) -> None:
    """tx upwards and rx downwards for each of ``nodes``, as steps over each bin; x in units
    of ``per`` ns from ``origin``, rates divided by ``scale``."""
    for i, node in enumerate(nodes):
        sub = rows[rows["node"] == node]
        if sub.empty:
            continue
        label = _node_label(node)
        t = _step_edges(sub["t_start_ns"].to_numpy(), width_ns)
        x = (t - origin) / per
        # Nodes often run at the same rate (all at the cap): each later node is drawn thinner
        # on top of the earlier ones, so overlapping lines show every colour as a casing.
        lw = _LINE_WIDTH + _CASING * (len(nodes) - 1 - i) / max(len(nodes) - 1, 1)
        for col, sign in (("tx_bps", 1.0), ("rx_bps", -1.0)):
            y = sign * sub[col].to_numpy() / scale
            # A steps-post line, not ax.stairs: a patch with 10**5 edges is slow to lay out.
            ax.plot(
                x,
                np.append(y, y[-1]),
                drawstyle="steps-post",
                color=palette[label],
                linewidth=lw,
                solid_joinstyle="miter",
                label=label if sign > 0 else None,
                zorder=2 + i,
            )


def _step_edges(starts: np.ndarray, width_ns: int) -> np.ndarray:
    """Left edges plus the last right edge (a node's bins of one width are contiguous)."""
    return np.append(starts, starts[-1] + width_ns)


def _draw_cap(ax: Axes, cap_bps: float | None, scale: float) -> None:
    if not cap_bps:
        return
    for sign in (1, -1):
        # Over the node lines, thin: a node at the cap shows through the dashes.
        ax.axhline(
            sign * cap_bps / scale,
            color="#c0392b",
            linestyle=(0, (4, 4)),
            linewidth=0.9,
            zorder=20,
            label=f"cap {cap_bps / 1e6:g} Mbit/s" if sign > 0 else None,
        )


def _row_title(rows: pd.DataFrame, width_ns: int, what: str) -> str:
    title = f"{_fmt_width(width_ns)} bins, {what}"
    if not rows.empty and not bool(rows["resolved"].all()):
        title += " — finer than the counters resolve: smeared averages"
    return title


def _fmt_width(width_ns: int) -> str:
    return f"{width_ns / 1000:g} µs" if width_ns < NS_PER_MS else f"{width_ns / NS_PER_MS:g} ms"


def _zoom_interval(tp: pd.DataFrame, st: pd.DataFrame, zoom_ns: int) -> tuple[int, int]:
    """The typical measured step of the step times ``st``
    (:func:`~commscope.metrics.steps.zoom_window`, the stretch the throughput table has its
    100 µs rows for), or its busiest stretch of :data:`_ZOOM_MAX_NS` when longer, snapped
    outwards to the zoom's bin grid."""
    lo, hi = zoom_window(st)
    if hi - lo > _ZOOM_MAX_NS:
        rows = _rows(tp, zoom_ns, (lo, hi))
        if not rows.empty:
            # Bytes of all nodes per zoom bin, then the window of fixed length holding most.
            per_bin = rows.groupby("t_start_ns")["tx_bps"].sum()
            t = per_bin.index.to_numpy()
            cum = np.concatenate([[0.0], np.cumsum(per_bin.to_numpy())])
            ends = np.searchsorted(t, t + _ZOOM_MAX_NS, side="left")
            best = int(np.argmax(cum[ends] - cum[: len(t)]))
            # Inside the step: a busy end of the step must not push the zoom past it.
            lo = min(int(t[best]), hi - _ZOOM_MAX_NS)
        hi = lo + _ZOOM_MAX_NS
    return lo - lo % zoom_ns, hi + (-hi) % zoom_ns


def _zoom_step(measured: pd.DataFrame, zoom: tuple[int, int]) -> str:
    """Which step the zoom shows, in words: the measured step that holds it (the typical one,
    :func:`~commscope.metrics.steps.zoom_window`), and whether only its busiest part."""
    inside = measured[
        (measured["t_start_ns"] <= zoom[1]) & (measured["t_end_ns"] >= zoom[0])
    ].sort_values("t_start_ns")
    last = (inside if not inside.empty else measured.sort_values("t_start_ns")).iloc[-1]
    step = f"typical measured step ({int(last['step'])})" if "step" in last else "typical step"
    if zoom[0] > int(last["t_start_ns"]) or zoom[1] < int(last["t_end_ns"]):
        step += f", its busiest {_ZOOM_MAX_NS / NS_PER_MS:g} ms"
    return step


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


def _mark_steps(ax: Axes, st: pd.DataFrame, origin: int, per: float) -> None:
    """Dotted lines at every step start and at the last step's end (``per`` ns per x unit)."""
    if st.empty:
        return
    starts = (st["t_start_ns"].to_numpy() - origin) / per
    # Hundreds of boundary lines would paint the plot grey: thin them out evenly and say so.
    stride = max(1, math.ceil(len(starts) / _MAX_STEP_LINES))
    lines = np.append(starts[::stride], (st["t_end_ns"].max() - origin) / per)
    ax.vlines(
        lines,
        0,
        1,
        transform=ax.get_xaxis_transform(),
        colors="0.3",
        linestyles=":",
        linewidth=1.2,
        zorder=0,
        label="step boundary" if stride == 1 else f"every {stride}th step boundary",
    )
