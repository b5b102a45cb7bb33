"""Figures across cells: message sizes, step time vs bandwidth, bytes per step by op, the
communication matrices (:mod:`.matrices`) and the slowdown on a shaped link, drawn from the
aggregated tables and the study tables the aggregate job derives
(:data:`commscope.contracts.STUDY_TABLES`)."""

from __future__ import annotations

import itertools
import math
import re
import textwrap
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator

from commscope.contracts import STUDY_FIGURE_TABLES, STUDY_FIGURES, is_replay, table_file
from commscope.metrics.study import SERIES_AXES, SETUP_AXES, strategy_label
from commscope.plots._style import (
    _legend_below,
    _new_figure,
    _new_grid,
    _no_data,
    _palette,
    _save,
    _styled,
    strategy_palette,
)
from commscope.plots.bursts import plot_bursts
from commscope.plots.matrices import plot_comm_matrices
from commscope.spec.link import SHAPING, impaired, link_label
from commscope.units import bytes_tick

# How far beyond the slowdown means the sensitivity figure's axis reaches (a factor).
CI_REACH = 4.0


def plot_study(tables: Mapping[str, Path], figures: Mapping[str, Path]) -> list[Path]:
    """Draw the cross-cell figures from the aggregated tables; return their paths.

    ``tables`` maps each name of :data:`STUDY_FIGURE_TABLES` to its parquet file in the
    aggregate directory, ``figures`` each name of :data:`STUDY_FIGURES` to the PNG to write
    (see :func:`study_table_paths`, :func:`study_figure_paths`). The derived tables
    (:data:`~commscope.contracts.STUDY_TABLES`) are the aggregate job's; this only draws.

    ``msg_size_cdf.png``: message-size CDF per strategy (measured steps only, log x).
    ``step_time_vs_bw.png``: mean step time vs bandwidth cap per strategy, error bars are the
    standard deviation over repeats; the uncapped cells sit at the right, labelled "no cap"
    (series with delay, jitter or loss at one cap only are left to ``slowdown.png``).
    ``bytes_per_step_by_op.png``: framework bytes per measured step by op type and strategy.
    ``comm_matrix_nodes.png``, ``comm_matrix_ranks.png``: node x node and rank x rank bytes per
    measured step, one representative cell per strategy (see :func:`plot_comm_matrices`).
    ``slowdown.png``: step time over the unshaped link's, against the cap, the delay and the
    loss (:func:`plot_slowdown`).
    ``bursts.png``: burst size and duration per strategy on the unshaped link
    (:func:`~commscope.plots.bursts.plot_bursts`).
    One panel per model when several models were run (every replayed trace in one panel, three
    panels to a row), one legend below the panels, and one colour per strategy in every figure
    (:func:`study_palette` of the summary). Every figure is always written (with a
    "no data" note when its table is empty) so pipeline outputs are predictable.
    """
    summary = pd.read_parquet(tables["summary"])
    palette = study_palette(summary)
    return [
        plot_size_cdf(pd.read_parquet(tables["msg_size_cdf"]), figures["msg_size_cdf"], palette),
        plot_step_time_vs_bw(
            pd.read_parquet(tables["step_time_over_repeats"]), figures["step_time_vs_bw"], palette
        ),
        plot_bytes_per_step(
            pd.read_parquet(tables["bytes_per_step_by_op"]), figures["bytes_per_step_by_op"]
        ),
        *plot_comm_matrices(
            tables["node_matrix"],
            tables["comm_matrix"],
            summary,
            figures["comm_matrix_nodes"],
            figures["comm_matrix_ranks"],
        ),
        plot_slowdown(pd.read_parquet(tables["slowdown"]), figures["slowdown"], palette),
        plot_bursts(pd.read_parquet(tables["temporal_onoff"]), figures["bursts"], palette),
    ]


