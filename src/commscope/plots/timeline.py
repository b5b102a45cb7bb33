"""The op timeline: one step per strategy, ranks as rows, the wire under it on one time axis.

For each strategy one representative cell (:func:`timeline_cells`) and in it the step whose
100 µs wire bins the metrics keep (the typical measured step, closest to the median,
:func:`~commscope.metrics.steps.zoom_window`): on top every rank's communication ops as bars
coloured by the parallel dimension of their group (:func:`~commscope.metrics.sync.group_kinds`,
the labels of the sync tables), its compute as the light grey gaps between them; underneath
node 0's wire throughput in 100 µs bins, tx up and rx down, on the same axis (ms from the step's
start). :func:`timeline_panels` selects the data (pure, over DataFrames),
:func:`timeline_figure` draws it, :func:`plot_timeline` reads the files and saves the PNG.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from commscope.cell.timeline import union
from commscope.metrics.steps import zoom_window
from commscope.metrics.sync import group_kinds
from commscope.plots._style import _no_data, _palette, _save, _styled
from commscope.spec.link import LINK_NUMBER_COLUMNS, SHAPING, impaired, link_label
from commscope.spec.plan import DIMS
from commscope.units import NS_PER_MS

# The figure's file stem (results/figures/timeline.png) and its caption's key.
TIMELINE_FIGURE = "timeline"
# The wire row's bin width: the finest the throughput table has, kept over the zoomed step.
WIRE_BIN_MS = 0.1
# Group kinds in legend and lane order (sync.group_kinds' values): the parallel dimensions in
# the mesh's order (spec.plan.DIMS, outermost first), so a new dimension gets its lane and colour
# here by itself, then the groups that are no dimension's. Colours come from _palette over all of
# them (sorted by name), so a kind keeps its colour whichever kinds a study has.
GROUP_KIND_ORDER: tuple[str, ...] = (*DIMS, "world", "other", "self")
COMPUTE = "compute"
_COMPUTE_COLOUR = "0.85"
# Greys, not palette colours: the bars above already use those for group kinds.
_TX_COLOUR, _RX_COLOUR = "0.2", "0.6"
_PANEL_COLS = 3
# An op shorter than this share of the step is drawn this wide, so every op shows (a TP step
# has hundreds of all-reduces of a few µs); the data keep their true extent.
_MIN_BAR_SHARE = 1 / 900

BAR_COLUMNS = ["rank", "node", "kind", "op", "lane", "t0_ms", "t1_ms"]
WIRE_COLUMNS = ["t_ms", "tx_bps", "rx_bps", "resolved"]


@dataclass(frozen=True)
class TimelinePanel:
    """What one strategy's panel pair draws.

    ``bars``: :data:`BAR_COLUMNS`, one row per communication op (``kind`` its group kind) or
    compute gap (``kind`` ``"compute"``, lane -1: the whole row), times in ms from the step's
    start, clipped to the step. ``wire``: :data:`WIRE_COLUMNS`, node 0's 100 µs bins over the
    step (``t_ms`` the bin start). ``ranks``: (rank, node) top to bottom. ``lanes``: the group
    kinds of the panel in lane order (lane i of a rank's row is ``lanes[i]``).
    """

    strategy: str
    cell: str
    title: str
    step: int
    step_ms: float
    median_step_ms: float
    cap_bps: float
    ranks: list[tuple[int, int]]
    lanes: list[str]
    bars: pd.DataFrame = field(repr=False)
    wire: pd.DataFrame = field(repr=False)


def timeline_cells(summary: pd.DataFrame) -> pd.DataFrame:
    """One cell per strategy for the timeline, from the aggregated summary (one row per cell).

    The least perturbed link first: not impaired (:func:`~commscope.spec.link.impaired` of the
    summary's link numbers), then the highest cap, no cap first (the unshaped cell when there is
    one); then the study's default model (the one most cells run) and a 2-node cell, else the
    fewest nodes (at least 2: one node has no wire) and ranks; then the most common congestion
    control, the first repeat and the first cell id, so the choice is deterministic.
    Columns: the summary's, sorted by strategy.
    """
    if summary.empty or not {"cell", "strategy"} <= set(summary.columns):
        return pd.DataFrame(columns=summary.columns)
    cells = summary.drop_duplicates("cell").reset_index(drop=True)
    # The summary's link numbers (cell.json's applied shape, cell.parse.cell_link); a column it
    # lacks is no cap, no impairment.
    links = cells.reindex(columns=list(LINK_NUMBER_COLUMNS))

    def most_common(col: str) -> pd.Series:
        if col not in cells:
            return pd.Series(False, index=cells.index)
        counts = cells[col].astype(str).value_counts()
        top = sorted(counts[counts == counts.max()].index)[0]
        return cells[col].astype(str).ne(top)

    nodes = cells.get("nodes", pd.Series(2, index=cells.index)).astype("int64")
    per_node = cells.get("ranks_per_node", pd.Series(1, index=cells.index)).astype("int64")
    keys = pd.DataFrame(
        {
            "impaired": impaired(links),
            "cap": -links[SHAPING["bw"]].astype("float64").fillna(math.inf),
            "other_model": most_common("model"),
            "not_two_nodes": nodes.ne(2),
            "one_node": nodes.lt(2),
            "world": nodes * per_node,
            "nodes": nodes,
            "other_cc": most_common("cc"),
            "repeat": cells.get("repeat", pd.Series(0, index=cells.index)),
            "cell": cells["cell"].astype(str),
        }
    )
    # One node is worst of all (no wire), so it sorts before the 2-node preference decides.
    order = ["impaired", "cap", "other_model", "one_node", "not_two_nodes", "world", "nodes"]
    keys = keys[[*order, "other_cc", "repeat", "cell"]]
    ranked = cells.loc[keys.sort_values(list(keys.columns), kind="stable").index]
    return (
        ranked.groupby("strategy", sort=True).head(1).sort_values("strategy").reset_index(drop=True)
    )


def timeline_step(step_times: pd.DataFrame) -> dict[str, Any]:
    """The step one cell's timeline shows, from its ``step_times`` rows: the step that
    :func:`~commscope.metrics.steps.zoom_window` covers (the typical measured step, the one the
    throughput table keeps 100 µs bins for). Keys: ``step``, ``t_start_ns``, ``t_end_ns``,
    ``median_s`` (the median measured step duration, for comparison)."""
    rows = step_times.copy()
    rows["warmup"] = rows["warmup"].astype("boolean").fillna(False).astype(bool)
    lo, hi = zoom_window(rows)
    covered = rows[(rows["t_start_ns"] <= lo) & (rows["t_end_ns"] >= hi)]
    step = int(covered.sort_values("t_start_ns", kind="stable")["step"].iloc[-1])
    measured = rows[~rows["warmup"]] if (~rows["warmup"]).any() else rows
    median = float(((measured["t_end_ns"] - measured["t_start_ns"]) / 1e9).median())
    return {"step": step, "t_start_ns": lo, "t_end_ns": hi, "median_s": median}


def timeline_bars(
    ops: pd.DataFrame,
    steps: pd.DataFrame,
    plan: Mapping[str, Any] | None,
    step: int,
    window: tuple[int, int],
) -> tuple[pd.DataFrame, list[tuple[int, int]], list[str]]:
    """The bars of one cell's step: ``(bars, ranks, lanes)`` as in :class:`TimelinePanel`.

    Communication: every op in flight during ``window`` (issue to completion overlapping it,
    whichever step the capture gave it, as the wire sees it too), clipped to the window, its
    ``kind`` from :func:`~commscope.metrics.sync.group_kinds` with the cell's ``plan``.
    Compute: within each rank's own ``step`` (its ``phase == "step"`` row in ``steps``), the
    stretches with no op of that rank in flight.
    """
    lo, hi = window
    world_steps = steps[(steps["phase"] == "step") & (steps["step"] == step)]
    node_of = dict(
        zip(world_steps["rank"].astype(int), world_steps["node"].astype(int), strict=True)
    )
    rows: list[dict[str, Any]] = []
    lanes: list[str] = []
    comm = ops.iloc[0:0]
    if not ops.empty and "t_end_ns" in ops:
        done = ops[ops["t_end_ns"].notna() & ops["t_issue_ns"].notna()]
        world = max([int(ops["rank"].max()) + 1, *(r + 1 for r in node_of)])
        kinds = group_kinds(done, plan, world) if not done.empty else pd.Series(dtype=str)
        done = done.assign(kind=kinds)
        t0, t1 = done["t_issue_ns"].astype("int64"), done["t_end_ns"].astype("int64")
        comm = done[(t0 < hi) & (t1 > lo)].assign(
            _t0=t0.clip(lower=lo, upper=hi), _t1=t1.clip(lower=lo, upper=hi)
        )
        present = set(comm["kind"])
        lanes = [k for k in GROUP_KIND_ORDER if k in present] + sorted(
            present - set(GROUP_KIND_ORDER)
        )
        lane_of = {k: i for i, k in enumerate(lanes)}
        for rec in comm.sort_values(["rank", "_t0", "_t1"], kind="stable").to_dict("records"):
            rows.append(
                {
                    "rank": int(rec["rank"]),
                    "node": node_of.get(int(rec["rank"]), -1),
                    "kind": str(rec["kind"]),
                    "op": str(rec["op"]),
                    "lane": lane_of[str(rec["kind"])],
                    "t0_ms": (rec["_t0"] - lo) / NS_PER_MS,
                    "t1_ms": (rec["_t1"] - lo) / NS_PER_MS,
                }
            )
    for rec in world_steps.sort_values("rank").to_dict("records"):
        rank = int(rec["rank"])
        start, end = max(int(rec["t_start_ns"]), lo), min(int(rec["t_end_ns"]), hi)
        mine = comm[comm["rank"] == rank] if len(comm) else comm
        busy = union(list(zip(mine["_t0"].astype(int), mine["_t1"].astype(int), strict=True)))
        cursor = start
        for b0, b1 in [*busy, (end, end)]:
            if b0 > cursor and cursor < end:
                gap_end = min(b0, end)
                rows.append(
                    {
                        "rank": rank,
                        "node": node_of[rank],
                        "kind": COMPUTE,
                        "op": "",
                        "lane": -1,
                        "t0_ms": (cursor - lo) / NS_PER_MS,
                        "t1_ms": (gap_end - lo) / NS_PER_MS,
                    }
                )
            cursor = max(cursor, b1)
    bars = pd.DataFrame(rows, columns=BAR_COLUMNS)
    ranked = set(node_of) | set(bars["rank"].astype(int))
    ranks = sorted((r, node_of.get(r, -1)) for r in ranked)
    return (
        bars.sort_values(["rank", "lane", "t0_ms"], kind="stable").reset_index(drop=True),
        ranks,
        lanes,
    )


def timeline_wire(throughput: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """Node 0's 100 µs bins over ``window`` from one cell's throughput rows (all interfaces
    summed), ``t_ms`` the bin start in ms from the window's start; :data:`WIRE_COLUMNS`."""
    lo, hi = window
    width_ns = int(round(WIRE_BIN_MS * NS_PER_MS))
    if throughput.empty:
        return pd.DataFrame(columns=WIRE_COLUMNS)
    rows = throughput[
        np.isclose(throughput["bin_ms"].astype("float64"), WIRE_BIN_MS)
        & (throughput["node"] == 0)
        & (throughput["t_start_ns"] > lo - width_ns)
        & (throughput["t_start_ns"] < hi)
    ]
    if rows.empty:
        return pd.DataFrame(columns=WIRE_COLUMNS)
    resolved = rows["resolved"] if "resolved" in rows else pd.Series(True, index=rows.index)
    per_bin = (
        rows.assign(resolved=resolved.astype(bool))
        .groupby("t_start_ns", sort=True)
        .agg(tx_bps=("tx_bps", "sum"), rx_bps=("rx_bps", "sum"), resolved=("resolved", "all"))
        .reset_index()
    )
    per_bin["t_ms"] = (per_bin["t_start_ns"] - lo) / NS_PER_MS
    return per_bin[WIRE_COLUMNS].reset_index(drop=True)


def _setup_title(row: Mapping[str, Any]) -> str:
    """A chosen cell's setup in words: model, nodes × ranks per node, and its link as the
    report says it (:func:`~commscope.spec.link.link_label` of the summary's numbers)."""
    parts = [str(row.get("model", ""))] if row.get("model") else []
    nodes, per_node = row.get("nodes"), row.get("ranks_per_node")
    if nodes is not None and per_node is not None:
        parts.append(f"{nodes} node{'s' * (str(nodes) != '1')} × {per_node}")
    parts.append(link_label(row))
    return ", ".join(parts)


def timeline_panels(
    summary: pd.DataFrame,
    step_times: pd.DataFrame,
    throughput: pd.DataFrame,
    ops: Mapping[str, pd.DataFrame],
    steps: Mapping[str, pd.DataFrame],
    plans: Mapping[str, Mapping[str, Any] | None],
) -> list[TimelinePanel]:
    """One :class:`TimelinePanel` per strategy, sorted by strategy.

    ``summary``, ``step_times``, ``throughput``: the aggregated tables (any cells; only the
    :func:`timeline_cells` of ``summary`` are read); ``ops``, ``steps``, ``plans``: each of
    those cells' trace tables and cell.json ``plan``, by cell id (a cell missing from them,
    or without steps, is left out).
    """
    panels = []
    for row in timeline_cells(summary).to_dict("records"):
        cell = str(row["cell"])
        cell_steps = step_times[step_times["cell"].astype(str) == cell]
        if cell_steps.empty or cell not in ops or cell not in steps:
            continue
        chosen = timeline_step(cell_steps)
        window = (chosen["t_start_ns"], chosen["t_end_ns"])
        bars, ranks, lanes = timeline_bars(
            ops[cell], steps[cell], plans.get(cell), chosen["step"], window
        )
        tp = throughput[throughput["cell"].astype(str) == cell] if len(throughput) else throughput
        cap = row.get(SHAPING["bw"])
        panels.append(
            TimelinePanel(
                strategy=str(row["strategy"]),
                cell=cell,
                title=_setup_title(row),
                step=chosen["step"],
                step_ms=(window[1] - window[0]) / NS_PER_MS,
                median_step_ms=chosen["median_s"] * 1e3,
                cap_bps=math.nan if cap is None else float(cap),
                ranks=ranks,
                lanes=lanes,
                bars=bars,
                wire=timeline_wire(tp, window),
            )
        )
    return panels


def _draw_ranks(ax: Axes, panel: TimelinePanel, colours: Mapping[str, Any]) -> None:
    row_of = {rank: i for i, (rank, _) in enumerate(panel.ranks)}
    lanes = max(len(panel.lanes), 1)
    min_width = panel.step_ms * _MIN_BAR_SHARE
    for (kind, lane), group in panel.bars.groupby(["kind", "lane"], sort=True):
        # Rows run top to bottom (rank 0 on top); lanes split a rank's row by group kind.
        height = 0.86 if lane < 0 else 0.86 / lanes
        for rank, sub in group.groupby("rank", sort=True):
            top = row_of[int(rank)] - 0.43 + (0 if lane < 0 else lane * height)
            spans = [
                (t0, max(t1 - t0, 0.0 if kind == COMPUTE else min_width))
                for t0, t1 in zip(sub["t0_ms"], sub["t1_ms"], strict=True)
            ]
            ax.broken_barh(
                spans, (top, height), facecolors=colours[str(kind)], linewidth=0, zorder=2
            )
    ax.set_yticks(
        range(len(panel.ranks)), [f"rank {r} · node {n}" for r, n in panel.ranks], fontsize=8
    )
    ax.set_ylim(len(panel.ranks) - 0.5, -0.5)
    ax.grid(False, axis="y")
    ax.set_xlim(0, panel.step_ms)
    ax.tick_params(axis="x", labelbottom=False)


def _draw_wire(ax: Axes, panel: TimelinePanel) -> None:
    ax.set_xlim(0, panel.step_ms)
    if panel.wire.empty:
        ax.text(
            0.5,
            0.5,
            "no 100 µs wire bins for this step",
            ha="center",
            va="center",
            transform=ax.transAxes,
            fontsize=8,
        )
        ax.set_yticks([])
    else:
        t = panel.wire["t_ms"].to_numpy("float64")
        edges = np.append(t, t[-1] + WIRE_BIN_MS)
        tx = panel.wire["tx_bps"].to_numpy("float64") / 1e6
        rx = panel.wire["rx_bps"].to_numpy("float64") / 1e6
        # fill_between, not stairs: a stairs patch of thousands of bins costs seconds in
        # matplotlib's limit update, a PolyCollection does not.
        for values, colour in ((tx, _TX_COLOUR), (-rx, _RX_COLOUR)):
            ax.fill_between(
                edges, np.append(values, values[-1]), step="post", color=colour, linewidth=0.4
            )
        ax.axhline(0, color="0.3", linewidth=0.6)
        if not math.isnan(panel.cap_bps):
            for sign in (1, -1):
                ax.axhline(sign * panel.cap_bps / 1e6, color="red", ls="--", lw=0.9)
        top = max(float(np.abs(np.concatenate([tx, rx])).max()), 1e-3)
        if not math.isnan(panel.cap_bps):
            top = max(top, panel.cap_bps / 1e6)
        ax.set_ylim(-top * 1.1, top * 1.1)
        ax.yaxis.set_major_formatter(lambda y, _pos: f"{abs(y):g}")
        ax.tick_params(axis="y", labelsize=8)
    smeared = not panel.wire.empty and not bool(panel.wire["resolved"].all())
    ax.set_ylabel("node 0\nMbit/s", fontsize=8)
    ax.set_xlabel(
        "ms from the step's start"
        + (" (wire bins finer than counted: smeared)" if smeared else ""),
        fontsize=8,
    )
    ax.tick_params(axis="x", labelsize=8)


@_styled
def timeline_figure(panels: Sequence[TimelinePanel]) -> Figure:
    """Draw :func:`timeline_panels`: a grid of panel pairs (up to :data:`_PANEL_COLS` across),
    ranks on top, node 0's wire under them, and one legend for the figure."""
    cols = min(_PANEL_COLS, max(len(panels), 1))
    grid_rows = max(math.ceil(len(panels) / cols), 1)
    row_ranks = [
        max((len(p.ranks) for p in panels[r * cols : (r + 1) * cols]), default=2)
        for r in range(grid_rows)
    ]
    # Rank rows keep one height whatever the world size; the wire axis has a fixed height.
    heights = [1.7 + 0.27 * max(n, 2) for n in row_ranks]
    fig = Figure(figsize=(6.2 * cols, sum(heights) + 0.9), layout="constrained")
    FigureCanvasAgg(fig)
    colours = {**_palette(GROUP_KIND_ORDER), COMPUTE: _COMPUTE_COLOUR}
    if not panels:
        _no_data(fig.subplots(), "cell with ops and steps")
        return fig
    subfigs = fig.subfigures(grid_rows, cols, squeeze=False, height_ratios=heights)
    kinds: set[str] = set()
    for i, panel in enumerate(panels):
        sub = subfigs[i // cols][i % cols]
        ranks_ax, wire_ax = sub.subplots(
            2, 1, sharex=True, height_ratios=[0.27 * max(row_ranks[i // cols], 2), 1.0]
        )
        _draw_ranks(ranks_ax, panel, colours)
        _draw_wire(wire_ax, panel)
        typical = f"median {panel.median_step_ms:.0f} ms"
        ranks_ax.set_title(
            f"{panel.strategy}  —  {panel.title}\nstep {panel.step}: {panel.step_ms:.0f} ms "
            f"({typical})",
            fontsize=9,
        )
        kinds |= set(panel.lanes)
    for j in range(len(panels), grid_rows * cols):
        subfigs[j // cols][j % cols].set_visible(False)
    handles = [Patch(color=colours[COMPUTE], label="compute (no op in flight)")]
    handles += [Patch(color=colours[k], label=f"{k} op") for k in GROUP_KIND_ORDER if k in kinds]
    handles += [
        Patch(color=_TX_COLOUR, label="node 0 tx (up)"),
        Patch(color=_RX_COLOUR, label="node 0 rx (down)"),
        Line2D([], [], color="red", ls="--", lw=0.9, label="bandwidth cap"),
    ]
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncols=len(handles),
        fontsize="small",
        title="ranks: communication by the parallel dimension of its group; wire: 100 µs bins",
        title_fontsize="small",
    )
    return fig


@_styled
def plot_timeline(
    summary: Path,
    step_times: Path,
    throughput: Path,
    traces: Mapping[str, Mapping[str, Path]],
    out_png: Path,
) -> Path:
    """Write ``timeline.png``: :func:`timeline_figure` of :func:`timeline_panels`.

    ``summary``, ``step_times``, ``throughput``: the aggregated parquet files; ``traces``: per
    cell id its ``ops`` and ``steps`` (trace/ops.parquet, trace/steps.parquet) and ``cell``
    (trace/cell.json) files. Only the chosen cells' traces and node 0's 100 µs rows of the
    throughput table are read (the table of a study is large).
    """
    summ = pd.read_parquet(summary)
    chosen = timeline_cells(summ)["cell"].astype(str).tolist()
    chosen = [c for c in chosen if c in traces]
    tp = (
        pd.read_parquet(throughput, filters=[("node", "==", 0), ("cell", "in", chosen)])
        if chosen
        else pd.DataFrame()
    )
    ops = {c: pd.read_parquet(traces[c]["ops"]) for c in chosen}
    steps = {c: pd.read_parquet(traces[c]["steps"]) for c in chosen}
    plans = {c: json.loads(Path(traces[c]["cell"]).read_text()).get("plan") for c in chosen}
    panels = timeline_panels(summ, pd.read_parquet(step_times), tp, ops, steps, plans)
    return _save(timeline_figure(panels), out_png)
