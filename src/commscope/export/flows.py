"""The ops table → a flow list for network simulators: who sends how many bytes to whom, when,
after which other flows.

Bytes come from :func:`commscope.collectives.traffic.op_destinations`, the traffic model behind the
communication matrix, so per (src, dst) the flows of a set of steps add up to
:func:`commscope.metrics.comm_matrix` over the same steps (times their number: the matrix is a
per-step mean). A collective is not broken into its ring steps: each op gives one flow per
destination with the total bytes the rank sends there over the whole collective (a ring
all-reduce is one flow of 2(n-1)/n·S to the ring successor, not 2(n-1) chunks). Receives and
barriers send nothing (the matching send carries the bytes), so they give no flow. ``bytes``
is a float where the model divides a payload (S/n).

Columns (:data:`FLOW_COLUMNS`): ``flow_id`` (0.., in start order), ``src_rank``,
``dst_rank``, ``src_node``, ``dst_node``, ``bytes``, ``start_ns`` (the op's issue time),
``op``, ``step``, ``phase``, ``group``, ``seq`` (the op's, to tell instances apart) and
``deps``: semicolon-separated flow ids that must finish before this flow starts. They follow
the sender's issue order: the flows of the rank's previous op that has any, i.e. what it sent
for that op plus what it received for it (the matching send of a receive, its ring
predecessor's share of a collective). Received flows count only when the previous op had
completed before this one was issued and the flow's op was issued earlier, which keeps the
graph acyclic and causal (an asynchronous receive still in flight is no dependency). Empty
for a rank's first flow.
"""

from __future__ import annotations

from collections.abc import Callable
from os import PathLike
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.collectives.traffic import op_destinations
from commscope.contracts import P2P_OPS
from commscope.export.records import op_records, rank_nodes

FLOW_COLUMNS = [
    "flow_id",
    "src_rank",
    "dst_rank",
    "src_node",
    "dst_node",
    "bytes",
    "start_ns",
    "op",
    "step",
    "phase",
    "group",
    "seq",
    "deps",
]


def _node_of(nodes: dict[int, int], ranks_per_node: int) -> Any:
    def node(rank: int) -> int:
        if rank in nodes:
            return nodes[rank]
        return rank // ranks_per_node if ranks_per_node > 0 and rank >= 0 else -1

    return node


def _outgoing(
    records: dict[int, list[dict[str, Any]]], backend: str
) -> tuple[list[tuple], dict[tuple[int, int], list[tuple]]]:
    """Every op's outgoing flows ``(start, src, position, index, dst, bytes)``: all of them
    sorted by ``(start, src, position, index)`` (the order of their ids), and per
    ``(rank, position)`` of the op that sends them."""
    pending = []
    out: dict[tuple[int, int], list[tuple]] = {}
    for rank, recs in records.items():
        for pos, rec in enumerate(recs):
            dests = op_destinations(
                rec["op"],
                rec["bytes"],
                rec["group_ranks"],
                rank,
                rec["peer"],
                rec["root"],
                rec["split_bytes"],
                backend=backend,
            )
            flows = [(rec["t_issue_ns"], rank, pos, j, dst, b) for j, (dst, b) in enumerate(dests)]
            out[(rank, pos)] = flows
            pending += flows
    pending.sort(key=lambda f: f[:4])
    return pending, out


def _incoming(
    records: dict[int, list[dict[str, Any]]],
) -> Callable[[int, dict[str, Any]], list[tuple[int, int]]]:
    """``incoming(rank, rec)``: (sender rank, position) of the ops on other ranks whose flows
    reach ``rank`` for ``rec``: same collective instance (group, seq, op), or the send
    matching a receive (group, sender, receiver, seq)."""
    instances: dict[tuple, list[tuple[int, int]]] = {}
    sends: dict[tuple, int] = {}
    for rank, recs in records.items():
        for pos, rec in enumerate(recs):
            if rec["op"] == "send":
                sends[(rec["group"], rank, rec["peer"], rec["seq"])] = pos
            elif rec["op"] not in P2P_OPS and rec["seq"] >= 0:
                instances.setdefault((rec["group"], rec["seq"], rec["op"]), []).append((rank, pos))

    def incoming(rank: int, rec: dict[str, Any]) -> list[tuple[int, int]]:
        """(sender rank, position) of the ops whose flows reach ``rank`` for ``rec``."""
        if rec["op"] == "recv":
            pos = sends.get((rec["group"], rec["peer"], rank, rec["seq"]))
            return [] if pos is None else [(rec["peer"], pos)]
        if rec["op"] in P2P_OPS or rec["seq"] < 0:
            return []
        members = instances.get((rec["group"], rec["seq"], rec["op"]), [])
        return [(r, p) for r, p in members if r != rank]

    return incoming