def study_table_paths(aggregate_dir: Path) -> dict[str, Path]:
    """The :data:`STUDY_FIGURE_TABLES` files in an aggregate directory, by table name."""
    return {name: Path(aggregate_dir) / table_file(name) for name in STUDY_FIGURE_TABLES}


def study_figure_paths(out_dir: Path) -> dict[str, Path]:
    """The :data:`STUDY_FIGURES` files in ``out_dir``, by figure name."""
    return {name: Path(out_dir) / f"{name}.png" for name in STUDY_FIGURES}


REPLAY_PANEL = "replayed traces"


def _panels(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The panels of a per-model figure: one per trained model (name order), then one for every
    replayed trace together (their labels, ``replayed NAME``, tell them apart), each with its
    rows and a ``label`` column (:func:`strategy_label`). A table without a model column is one
    panel; an empty table none."""
    if df.empty:
        return []
    df = df.assign(label=strategy_label(df).astype(str))
    if "model" not in df:
        return [("", df)]
    # A table whose strategies are already labelled (cap_series) marks its replays in words.
    replay = is_replay(df) | df["strategy"].astype(str).str.startswith("replayed ")
    panels = [(str(m), rows) for m, rows in df[~replay].groupby("model", sort=True)]
    if replay.any():
        panels.append((REPLAY_PANEL, df[replay]))
    return panels


def _panel_title(what: str, model: str, panels: int) -> str:
    return f"{what}{f' — {model}' if model and panels > 1 else ''}"


def study_palette(summary: pd.DataFrame) -> dict[str, tuple]:
    """The study's one colour per strategy (:func:`strategy_palette` over every strategy label
    of the summary, replays as ``replayed NAME``), handed to every study figure."""
    if summary.empty or "strategy" not in summary:
        return {}
    return strategy_palette(strategy_label(summary).astype(str))


def _colour(palette: Mapping[str, tuple], label: str) -> tuple | str:
    # A label the study's summary lacks (a figure drawn from a table alone) still gets one.
    return palette.get(label) or strategy_palette([label])[label]


@_styled
def plot_size_cdf(
    cdf: pd.DataFrame, out_png: Path, palette: Mapping[str, tuple] | None = None
) -> Path:
    """Message-size CDF per strategy (one panel per model, replays together, three to a row)
    from :func:`~commscope.metrics.study.measured_size_cdf`; see :func:`plot_study`."""
    panels = _panels(cdf)
    if palette is None:
        palette = strategy_palette(strategy_label(cdf).astype(str)) if not cdf.empty else {}
    fig, axes = _new_grid(len(panels))
    if not panels:
        _no_data(axes[0], "messages")
        return _save(fig, out_png)
    handles: dict[str, object] = {}
    for ax, (model, rows) in zip(axes, panels, strict=True):
        for label, sub in rows.groupby("label", sort=True):
            # Start the staircase at 0 just left of the smallest size so the jump is visible.
            x = np.concatenate([[sub["bytes"].iloc[0]], sub["bytes"].to_numpy()])
            y = np.concatenate([[0.0], sub["cum_fraction"].to_numpy()])
            (handles[str(label)],) = ax.step(
                x, y, where="post", label=str(label), color=_colour(palette, str(label))
            )
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(bytes_tick))
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("message size (payload per rank, log)")
        ax.set_ylabel("fraction of messages ≤ size")
        ax.set_title(_panel_title("message sizes", model, len(panels)))
    _legend_below(fig, handles, "strategy")
    return _save(fig, out_png)


def _series_label(row: pd.Series, varying: list[str]) -> str:
    extra = ", ".join(f"{c}={row[c]}" for c in varying)
    return f"{row['strategy']} ({extra})" if extra else str(row["strategy"])


def cap_series(step_times: pd.DataFrame) -> pd.DataFrame:
    """The rows of :func:`~commscope.metrics.study.step_time_over_repeats` that
    :func:`plot_step_time_vs_bw` draws, with their series ``label``: the strategy and the
    :data:`SERIES_AXES` that differ between the rows drawn. A series with delay, jitter or loss
    at one cap only says nothing about the cap (the slowdown figure has it) and is left out;
    one that sweeps the cap under an impairment stays."""
    series = [c for c in SERIES_AXES if c in step_times]
    if not step_times.empty:
        step_times = step_times.assign(strategy=strategy_label(step_times))
    rows = step_times.assign(label=step_times.apply(_series_label, axis=1, varying=series))
    caps = rows.groupby("label")["bw"].transform("nunique")
    rows = rows[(caps > 1) | ~impaired(rows)]
    varying = [c for c in series if rows[c].nunique(dropna=False) > 1]
    return rows.assign(label=rows.apply(_series_label, axis=1, varying=varying)).reset_index(
        drop=True
    )


@_styled
def plot_step_time_vs_bw(
    step_times: pd.DataFrame, out_png: Path, palette: Mapping[str, tuple] | None = None
) -> Path:
    """Step time vs bandwidth cap per strategy (one panel per model that swept the cap, replays
    together, three to a row) from :func:`~commscope.metrics.study.step_time_over_repeats`;
    see :func:`plot_study`."""
    agg = cap_series(step_times) if not step_times.empty else step_times
    if not agg.empty:
        # Only series that sweep the cap (a model run at one cap has no curve to show), labelled
        # by what still varies among them.
        agg = agg[agg.groupby(["model", "label"])["bw"].transform("nunique") > 1]
        series = [c for c in SERIES_AXES if c in agg and agg[c].nunique(dropna=False) > 1]
        agg = agg.assign(label=agg.apply(_series_label, axis=1, varying=series))
    if agg.empty:
        fig, axes = _new_grid(1)
        _no_data(axes[0], "cells that vary the cap" if not step_times.empty else "cells")
        return _save(fig, out_png)
    if palette is None:
        palette = strategy_palette(agg["strategy"].astype(str))
    cap_mbps = agg["bw_bps"] / 1e6
    finite = cap_mbps.dropna()
    # Uncapped cells get a position right of the largest cap (log axis: a factor, not a sum),
    # and their own tick label, instead of being dropped or drawn at a made-up rate.
    no_cap_x = float(finite.max() * 4) if not finite.empty else 1.0
    agg = agg.assign(x=cap_mbps.fillna(no_cap_x))
    # The series label (strategy and what else varies) is the legend's; the panel's rows keep it.
    panels = [(m, rows.assign(label=agg.loc[rows.index, "label"])) for m, rows in _panels(agg)]
    fig, axes = _new_grid(len(panels), height=3.8)
    markers = ["o", "s", "^", "D", "v", "P", "X"]
    handles: dict[str, object] = {}
    for ax, (model, rows) in zip(axes, panels, strict=True):
        for i, (label, sub) in enumerate(rows.groupby("label", sort=True)):
            sub = sub.sort_values("x")
            handles[str(label)] = ax.errorbar(
                sub["x"],
                sub["mean"] * 1e3,
                yerr=sub["std"] * 1e3,
                label=label,
                color=_colour(palette, str(sub["strategy"].iloc[0])),
                marker=markers[i % len(markers)],
                capsize=3,
                linewidth=1.3,
            )
        ax.set_xscale("log")
        ticks = sorted(set(finite.tolist()))
        labels = [f"{t:g}" for t in ticks]
        if cap_mbps.isna().any():
            ticks.append(no_cap_x)
            labels.append("no cap")
            if not finite.empty:
                ax.axvline(math.sqrt(finite.max() * no_cap_x), color="0.7", ls=":", lw=0.8)
        ax.set_xticks(ticks, labels)
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
        ax.set_ylim(bottom=0)
        ax.set_xlabel("bandwidth cap (Mbit/s, log)")
        ax.set_ylabel("step time (ms)")
        ax.set_title(_panel_title("step time vs cap", model, len(panels)))
    _legend_below(fig, handles, "strategy")
    return _save(fig, out_png)


@_styled
def plot_bytes_per_step(data: pd.DataFrame, out_png: Path) -> Path:
    """Bar chart of framework bytes per step by op and strategy (one panel per model, replays
    together, three to a row; colours are ops, not strategies) from
    :func:`~commscope.metrics.study.bytes_per_step_by_op`; see :func:`plot_study`."""
    data = data[data["bytes_per_step"] > 0]
    panels = _panels(data)
    fig, axes = _new_grid(len(panels), width=4.6, height=3.8)
    if not panels:
        _no_data(axes[0], "communication in measured steps")
        return _save(fig, out_png)
    palette = _palette(data["op"].astype(str))
    handles: dict[str, object] = {}
    for ax, (model, rows) in zip(axes, panels, strict=True):
        rows = rows.assign(mb=rows["bytes_per_step"] / 1e6)
        sns.barplot(
            data=rows,
            x="label",
            y="mb",
            hue="op",
            hue_order=sorted(rows["op"].unique()),
            order=sorted(rows["label"].unique()),
            palette=palette,
            errorbar=None,
            ax=ax,
        )
        # Strategies differ by orders of magnitude (DDP vs PP): a linear axis hides the small.
        if rows["mb"].max() / rows["mb"].min() > 100:
            ax.set_yscale("log")
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles[label] = handle
        if ax.get_legend() is not None:
            ax.get_legend().remove()
        ax.tick_params(axis="x", labelrotation=30)
        for tick in ax.get_xticklabels():
            tick.set_horizontalalignment("right")
        ax.set_xlabel("")
        ax.set_ylabel("MB per step (all ranks)")
        ax.set_title(_panel_title("bytes per step by op", model, len(panels)))
    _legend_below(fig, handles, "op")
    return _save(fig, out_png)


# The panels of the slowdown figure: the shaping axis each moves alone (its x is the axis's
# number, spec.link.SHAPING), how the x axis reads, what "no data" says, and the tick label of
# the unshaped point.
_SLOWDOWN_PANELS: tuple[tuple[str, str, str, str], ...] = (
    ("bw", "bandwidth cap (Mbit/s, log scale)", "cap", "no cap"),
    ("delay", "one-way delay on each node's ingress (ms, log scale)", "delay", "0"),
    ("loss", "random loss on each node's ingress (%, log scale)", "loss", "0"),
)


def _baseline_words(slowdown: pd.DataFrame) -> str:
    """The link the slowdowns are against, in words, read off the table's baseline rows (their
    link numbers, :func:`~commscope.spec.link.link_label`): ``"unshaped"``, or the reference
    link's, e.g. ``"cap 1000 Mbit/s"``."""
    base = slowdown[slowdown["varied"] == "baseline"] if "varied" in slowdown else slowdown
    return link_label(base.iloc[0].to_dict()) if len(base) else "unshaped"


