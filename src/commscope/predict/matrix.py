"""Rank x rank and node x node bytes per step of a prediction, split by traffic type, from the
one matrix builder shared with measured cells (:mod:`commscope.collectives.matrix`), and the
same matrices built from a prediction's roles (:mod:`commscope.predict.roles`) without its op
table; :func:`node_matrix_summary` is what ``commscope predict`` prints of a node matrix too
large to print."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from commscope.collectives import matrix
from commscope.collectives.traffic import DEFAULT_BACKEND
from commscope.predict.ops import TRAFFIC_TYPES
from commscope.predict.roles import RoleOps


def _meta(pred: pd.DataFrame) -> dict:
    return pred.attrs.get("predict", {})


def rank_matrix(pred: pd.DataFrame) -> pd.DataFrame:
    """Rank x rank bytes per step by traffic type (sparse: src_rank, dst_rank, src_node,
    dst_node, traffic, bytes) under the prediction's backend (NCCL's rings unless the
    prediction says otherwise; :func:`commscope.collectives.traffic.op_destinations`)."""
    meta = _meta(pred)
    place = matrix.Placement.from_ops(pred, meta.get("ranks_per_node"))
    backend = meta.get("backend") or DEFAULT_BACKEND
    return matrix.rank_matrix(pred, by=["traffic"], backend=backend, place=place)


def node_matrix(pred: pd.DataFrame, by_traffic: bool = False) -> pd.DataFrame:
    """Node x node bytes per step (complete grid; the diagonal is traffic inside a node)."""
    nodes = int(_meta(pred).get("nodes", 0)) or int(pred["node"].max()) + 1
    return matrix.node_matrix(rank_matrix(pred), nodes, by=["traffic"] if by_traffic else [])


def step_rank_matrix(step: RoleOps) -> pd.DataFrame:
    """:func:`rank_matrix` of ``step.frame()``, from the roles' sends (the same rows, sums and
    order; ranks sit on nodes of ``ranks_per_node`` consecutive ranks, as the ops say)."""
    by = "traffic"
    backend = step.meta.get("backend") or DEFAULT_BACKEND
    cols = [*matrix.RANK_PAIR_COLUMNS, by, "bytes"]
    sends = step.sends(by, backend)
    if sends.empty:
        return pd.DataFrame(columns=cols)
    rpn = step.ranks_per_node
    sends["src_node"] = sends["src_rank"] // rpn
    sends["dst_node"] = sends["dst_rank"] // rpn
    keys = cols[:-1]
    # As collectives.matrix.rank_matrix groups: each group's rows in the sender's order.
    grouped = sends.groupby(keys, sort=True, dropna=False, observed=True)["bytes"]
    return grouped.sum().div(1).reset_index()[cols]


def node_grid(rank_mat: pd.DataFrame, nodes: int = 0, by: Sequence[str] = ()) -> pd.DataFrame:
    """:func:`commscope.collectives.matrix.node_matrix` (the complete grid, the same rows,
    values and dtypes) filled into arrays instead of reindexed, which takes seconds less at
    thousands of nodes (a 2,048-node grid by four traffic types has 16.8 M rows)."""
    by = list(by)
    cols = [*matrix.NODE_PAIR_COLUMNS, *by, "bytes"]
    seen = set(rank_mat["src_node"].astype(int)) | set(rank_mat["dst_node"].astype(int))
    order = sorted(seen | set(range(matrix.positive_int(nodes))))
    levels: list[list[Any]] = [sorted(rank_mat[k].unique()) for k in by]
    shape = (len(order), len(order), *(len(v) for v in levels))
    size = int(np.prod(shape))
    if size == 0:
        return matrix.node_matrix(rank_mat, nodes, by)
    summed = rank_mat.groupby([*matrix.NODE_PAIR_COLUMNS, *by])["bytes"].sum()
    values = np.zeros(size, dtype=np.float64)
    if len(summed):
        index = summed.index.to_frame(index=False)
        node_at = {n: i for i, n in enumerate(order)}
        codes = [index[c].map(node_at).to_numpy() for c in matrix.NODE_PAIR_COLUMNS]
        codes += [index[k].map({v: i for i, v in enumerate(lv)}).to_numpy()
                  for k, lv in zip(by, levels, strict=True)]  # fmt: skip
        values[np.ravel_multi_index(codes, shape)] = summed.to_numpy(np.float64)
    # The grid's keys in MultiIndex.from_product order (the first level slowest), each level
    # as the Index from_product makes of it, so the columns get its dtypes.
    out: dict[str, Any] = {}
    names = [*matrix.NODE_PAIR_COLUMNS, *by]
    level_index = [pd.Index(order), pd.Index(order)] + [pd.Index(lv) for lv in levels]
    inner = size
    for name, lv in zip(names, level_index, strict=True):
        inner //= len(lv)
        codes = np.tile(np.repeat(np.arange(len(lv)), inner), size // (inner * len(lv)))
        out[name] = lv.take(codes).array
    out["bytes"] = values
    return pd.DataFrame(out, columns=cols)


def node_pairs(rank_mat: pd.DataFrame, by: Sequence[str] = ("traffic",)) -> pd.DataFrame:
    """Node x node bytes, only the pairs that exchange any (sparse; columns src_node,
    dst_node, by..., bytes): what :func:`node_grid` holds without its zeros."""
    keys = [*matrix.NODE_PAIR_COLUMNS, *by]
    return rank_mat.groupby(keys, as_index=False)["bytes"].sum()


@dataclass
class NodeMatrixSummary:
    """What a node x node matrix says in a few lines.

    ``split``: per traffic type (and ``all``) the bytes inside nodes (the diagonal), across
    nodes and the inter-node share (NaN when nothing moves). ``top_pairs``: the node pairs
    (src != dst) that carry the most bytes, per traffic type (tp, pp, dp, ep, emb order) and
    in all, largest first (ties in node order).
    ``pairs`` (ordered node pairs with any traffic across them), ``busiest_egress``:
    the largest number of bytes one node sends to other nodes (its network egress), and
    ``busiest_node`` that node.
    """

    pairs: int
    split: pd.DataFrame
    top_pairs: pd.DataFrame
    busiest_node: int
    busiest_egress: float


def node_matrix_summary(node_mat: pd.DataFrame, top: int = 10) -> NodeMatrixSummary:
    """Summarize a node matrix (``src_node``, ``dst_node``, optional ``traffic``, ``bytes``;
    the complete grid of a scenario's ``node_matrix`` or the sparse :func:`node_pairs`) for
    the terminal: see :class:`NodeMatrixSummary`."""
    mat = node_mat[node_mat["bytes"] > 0]
    if "traffic" not in mat.columns:
        mat = mat.assign(traffic="all")
    inside = mat["src_node"] == mat["dst_node"]
    per = pd.DataFrame(
        {
            "intra_node_bytes": mat[inside].groupby("traffic")["bytes"].sum(),
            "inter_node_bytes": mat[~inside].groupby("traffic")["bytes"].sum(),
        }
    ).fillna(0.0)
    per.loc["all"] = per.sum() if len(per) else [0.0, 0.0]
    total = per["intra_node_bytes"] + per["inter_node_bytes"]
    per["inter_node_share"] = (per["inter_node_bytes"] / total).where(total > 0)
    split = per.rename_axis("traffic").reset_index()
    across = mat[~inside]
    pairs = across.pivot_table(
        index=["src_node", "dst_node"], columns="traffic", values="bytes", aggfunc="sum",
        fill_value=0.0,
    )  # fmt: skip
    known = {t: i for i, t in enumerate(TRAFFIC_TYPES)}
    kinds = sorted(map(str, pairs.columns), key=lambda t: (known.get(t, len(known)), t))
    pairs.columns = [str(c) for c in pairs.columns]
    pairs = pairs[kinds]
    pairs["all"] = pairs.sum(axis=1) if kinds else 0.0
    top_pairs = pairs.sort_values("all", ascending=False, kind="stable").head(top).reset_index()
    egress = across.groupby("src_node")["bytes"].sum()
    busiest = int(egress.idxmax()) if len(egress) else -1
    return NodeMatrixSummary(
        pairs=len(pairs),
        split=split,
        top_pairs=top_pairs,
        busiest_node=busiest,
        busiest_egress=float(egress.max()) if len(egress) else 0.0,
    )
