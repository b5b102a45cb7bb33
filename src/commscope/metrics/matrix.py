"""Communication matrix: who sends how much to whom, per rank pair and per node pair."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from commscope.collectives.matrix import Placement, positive_int, rank_matrix
from commscope.collectives.matrix import node_matrix as build_node_matrix
from commscope.collectives.traffic import DEFAULT_BACKEND
from commscope.contracts import GROUP_KIND_COLUMN, with_params
from commscope.metrics._common import (
    _concat,
    _param_cols,
    _per_cell,
)

COMM_MATRIX_COLUMNS = ["src_rank", "dst_rank", "src_node", "dst_node", "op", "bytes"]
NODE_MATRIX_COLUMNS = ["src_node", "dst_node", "bytes"]


def comm_matrix(
    ops: pd.DataFrame,
    warmup_steps: int = 0,
    measured_steps: Iterable[int] | None = None,
    backend: str = DEFAULT_BACKEND,
) -> pd.DataFrame:
    """Rank x rank communication matrix: bytes each rank sends to each other rank per step.

    Built by :func:`commscope.collectives.matrix.rank_matrix` (the one matrix builder, also
    behind the predictor's matrices). Transfers come from :func:`op_destinations` applied to
    every op record (each record counts
    once, as its own rank's sends), so each sender's row total equals its modelled send volume
    (:func:`ring_send_bytes` where the place in a ring or chain does not matter). ``bytes`` is
    the mean per measured step: the total over the measured steps divided by their number, so
    a step without a given transfer counts as zero. Measured steps are ``measured_steps`` when
    given (e.g. the non-warm-up steps of :func:`step_times`, which also counts steps that
    issued no op), else every step number >= ``warmup_steps`` found in ``ops``; set-up ops
    outside any step (``step == -1``) never count. ``src_node``/``dst_node`` come from the
    trace, ranks that issued no op are placed by the ``ranks_per_node`` column (-1 when it is
    absent). Rows are sparse: only pairs that exchanged bytes appear. A rooted op whose root
    was not recorded contributes its expected share (see :func:`op_destinations`).
    ``backend`` picks the algorithms (cell.json ``backend``; gloo and NCCL differ, e.g. in
    reduce_scatter volume and ring direction).

    Columns: cell params, src_rank, dst_rank, src_node, dst_node, op, [group_kind,] bytes
    (group_kind only when ``ops`` has that column).
    """
    params = _param_cols(ops)
    # The parallel dimension of an op's group (dp, tp, ...), kept when the trace records it.
    extra = [GROUP_KIND_COLUMN] if GROUP_KIND_COLUMN in ops.columns else []
    cols = [*COMM_MATRIX_COLUMNS[:-1], *extra, "bytes"]
    fixed_steps = None if measured_steps is None else {int(s) for s in measured_steps}
    frames = []
    for cell_params, cell_ops in _per_cell(ops):
        if fixed_steps is None:
            steps = set(cell_ops.loc[cell_ops["step"] >= max(warmup_steps, 0), "step"].tolist())
        else:
            steps = {s for s in fixed_steps if s >= 0}
        if not steps:
            continue
        # Placed from the whole cell, so a rank only seen outside measured steps still maps.
        place = Placement.from_ops(cell_ops, cell_params.get("ranks_per_node"))
        in_steps = cell_ops[cell_ops["step"].isin(steps)]
        per_step = rank_matrix(in_steps, ["op", *extra], backend, place, divide_by=len(steps))
        if not per_step.empty:
            frames.append(with_params(cell_params, per_step))
    return _concat(frames, [*params, *cols])


def node_matrix(rank_matrix: pd.DataFrame) -> pd.DataFrame:
    """Node x node matrix from :func:`comm_matrix`: bytes per step each node sends to each node.

    The diagonal (``src_node == dst_node``) is traffic between ranks of one node, which goes
    over loopback (or NVLink/PCIe) and never reaches the experiment interface; the off-diagonal
    entries are what the network has to carry. The matrix is complete: every pair of the
    cell's nodes (0 .. ``nodes``-1 when that column is present, plus any node seen) has a row,
    zero where nothing flows, so the diagonal is explicit and heatmaps are square.

    Columns: cell params, src_node, dst_node, bytes.
    """
    params = _param_cols(rank_matrix)
    frames = []
    for cell_params, sub in _per_cell(rank_matrix):
        summed = build_node_matrix(sub, positive_int(cell_params.get("nodes")))
        frames.append(with_params(cell_params, summed[NODE_MATRIX_COLUMNS]))
    return _concat(frames, [*params, *NODE_MATRIX_COLUMNS])


def node_traffic_split(node_mat: pd.DataFrame) -> tuple[float, float]:
    """``(inter-node, intra-node)`` bytes of one cell's :func:`node_matrix`: the off-diagonal
    and the diagonal sums."""
    if node_mat.empty:
        return 0.0, 0.0
    diagonal = node_mat["src_node"] == node_mat["dst_node"]
    return float(node_mat.loc[~diagonal, "bytes"].sum()), float(
        node_mat.loc[diagonal, "bytes"].sum()
    )