def _held_fixed(series: pd.DataFrame, baseline: str = "unshaped") -> str:
    """What every series of a panel shares, for its title: ``"2 nodes × 1 rank, gpt-tiny"``
    (a setup axis that differs between series is in the series' labels instead), then the link
    otherwise (``baseline``: ``unshaped``, or the reference link's words)."""
    parts = []
    if series["nodes"].nunique() == 1 and series["ranks_per_node"].nunique() == 1:
        nodes, ranks = series["nodes"].iloc[0], series["ranks_per_node"].iloc[0]
        parts.append(f"{_count(nodes, 'node')} × {_count(ranks, 'rank')}")
    for axis in ("model", "cc"):
        if series[axis].nunique() == 1:
            parts.append(str(series[axis].iloc[0]))
    return ", ".join([*parts, f"{baseline} otherwise"])


def _wrap_title(text: str, width: int = 44) -> str:
    """``text`` in lines of at most ``width`` characters, never between a number and its unit
    or a cap and its rate: one line of a panel's title ran into the next panel's at 1280 px."""
    glued = re.sub(r"(?<=\d) (?=[kMG]?bit/s|ms|%)|(?<=\bcap) (?=\d)", "\u00a0", text)
    return "\n".join(textwrap.wrap(glued, width))


def _count(value: object, noun: str) -> str:
    return f"{value} {noun}" if str(value) == "1" else f"{value} {noun}s"


