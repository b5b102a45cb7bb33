"""Rank x rank and node x node bytes per step of a prediction, split by traffic type, from the
one matrix builder shared with measured cells (:mod:`commscope.collectives.matrix`)."""

from __future__ import annotations

import pandas as pd

from commscope.collectives import matrix
from commscope.collectives.traffic import DEFAULT_BACKEND


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
