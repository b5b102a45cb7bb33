"""Predicted scenarios (:mod:`commscope.predict.scenarios`): node x node heatmaps of bytes per
step, one scenario or several side by side."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from commscope.metrics.study import cross_node_share
from commscope.plots._style import _frame, _plural, _styled
from commscope.plots.matrices import _draw_matrices

_GB = (1e9, "GB")


def _scenario_panel(node_mat: pd.DataFrame) -> tuple[str, pd.DataFrame, list[int]]:
    """(title, node x node bytes summed over traffic types, node of each row) of one
    scenario's ``node_matrix.parquet``."""
    grid = node_mat.pivot_table(
        index="src_node", columns="dst_node", values="bytes", aggfunc="sum", fill_value=0.0
    )
    nodes = sorted(set(grid.index) | set(grid.columns))
    grid = grid.reindex(index=nodes, columns=nodes, fill_value=0.0)
    first = node_mat.iloc[0] if len(node_mat) else pd.Series(dtype=object)
    crossing = cross_node_share(grid)
    share = f"; {crossing:.1%} of bytes cross nodes" if crossing is not None else ""
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
