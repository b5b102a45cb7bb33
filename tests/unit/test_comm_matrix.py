"""The communication matrix: who sends how much to whom, rank by rank and node by node.

Layouts are 2 nodes x 2 ranks (ranks 0, 1 on node 0; 2, 3 on node 1) unless a test says
otherwise, and payloads are round numbers, so every expected entry is exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from synthetic import make_hybrid_cell

from commscope import metrics as m
from commscope.collectives.traffic import op_destinations, ring_send_bytes
from commscope.contracts import KNOWN_OPS, METRIC_TABLES, PARAM_COLUMNS

approx = pytest.approx
S = 1_000_000


def _op(
    rank: int,
    op: str,
    nbytes: float,
    group: str,
    *,
    step: int = 0,
    peer: int = -1,
    root: int = -1,
    rpn: int = 2,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "cell": "c",
        "strategy": "s",
        "nodes": 2,
        "ranks_per_node": rpn,
        "rank": rank,
        "node": rank // rpn,
        "step": step,
        "op": op,
        "bytes": nbytes,
        "group_ranks": group,
        "group_size": len(group.split(",")),
        "peer": peer,
        "root": root,
        **extra,
    }


def _pairs(matrix: pd.DataFrame, src: str = "src_rank", dst: str = "dst_rank") -> dict:
    """``{(src, dst): bytes}`` of the non-zero entries, summed over ops and group kinds."""
    summed = matrix.groupby([src, dst])["bytes"].sum()
    return {(int(a), int(b)): float(v) for (a, b), v in summed.items() if v}


def _allreduce_in(groups: list[list[int]], nbytes: float = S, **kw: Any) -> list[dict]:
    return [_op(r, "allreduce", nbytes, ",".join(map(str, g)), **kw) for g in groups for r in g]


# ------------------------------------------------------------------------------ the model


def test_op_destinations_per_op() -> None:
    dest = op_destinations
    group = "0,1,2,3"
    # Rings follow group order: the successor of rank 3 in "0,1,2,3" is 0, in "0,2,1,3" rank
    # 0 sends to 2.
    assert dest("allreduce", S, group, 3) == [(0, 1.5 * S)]
    assert dest("allreduce", S, "0,2,1,3", 0) == [(2, 1.5 * S)]
    assert dest("reduce_scatter", S, group, 1) == [(2, 0.75 * S)]
    assert dest("allgather", S, group, 1) == [(2, 3 * S)]  # the input is the shard
    assert dest("alltoall", S, group, 1) == [(0, S / 4), (2, S / 4), (3, S / 4)]
    # Exact per-destination splits, in group order; the rank's own chunk stays local.
    assert dest("alltoall", 999, group, 0, splits="9,100,200,300") == [
        (1, 100),
        (2, 200),
        (3, 300),
    ]
    assert dest("alltoall", 999, group, 0, splits=[9, 0, 200, 300]) == [(2, 200), (3, 300)]
    # Broadcast from 2 along the ring: 2 -> 3 -> 0 -> 1; rank 1, last, forwards nothing.
    assert [dest("broadcast", S, group, r, root=2) for r in range(4)] == [
        [(1, S)],
        [],
        [(3, S)],
        [(0, S)],
    ]
    # Reduce into 2 along the ring: 3 -> 0 -> 1 -> 2.
    assert [dest("reduce", S, group, r, root=2) for r in range(4)] == [
        [(1, S)],
        [(2, S)],
        [],
        [(0, S)],
    ]
    assert dest("gather", S, group, 0, root=2) == [(2, S)]
    assert dest("gather", S, group, 2, root=2) == []
    assert dest("scatter", 4 * S, group, 2, root=2) == [(0, S), (1, S), (3, S)]
    assert dest("scatter", S, group, 0, root=2) == []
    # Root unknown: the expectation over roots, same destinations as the ring or spread.
    assert dest("broadcast", S, group, 0) == [(1, 0.75 * S)]
    assert dest("reduce", S, group, 0, root=7) == [(1, 0.75 * S)]  # 7 is not in the group
    assert dest("gather", S, group, 0) == [(1, S / 4), (2, S / 4), (3, S / 4)]
    # P2P: the send carries the bytes, the matching recv adds nothing.
    assert dest("send", 100, "1,2", 1, peer=2) == [(2, 100.0)]
    assert dest("recv", 100, "1,2", 2, peer=1) == []
    assert dest("send", 100, "1,2", 1) == []  # no peer recorded: nowhere to put it
    assert dest("barrier", 0, group, 0) == []
    assert dest("allreduce", S, "0", 0) == []  # a group of one
    assert dest("allreduce", S, "0,1", 3) == []  # not a member
    assert dest("allreduce", 0, group, 0) == []  # nothing to send
    with pytest.raises(ValueError, match="no traffic model"):
        dest("all_to_all_typo", S, group, 0)
    with pytest.raises(ValueError, match="split_bytes has 2 entries for a group of 4"):
        dest("alltoall", S, group, 0, splits="1,2")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("op", sorted(KNOWN_OPS))
def test_ring_send_bytes_is_the_total_of_op_destinations(op: str, n: int) -> None:
    # One model: per sender, the destinations add up to ring_send_bytes, for every op, group
    # size and place. Only a broadcast's non-root places differ (the last in the chain sends
    # nothing), and their mean is ring_send_bytes(is_root=False).
    members = list(range(10, 10 + n))  # global ranks need not start at 0
    size = 840_000.0
    peer = members[-1] if n > 1 else 99

    def total(rank: int, root: int = -1) -> float:
        return sum(b for _, b in op_destinations(op, size, members, rank, peer, root))

    for rank in members:
        assert total(rank) == approx(ring_send_bytes(op, size, n)), rank
    if op not in {"broadcast", "reduce", "gather", "scatter"} or n < 2:
        return
    root = members[1]
    assert total(root, root) == approx(ring_send_bytes(op, size, n, is_root=True))
    non_root = [total(r, root) for r in members if r != root]
    assert sum(non_root) / len(non_root) == approx(ring_send_bytes(op, size, n, is_root=False))
    if op != "broadcast":
        assert non_root == approx([ring_send_bytes(op, size, n, is_root=False)] * (n - 1))


def test_ring_totals_per_sender_equal_ring_send_bytes() -> None:
    # Each rank's row of the matrix is its ring share, sent to its successor in group order.
    for group in ("0,1,2,3", "3,1,0,2"):
        members = [int(r) for r in group.split(",")]
        for op, nbytes in (("allreduce", S), ("allgather", S), ("reduce_scatter", S)):
            ops = pd.DataFrame([_op(r, op, nbytes, group) for r in members])
            mat = m.comm_matrix(ops)
            sent = mat.groupby("src_rank")["bytes"].sum()
            assert sent.to_dict() == approx({r: ring_send_bytes(op, nbytes, 4) for r in members}), (
                group,
                op,
            )
            succ = {members[i]: members[(i + 1) % 4] for i in range(4)}
            assert dict(zip(mat["src_rank"], mat["dst_rank"], strict=True)) == succ


# ------------------------------------------------------------------------------ the matrix


def test_tp_groups_inside_nodes_stay_on_the_diagonal() -> None:
    # dp x tp on 2 nodes x 2 ranks, TP innermost: groups {0,1} and {2,3} live on one node each.
    ops = pd.DataFrame(_allreduce_in([[0, 1], [2, 3]]))
    ranks = m.comm_matrix(ops)
    # Two ranks per group: a ring all-reduce sends the whole payload to the other member.
    assert _pairs(ranks) == {(0, 1): S, (1, 0): S, (2, 3): S, (3, 2): S}
    nodes = m.node_matrix(ranks)
    assert _pairs(nodes, "src_node", "dst_node") == {(0, 0): 2 * S, (1, 1): 2 * S}
    assert m.node_traffic_split(nodes) == (0.0, 4 * S)


def test_the_same_ops_mapped_across_nodes_go_off_the_diagonal() -> None:
    ops = pd.DataFrame(_allreduce_in([[0, 2], [1, 3]]))
    nodes = m.node_matrix(m.comm_matrix(ops))
    assert _pairs(nodes, "src_node", "dst_node") == {(0, 1): 2 * S, (1, 0): 2 * S}
    assert m.node_traffic_split(nodes) == (4 * S, 0.0)
    # The node matrix is complete: the empty diagonal is there, as zeros.
    assert nodes[["src_node", "dst_node"]].values.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert nodes["bytes"].tolist() == [0.0, 2 * S, 2 * S, 0.0]
    assert list(nodes.columns) == ["cell", "strategy", "nodes", "ranks_per_node"] + list(
        m.NODE_MATRIX_COLUMNS
    )


def test_send_and_recv_count_once_for_the_peer() -> None:
    ops = pd.DataFrame(
        [
            _op(1, "send", 100, "0,1,2,3", peer=2),
            _op(2, "recv", 100, "0,1,2,3", peer=1),
            _op(0, "send", 50, "0,1,2,3", peer=1),
            _op(1, "recv", 50, "0,1,2,3", peer=0),
            _op(3, "barrier", 0, "0,1,2,3"),
        ]
    )
    mat = m.comm_matrix(ops)
    assert mat[["src_rank", "dst_rank", "src_node", "dst_node", "op", "bytes"]].values.tolist() == [
        [0, 1, 0, 0, "send", 50.0],
        [1, 2, 0, 1, "send", 100.0],
    ]


def test_broadcast_chain_from_its_root() -> None:
    ops = pd.DataFrame([_op(r, "broadcast", S, "0,1,2,3", root=2) for r in range(4)])
    ranks = m.comm_matrix(ops)
    assert _pairs(ranks) == {(2, 3): S, (3, 0): S, (0, 1): S}
    nodes = m.node_matrix(ranks)
    assert _pairs(nodes, "src_node", "dst_node") == {(1, 1): S, (1, 0): S, (0, 0): S}


def test_alltoall_with_and_without_exact_splits() -> None:
    even = pd.DataFrame([_op(r, "alltoall", 4000, "0,1,2,3") for r in range(4)])
    assert _pairs(m.comm_matrix(even)) == {
        (a, b): 1000.0 for a in range(4) for b in range(4) if a != b
    }
    # Uneven MoE dispatch: rank r sends (r+1) x 100 bytes to every other rank; the split
    # column may hold strings or lists (parquet list columns).
    rows = []
    for r in range(4):
        splits = [100 * (r + 1)] * 4
        rows.append(_op(r, "alltoall", 999, "0,1,2,3", split_bytes=splits if r % 2 else None))
        if r % 2 == 0:
            rows[-1]["split_bytes"] = ",".join(map(str, splits))
    mat = m.comm_matrix(pd.DataFrame(rows))
    assert _pairs(mat) == {(a, b): 100.0 * (a + 1) for a in range(4) for b in range(4) if a != b}


def test_matrices_average_over_measured_steps() -> None:
    # Step k carries an all-reduce of (k + 1) kB over the node pair {0, 2}; step -1 (set-up)
    # carries 1 MB; steps 0 (warm-up) and -1 must not count.
    ops = [_op(r, "allreduce", 1_000_000, "0,2", step=-1) for r in (0, 2)]
    for k in range(4):
        ops += [_op(r, "allreduce", 1000 * (k + 1), "0,2", step=k) for r in (0, 2)]
    ops = pd.DataFrame(ops)
    mat = m.comm_matrix(ops, warmup_steps=1)
    assert _pairs(mat) == {(0, 2): 3000.0, (2, 0): 3000.0}  # (2 + 3 + 4) kB / 3 steps
    # Step -1 never counts, even without warm-up.
    assert _pairs(m.comm_matrix(ops)) == {(0, 2): 2500.0, (2, 0): 2500.0}
    # A measured step without any op still counts as a step (given by the step table).
    mat = m.comm_matrix(ops, measured_steps=[1, 2, 3, 4])
    assert _pairs(mat) == {(0, 2): 2250.0, (2, 0): 2250.0}
    # Summed over steps, the matrix times the number of steps is the total sent.
    total = m.node_matrix(m.comm_matrix(ops, warmup_steps=1))["bytes"].sum() * 3
    assert total == 2 * (2000 + 3000 + 4000)
    assert m.comm_matrix(ops, warmup_steps=9).empty  # everything is warm-up


def test_group_kind_is_kept_when_recorded() -> None:
    ops = pd.DataFrame(
        [*_allreduce_in([[0, 1], [2, 3]], group_kind="tp")]
        + [*_allreduce_in([[0, 2], [1, 3]], nbytes=250_000, group_kind="dp")]
    )
    mat = m.comm_matrix(ops)
    assert list(mat.columns[-3:]) == ["op", "group_kind", "bytes"]
    by_kind = mat.groupby("group_kind")["bytes"].sum()
    assert by_kind.to_dict() == {"dp": 1_000_000.0, "tp": 4_000_000.0}
    inter = mat[mat["src_node"] != mat["dst_node"]]
    assert set(inter["group_kind"]) == {"dp"}
    assert "group_kind" not in m.comm_matrix(ops.drop(columns="group_kind")).columns


def test_ranks_without_ops_are_placed_by_ranks_per_node() -> None:
    # Rank 3 never issued an op in the measured steps (its trace ends early): ranks_per_node
    # places it; without that column it is unplaceable (-1) and still counts as remote.
    ops = pd.DataFrame([_op(1, "send", 100, "0,1,2,3", peer=3)])
    assert m.comm_matrix(ops)[["src_node", "dst_node"]].values.tolist() == [[0, 1]]
    bare = ops.drop(columns="ranks_per_node")
    assert m.comm_matrix(bare)[["src_node", "dst_node"]].values.tolist() == [[0, -1]]
    # A declared node with no traffic still gets its row and column.
    nodes = m.node_matrix(m.comm_matrix(ops.assign(nodes=3)))
    assert len(nodes) == 9 and nodes["bytes"].sum() == 100


def test_node_matrix_agrees_with_the_wire_model() -> None:
    # framework_tx_bytes of wire_vs_framework is the off-diagonal row sum of the node matrix
    # times the steps: both come from op_destinations.
    ops = [_op(r, "allreduce", 4000, "0,1,2,3", step=s) for r in range(4) for s in range(3)]
    ops += [_op(r, "broadcast", 3000, "0,1,2,3", root=1, step=s) for r in range(4) for s in (0, 2)]
    ops += [_op(1, "send", 100, "1,2", peer=2, step=1), _op(2, "recv", 100, "1,2", peer=1, step=1)]
    ops = pd.DataFrame(ops).assign(t_issue_ns=0, t_end_ns=1)
    meta = {"cell": "c", "params": {"ranks_per_node": 2}}
    wf = m.wire_vs_framework(ops, pd.DataFrame(), meta).set_index("node")
    nodes = m.node_matrix(m.comm_matrix(ops))
    off = nodes[nodes["src_node"] != nodes["dst_node"]].groupby("src_node")["bytes"].sum()
    assert (off * 3).to_dict() == approx(wf["framework_tx_bytes"].to_dict())
    everything = nodes.groupby("src_node")["bytes"].sum() * 3
    assert everything.to_dict() == approx(wf["framework_tx_bytes_with_local"].to_dict())


def test_empty_inputs_give_documented_columns() -> None:
    assert list(m.comm_matrix(pd.DataFrame()).columns) == m.COMM_MATRIX_COLUMNS
    assert list(m.node_matrix(m.comm_matrix(pd.DataFrame())).columns) == m.NODE_MATRIX_COLUMNS
    assert m.node_traffic_split(pd.DataFrame()) == (0.0, 0.0)


# ------------------------------------------------------------------------------ cells, files


@pytest.mark.parametrize(
    ("inside", "inter", "intra"),
    [(True, 1_000_000.0, 8_000_000.0), (False, 8_000_000.0, 1_000_000.0)],
)
def test_mapping_moves_tp_traffic_on_and_off_the_network(
    tmp_path: Path, inside: bool, inter: float, intra: float
) -> None:
    # Per step each rank sends 2 x 1 MB to its TP partner and 250 kB to its DP partner. The
    # set-up broadcast (step -1) and the warm-up step's extra all-reduce must not show.
    cell = make_hybrid_cell(tmp_path / "runs", tp_inside_node=inside)
    out = tmp_path / "metrics"
    m.compute_cell_metrics(cell, out)
    nodes = pd.read_parquet(out / "node_matrix.parquet")
    diag = nodes["src_node"] == nodes["dst_node"]
    assert nodes.loc[diag, "bytes"].tolist() == [intra / 2] * 2
    assert nodes.loc[~diag, "bytes"].tolist() == [inter / 2] * 2
    summary = pd.read_parquet(out / "summary.parquet").iloc[0]
    assert summary["internode_bytes_per_step"] == inter
    assert summary["intranode_bytes_per_step"] == intra
    ranks = pd.read_parquet(out / "comm_matrix.parquet")
    assert set(ranks["group_kind"]) == {"tp", "dp"}  # no "world": warm-up and set-up left out
    assert ranks["bytes"].sum() == inter + intra
    assert ranks["strategy"].iloc[0] == ("dpxtp-tp-inside" if inside else "dpxtp-tp-across")
    assert list(ranks.columns[: len(PARAM_COLUMNS)]) == list(PARAM_COLUMNS)


def test_matrices_aggregate_across_cells(tmp_path: Path) -> None:
    dirs = []
    for inside in (True, False):
        cell = make_hybrid_cell(tmp_path / "runs", tp_inside_node=inside)
        dirs.append(tmp_path / "metrics" / str(inside))
        m.compute_cell_metrics(cell, dirs[-1])
    assert {"comm_matrix", "node_matrix"} <= set(METRIC_TABLES)
    m.aggregate_cells(dirs, tmp_path / "agg")
    nodes = pd.read_parquet(tmp_path / "agg" / "node_matrix.parquet")
    assert len(nodes) == 8
    assert nodes.groupby("strategy")["bytes"].sum().to_dict() == {
        "dpxtp-tp-across": 9_000_000.0,
        "dpxtp-tp-inside": 9_000_000.0,
    }
    ranks = pd.read_parquet(tmp_path / "agg" / "comm_matrix.parquet")
    assert len(ranks) == 16
    summary = pd.read_parquet(tmp_path / "agg" / "summary.parquet").set_index("strategy")
    assert summary["internode_bytes_per_step"].to_dict() == {
        "dpxtp-tp-across": 8_000_000.0,
        "dpxtp-tp-inside": 1_000_000.0,
    }


def test_cell_summary_without_measured_steps_has_nan_traffic(tmp_path: Path) -> None:
    cell = make_hybrid_cell(tmp_path, step_ms=(100,), warmup_steps=1)
    row = m.cell_summary(m.load_cell(cell)).iloc[0]
    assert row["measured_steps"] == 0
    assert pd.isna(row["internode_bytes_per_step"])
    assert pd.isna(row["intranode_bytes_per_step"])
