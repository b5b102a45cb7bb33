"""Figures across cells: message sizes, step time vs bandwidth, bytes per step by op, and the
communication matrices (:mod:`.matrices`), drawn from the aggregated tables and the study
tables the aggregate job derives (:data:`commscope.contracts.STUDY_TABLES`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter

from commscope.contracts import STUDY_FIGURE_TABLES, STUDY_FIGURES, table_file
from commscope.metrics.study import SERIES_AXES
from commscope.plots._style import _new_figure, _no_data, _palette, _save, _styled
from commscope.plots.matrices import plot_comm_matrices
from commscope.units import bytes_tick


def plot_study(tables: Mapping[str, Path], figures: Mapping[str, Path]) -> list[Path]:
    """Draw the cross-cell figures from the aggregated tables; return their paths.

    ``tables`` maps each name of :data:`STUDY_FIGURE_TABLES` to its parquet file in the
    aggregate directory, ``figures`` each name of :data:`STUDY_FIGURES` to the PNG to write
    (see :func:`study_table_paths`, :func:`study_figure_paths`). The derived tables
    (:data:`~commscope.contracts.STUDY_TABLES`) are the aggregate job's; this only draws.

    ``msg_size_cdf.png``: message-size CDF per strategy (measured steps only, log x).
    ``step_time_vs_bw.png``: mean step time vs bandwidth cap per strategy, error bars are the
    standard deviation over repeats; the uncapped cells sit at the right, labelled "no cap".
    ``bytes_per_step_by_op.png``: framework bytes per measured step by op type and strategy.
    ``comm_matrix_nodes.png``, ``comm_matrix_ranks.png``: node x node and rank x rank bytes per
    measured step, one representative cell per strategy (see :func:`plot_comm_matrices`).
    One panel per model when several models were run. Every figure is always written (with a
    "no data" note when its table is empty) so pipeline outputs are predictable.
    """
    return [
        plot_size_cdf(pd.read_parquet(tables["msg_size_cdf"]), figures["msg_size_cdf"]),
        plot_step_time_vs_bw(
            pd.read_parquet(tables["step_time_over_repeats"]), figures["step_time_vs_bw"]
        ),
        plot_bytes_per_step(
            pd.read_parquet(tables["bytes_per_step_by_op"]), figures["bytes_per_step_by_op"]
        ),
        *plot_comm_matrices(
            tables["node_matrix"],
            tables["comm_matrix"],
            pd.read_parquet(tables["summary"]),
            figures["comm_matrix_nodes"],
            figures["comm_matrix_ranks"],
        ),
    ]


def study_table_paths(aggregate_dir: Path) -> dict[str, Path]:
    """The :data:`STUDY_FIGURE_TABLES` files in an aggregate directory, by table name."""
    return {name: Path(aggregate_dir) / table_file(name) for name in STUDY_FIGURE_TABLES}


def study_figure_paths(out_dir: Path) -> dict[str, Path]:
    """The :data:`STUDY_FIGURES` files in ``out_dir``, by figure name."""
    return {name: Path(out_dir) / f"{name}.png" for name in STUDY_FIGURES}


def _models(df: pd.DataFrame) -> list[str]:
    return sorted(df["model"].astype(str).unique()) if "model" in df and not df.empty else [""]


def _model_rows(df: pd.DataFrame, model: str) -> pd.DataFrame:
    return df[df["model"].astype(str) == model] if model else df


@_styled
def plot_size_cdf(cdf: pd.DataFrame, out_png: Path) -> Path:
    """Message-size CDF per strategy (one panel per model) from
    :func:`~commscope.metrics.study.measured_size_cdf`; see :func:`plot_study`."""
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
        ax.xaxis.set_major_formatter(FuncFormatter(bytes_tick))
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("message size (payload per rank, log scale)")
        ax.set_ylabel("fraction of messages ≤ size")
        ax.set_title(f"message sizes{f' — {model}' if model else ''}")
        ax.legend(title="strategy", fontsize="small")
    return _save(fig, out_png)


def _series_label(row: pd.Series, varying: list[str]) -> str:
    extra = ", ".join(f"{c}={row[c]}" for c in varying)
    return f"{row['strategy']} ({extra})" if extra else str(row["strategy"])


@_styled
def plot_step_time_vs_bw(step_times: pd.DataFrame, out_png: Path) -> Path:
    """Step time vs bandwidth cap per strategy (one panel per model) from
    :func:`~commscope.metrics.study.step_time_over_repeats`; see :func:`plot_study`."""
    models = _models(step_times)
    fig, axes = _new_figure(len(models))
    if step_times.empty:
        _no_data(axes[0], "cells")
        return _save(fig, out_png)
    agg = step_times.copy()
    cap_mbps = agg["bw_bps"] / 1e6
    finite = cap_mbps.dropna()
    # Uncapped cells get a position right of the largest cap (log axis: a factor, not a sum),
    # and their own tick label, instead of being dropped or drawn at a made-up rate.
    no_cap_x = float(finite.max() * 4) if not finite.empty else 1.0
    agg["x"] = cap_mbps.fillna(no_cap_x)
    varying = [c for c in SERIES_AXES if c in agg]
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
        if cap_mbps.isna().any():
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
    return _save(fig, out_png)


@_styled
def plot_bytes_per_step(data: pd.DataFrame, out_png: Path) -> Path:
    """Bar chart of framework bytes per step by op and strategy from
    :func:`~commscope.metrics.study.bytes_per_step_by_op`; see :func:`plot_study`."""
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
    return _save(fig, out_png)
