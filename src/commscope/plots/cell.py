"""One cell's figure: transmit throughput of every node over time, with its steps."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from commscope.plots._style import _new_figure, _no_data, _palette, _save, _styled

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


@_styled
def plot_cell_throughput(
    throughput: Path, step_times: Path, summary: Path, out_png: Path, bin_ms: int = 10
) -> Path:
    """Transmit throughput of every node over time, one line per node, for one cell.

    Draws the cell's metric tables ``throughput.parquet`` (rows of ``bin_ms``),
    ``step_times.parquet`` (step boundaries and the warm-up flag) and ``summary.parquet`` (the
    bandwidth cap). Dotted vertical lines mark step boundaries, shading the warm-up steps,
    a dashed line the cap. Time is in seconds since the first step started.
    """
    tp = pd.read_parquet(throughput)
    tp = tp[tp["bin_ms"] == bin_ms]
    st = pd.read_parquet(step_times)
    st["warmup"] = st["warmup"].astype("boolean").fillna(False).astype(bool)
    cell = _first(tp, "cell") or _first(st, "cell") or str(Path(throughput).parent)
    cap_bps = _cap_bps(Path(summary))

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