def _dependencies(
    records: dict[int, list[dict[str, Any]]],
    pending: list[tuple],
    out: dict[tuple[int, int], list[tuple]],
) -> dict[int, str]:
    """The ``deps`` text of every flow id that has any (see the module docstring)."""
    flow_id = {f[:4]: i for i, f in enumerate(pending)}

    def ids_to(rank: int, pos: int, dst: int | None = None) -> list[int]:
        return [flow_id[f[:4]] for f in out.get((rank, pos), []) if dst is None or f[4] == dst]

    incoming = _incoming(records)
    deps: dict[int, str] = {}
    for rank, recs in records.items():
        for pos, rec in enumerate(recs):
            mine = ids_to(rank, pos)
            if not mine:
                continue
            issue = rec["t_issue_ns"]
            before: list[int] = []
            for prev_pos in range(pos - 1, -1, -1):
                prev = recs[prev_pos]
                before = ids_to(rank, prev_pos)
                done = prev["t_end_ns"] is not None and prev["t_end_ns"] <= issue
                if done:
                    for src, src_pos in incoming(rank, prev):
                        if records[src][src_pos]["t_issue_ns"] < issue:
                            before += ids_to(src, src_pos, dst=rank)
                if before:
                    break
            text = ";".join(str(i) for i in sorted(set(before)))
            for i in mine:
                deps[i] = text
    return deps


def _flow_frame(
    records: dict[int, list[dict[str, Any]]],
    pending: list[tuple],
    deps: dict[int, str],
    node: Any,
) -> pd.DataFrame:
    """The flows in id order as a :data:`FLOW_COLUMNS` frame."""
    rows = []
    for start, rank, pos, _, dst, nbytes in pending:
        rec = records[rank][pos]
        i = len(rows)
        rows.append(
            (
                i,
                rank,
                int(dst),
                node(rank),
                node(int(dst)),
                float(nbytes),
                start,
                rec["op"],
                rec["step"],
                rec["phase"],
                rec["group"],
                rec["seq"],
                deps.get(i, ""),
            )
        )
    frame = pd.DataFrame(rows, columns=FLOW_COLUMNS)
    return frame.astype(
        {
            "flow_id": "int64",
            "src_rank": "int64",
            "dst_rank": "int64",
            "src_node": "int64",
            "dst_node": "int64",
            "bytes": "float64",
            "start_ns": "int64",
            "step": "int64",
            "seq": "int64",
        }
    )


def to_flows(
    ops: pd.DataFrame, ranks_per_node: int | None = None, backend: str = "nccl"
) -> pd.DataFrame:
    """The flow list of ``ops`` (one cell); see the module docstring. ``ranks_per_node``
    places ranks that issued no op (default: the table's ``ranks_per_node`` column);
    ``backend`` picks the algorithms the bytes follow (gloo's differ from NCCL's rings, see
    :func:`commscope.collectives.traffic.op_destinations`)."""
    if ops.empty:
        return pd.DataFrame(columns=FLOW_COLUMNS)
    if ranks_per_node is None and "ranks_per_node" in ops.columns:
        ranks_per_node = int(ops["ranks_per_node"].iloc[0])
    node = _node_of(rank_nodes(ops), int(ranks_per_node or 0))
    records = op_records(ops)
    pending, out = _outgoing(records, backend)
    deps = _dependencies(records, pending, out)
    return _flow_frame(records, pending, deps, node)


def write_flows_csv(
    path: str | PathLike[str],
    ops: pd.DataFrame,
    ranks_per_node: int | None = None,
    backend: str = "nccl",
) -> Path:
    """Write :func:`to_flows` as CSV."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    to_flows(ops, ranks_per_node, backend).to_csv(path, index=False)
    return path
