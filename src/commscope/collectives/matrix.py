"""The one communication-matrix builder: rank x rank bytes from an ops table under the traffic
model (:func:`commscope.collectives.traffic.op_sends`), and node x node bytes from that.

Used for measured cells (:func:`commscope.metrics.comm_matrix`, per measured step, split by op)
and for predictions (split by traffic type), so both count the same transfers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from commscope.collectives.traffic import DEFAULT_BACKEND, op_sends

RANK_PAIR_COLUMNS = ["src_rank", "dst_rank", "src_node", "dst_node"]
NODE_PAIR_COLUMNS = ["src_node", "dst_node"]


@dataclass
class Placement:
    """Which node each rank runs on.

    ``recorded`` is what the trace says (every rank that issued an op); a rank that issued none
    (only ever a peer or a root) is placed by ``ranks_per_node``, as ranks on a node are
    contiguous, and at node -1 when that is unknown too.
    """

    recorded: dict[int, int]
    ranks_per_node: int = 0

    @classmethod
    def from_ops(cls, ops: pd.DataFrame, ranks_per_node: Any = None) -> Placement:
        """Placement from the ``rank`` and ``node`` columns of ``ops`` (any op table)."""
        recorded: dict[int, int] = {}
        if not ops.empty and {"rank", "node"} <= set(ops.columns):
            pairs = ops[["rank", "node"]].drop_duplicates("rank")
            recorded = {int(r): int(n) for r, n in pairs.itertuples(index=False, name=None)}
        return cls(recorded, positive_int(ranks_per_node))

    def node(self, rank: int) -> int:
        """The node of global rank ``rank`` (-1 when it cannot be placed)."""
        rank = int(rank)
        if rank in self.recorded:
            return self.recorded[rank]
        return rank // self.ranks_per_node if self.ranks_per_node and rank >= 0 else -1


def positive_int(value: Any) -> int:
    """``value`` as a non-negative int; 0 when absent, null or not a number."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return 0
    return max(number, 0)


def rank_matrix(
    ops: pd.DataFrame,
    by: Sequence[str] = ("op",),
    backend: str = DEFAULT_BACKEND,
    place: Placement | None = None,
    divide_by: float = 1,
) -> pd.DataFrame:
    """Rank x rank bytes: what each rank sends to each other rank for the records of ``ops``
    under ``backend``'s algorithms (:func:`~commscope.collectives.traffic.op_sends`: each
    record counts once, as its own rank's sends), summed per (src_rank, dst_rank, src_node,
    dst_node, ``by``...) and divided by ``divide_by`` (the number of steps ``ops`` covers, for
    a per-step matrix).

    ``by`` are columns to split by: ``op`` and any column of ``ops`` (``group_kind`` of a
    trace, ``traffic`` of a prediction). ``place`` puts ranks on nodes (default: from ``ops``
    itself, :meth:`Placement.from_ops`); pass one built from a larger table when ``ops`` is a
    subset in which some ranks issue nothing. Rows are sparse (only pairs that exchange
    bytes), sorted by the keys.

    Columns: src_rank, dst_rank, src_node, dst_node, by..., bytes.
    """
    by = list(by)
    cols = [*RANK_PAIR_COLUMNS, *by, "bytes"]
    sends = op_sends(ops, [k for k in by if k != "op"], backend)
    if sends.empty:
        return pd.DataFrame(columns=cols)
    place = Placement.from_ops(ops) if place is None else place
    sends = sends.rename(columns={"rank": "src_rank"})
    sends["src_node"] = sends["src_rank"].map(place.node).astype("int64")
    sends["dst_node"] = sends["dst_rank"].map(place.node).astype("int64")
    keys = cols[:-1]
    # dropna=False: a null key (e.g. an op without a group kind) must not drop its bytes.
    grouped = sends.groupby(keys, sort=True, dropna=False, observed=True)["bytes"]
    return grouped.sum().div(divide_by).reset_index()[cols]


def node_matrix(rank_mat: pd.DataFrame, nodes: int = 0, by: Sequence[str] = ()) -> pd.DataFrame:
    """Node x node bytes from a :func:`rank_matrix`: what each node sends to each node.

    The diagonal (``src_node == dst_node``) is traffic between ranks of one node, which never
    reaches the network. The grid is complete: every pair of nodes 0 .. ``nodes``-1 and of any
    node seen in ``rank_mat`` (times every value of the ``by`` columns) has a row, zero where
    nothing flows, so heatmaps are square.

    Columns: src_node, dst_node, by..., bytes.
    """
    by = list(by)
    seen = set(rank_mat["src_node"].astype(int)) | set(rank_mat["dst_node"].astype(int))
    order = sorted(seen | set(range(positive_int(nodes))))
    levels: list[Any] = [order, order]
    levels += [sorted(rank_mat[k].unique()) for k in by]
    grid = pd.MultiIndex.from_product(levels, names=[*NODE_PAIR_COLUMNS, *by])
    summed = rank_mat.groupby([*NODE_PAIR_COLUMNS, *by])["bytes"].sum()
    return summed.reindex(grid, fill_value=0.0).reset_index()[[*NODE_PAIR_COLUMNS, *by, "bytes"]]
