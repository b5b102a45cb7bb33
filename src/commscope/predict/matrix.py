"""Rank x rank and node x node bytes per step of a prediction, from the ring model of
:func:`commscope.collectives.traffic.op_destinations` (kept as two small functions so that one
shared matrix builder can replace them)."""

from __future__ import annotations

import pandas as pd

from commscope.collectives.traffic import op_destinations


def rank_matrix(pred: pd.DataFrame) -> pd.DataFrame:
    """Rank x rank bytes per step by traffic type (sparse: src_rank, dst_rank, src_node,
    dst_node, traffic, bytes), from the ring model of
    :func:`commscope.collectives.traffic.op_destinations`: all-reduce 2(n-1)/n S to the ring
    successor, all-gather (n-1) x shard, reduce-scatter (n-1)/n S, all-to-all S/n to every
    other member, send S to the peer."""
    rpn = int(pred.attrs.get("predict", {}).get("ranks_per_node", 0)) or None
    keys = ["op", "bytes", "group_ranks", "rank", "peer", "root", "traffic"]
    counted = pred.groupby(keys).size().reset_index(name="count")
    rows = []
    for op, nbytes, group, rank, peer, root, traffic, count in counted.itertuples(
        index=False, name=None
    ):
        for dst, b in op_destinations(op, nbytes, group, rank, peer, root):
            rows.append((rank, dst, traffic, b * count))
    mat = pd.DataFrame(rows, columns=["src_rank", "dst_rank", "traffic", "bytes"])
    mat = mat.groupby(["src_rank", "dst_rank", "traffic"], as_index=False)["bytes"].sum()
    node_of = pred.drop_duplicates("rank").set_index("rank")["node"]
    if rpn:
        mat["src_node"] = mat["src_rank"] // rpn
        mat["dst_node"] = mat["dst_rank"] // rpn
    else:
        mat["src_node"] = mat["src_rank"].map(node_of)
        mat["dst_node"] = mat["dst_rank"].map(node_of)
    return mat[["src_rank", "dst_rank", "src_node", "dst_node", "traffic", "bytes"]]


def node_matrix(pred: pd.DataFrame, by_traffic: bool = False) -> pd.DataFrame:
    """Node x node bytes per step (complete grid; the diagonal is traffic inside a node)."""
    mat = rank_matrix(pred)
    meta = pred.attrs.get("predict", {})
    nodes = int(meta.get("nodes", 0)) or int(pred["node"].max()) + 1
    keys = ["src_node", "dst_node", *(["traffic"] if by_traffic else [])]
    levels = [range(nodes), range(nodes)]
    if by_traffic:
        levels.append(sorted(mat["traffic"].unique()))
    grid = pd.MultiIndex.from_product(levels, names=keys)
    return mat.groupby(keys)["bytes"].sum().reindex(grid, fill_value=0.0).reset_index()