def _setup_label(row: pd.Series, varying: list[str]) -> str:
    """A series' legend label: its strategy, then the setup axes that differ between series."""
    extra = ", ".join(f"{axis}={row[axis]}" for axis in varying)
    return f"{row['strategy']} ({extra})" if extra else str(row["strategy"])


def _slowdown_series(slowdown: pd.DataFrame, axis: str) -> pd.DataFrame:
    """Rows of the setups that vary ``axis`` alone: their ``axis`` cells and their baseline
    (on the reference link, or unshaped), where a slowdown exists."""
    rows = slowdown[slowdown["varied"].isin([axis, "baseline"]) & slowdown["slowdown_mean"].notna()]
    moved = rows[rows["varied"] == axis][list(SETUP_AXES)].drop_duplicates()
    return rows.merge(moved, on=list(SETUP_AXES), how="inner")


@_styled
def plot_slowdown(
    slowdown: pd.DataFrame, out_png: Path, palette: Mapping[str, tuple] | None = None
) -> Path:
    """Draw :func:`slowdown_figure` to ``out_png``; see :func:`plot_study`."""
    return _save(slowdown_figure(slowdown, palette), out_png)


@_styled
def slowdown_figure(slowdown: pd.DataFrame, palette: Mapping[str, tuple] | None = None) -> Figure:
    """Slowdown against the bandwidth cap, the one-way delay and the loss, three panels side by
    side, from :func:`~commscope.metrics.study.slowdown_table`.

    A panel draws the setups that vary its axis alone (the other shaping axes as on the
    baseline's link: the reference link, or unshaped without one), one line per setup coloured
    by strategy, through its baseline (slowdown 1 on average: at the reference's cap, or "no
    cap" at the right of the cap panel; "0" at the left of the others; log x) and each setting;
    with a reference link the unshaped setting is the "no cap" point, under 1×. Error bars are
    the 95 % interval of the slowdown where the setting and its baseline both have two or more
    repeats (:func:`~commscope.metrics.study.ratio_ci`). The dashed line is 1× (as fast as the
    baseline); the y axis turns logarithmic when a panel spans more than 10×. Titles say what is
    held fixed (once, above the panels, when they share it). Jitter and settings that move
    several axes at once are in the table only. One legend for the figure; a panel without such
    setups says so.
    """
    fig, axes = _new_figure(len(_SLOWDOWN_PANELS), width=5.0, height=4.4)
    if not slowdown.empty:
        slowdown = slowdown.assign(strategy=strategy_label(slowdown))
    drawn = {
        axis: _slowdown_series(slowdown, axis) if not slowdown.empty else slowdown
        for axis, *_ in _SLOWDOWN_PANELS
    }
    every = pd.concat([d for d in drawn.values() if not d.empty] or [pd.DataFrame()])
    # Setup axes besides the strategy that differ between drawn series go into the labels; a
    # label keeps its colour (the strategy's, as in every figure) and marker in every panel.
    varying = [
        a for a in SETUP_AXES if a != "strategy" and not every.empty and every[a].nunique() > 1
    ]
    if palette is None:
        palette = strategy_palette(slowdown["strategy"].astype(str)) if not slowdown.empty else {}
    labels = sorted(set(every.apply(_setup_label, axis=1, varying=varying))) if len(every) else []
    markers = dict(zip(labels, itertools.cycle(["o", "s", "^", "D", "v", "P", "X"]), strict=False))
    baseline = _baseline_words(slowdown) if not slowdown.empty else "unshaped"
    held = {axis: _held_fixed(rows, baseline) for axis, rows in drawn.items() if not rows.empty}
    shared = len(set(held.values())) == 1
    handles: dict[str, object] = {}
    for ax, (axis, xlabel, what, unshaped_label) in zip(axes, _SLOWDOWN_PANELS, strict=True):
        rows, col = drawn[axis], SHAPING[axis]
        title = {"bw": "vs bandwidth cap", "delay": "vs one-way delay", "loss": "vs loss"}[axis]
        what_held = "" if shared or rows.empty else "\n" + _wrap_title(held[axis])
        ax.set_title(f"slowdown {title}{what_held}")
        if rows.empty:
            _no_data(ax, f"cells that vary the {what} alone")
            continue
        scale = 1e-6 if axis == "bw" else 1.0  # caps in Mbit/s
        values = rows[col].astype("float64") * scale
        # Every cap is a point on the cap axis, the reference link's among them; on the others
        # the settings of the axis.
        shaped = values[values.notna()] if axis == "bw" else values[rows["varied"] == axis]
        # The uncapped or unimpaired point gets a place on the log axis beyond the shaped ones (a
        # factor, not a sum) and its own tick label: right of the largest cap, left of the
        # smallest delay/loss.
        edge = float(shaped.max() if axis == "bw" else shaped.min())
        unshaped_x = edge * 4 if axis == "bw" else edge / 4
        if axis == "bw":  # a baseline on a capped reference link sits at its cap
            rows = rows.assign(x=values.fillna(unshaped_x))
        else:
            rows = rows.assign(x=values.where(rows["varied"] == axis, unshaped_x))
        rows = rows.assign(label=rows.apply(_setup_label, axis=1, varying=varying))
        for label, sub in rows.groupby("label", sort=True):
            sub = sub.sort_values("x")
            mean = sub["slowdown_mean"]
            handles[str(label)] = ax.errorbar(
                sub["x"],
                mean,
                yerr=[
                    (mean - sub["slowdown_ci_low"]).fillna(0.0),
                    (sub["slowdown_ci_high"] - mean).fillna(0.0),
                ],
                label=label,
                color=_colour(palette, str(sub["strategy"].iloc[0])),
                marker=markers[str(label)],
                capsize=3,
                linewidth=1.3,
            )
        ax.axhline(1.0, color="0.4", ls="--", lw=0.9)
        ax.set_xscale("log")
        ticks = sorted(set(shaped.tolist()))
        ax.set_xticks([*ticks, unshaped_x], [*(f"{t:g}" for t in ticks), unshaped_label])
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
        ax.axvline(math.sqrt(edge * unshaped_x), color="0.7", ls=":", lw=0.8)
        # An interval from two runs (t with one degree of freedom: 12.7) can span four decades
        # and squash every mean into a line: the axis shows at most CI_REACH beyond the means,
        # and a longer bar runs off it.
        means = rows["slowdown_mean"].dropna()
        top = float(rows[["slowdown_mean", "slowdown_ci_high"]].max().max())
        bottom = float(rows[["slowdown_mean", "slowdown_ci_low"]].min().min())
        if len(means) and means.min() > 0:
            top = min(top, float(means.max()) * CI_REACH)
            bottom = max(bottom, float(means.min()) / CI_REACH)
        if bottom > 0 and top / bottom > 10:
            ax.set_yscale("log")
            ax.set_ylim(bottom / 1.15, top * 1.15)
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
        else:
            ax.set_ylim(bottom=0, top=max(top, 1.0) * 1.08)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{y:g}×"))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"slowdown (step time / {baseline})")
    if shared:
        fig.suptitle(next(iter(held.values())))
    if handles:
        fig.legend(
            [handles[label] for label in sorted(handles)],
            sorted(handles),
            title="strategy",
            # Below the panels: right of them it would cover the last panel's long title.
            loc="outside lower center",
            # As many columns as the longest label leaves room for across the three panels.
            ncols=max(1, min(len(handles), 5, 150 // max(len(label) for label in handles))),
            fontsize="small",
        )
    return fig
