"""The ops table as plain records for the exporters: each rank's ops as dicts in issue order
(:func:`op_records`), and the node of every rank (:func:`rank_nodes`)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from commscope.cell.timeline import blocked_intervals
from commscope.contracts import BLOCKING_COLUMN, WAIT_COLUMN, WAIT_END_COLUMN, WAIT_START_COLUMN

# The ops columns blocked_intervals reads besides the op's times.
_BLOCK_INPUTS = {BLOCKING_COLUMN, WAIT_COLUMN, WAIT_END_COLUMN, WAIT_START_COLUMN}


def _int(value: Any, default: int = -1) -> int:
    """``value`` as int; ``default`` for null/NaN/missing."""
    if value is None or value is pd.NA:
        return default
    try:
        if isinstance(value, float) and math.isnan(value):
            return default
        return int(value)
    except (TypeError, ValueError):
        return default


def _str(value: Any) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def op_records(ops: pd.DataFrame) -> dict[int, list[dict[str, Any]]]:
    """Each rank's ops as plain dicts, in issue order (``t_issue_ns``, then table order).

    Integer fields are Python ints (-1 when null or absent: ``root`` is missing from older
    traces), ``t_end_ns`` is None when unknown, ``split_bytes`` kept when present.
    ``t_block_start_ns``/``t_block_end_ns``: when the rank was blocked on the op
    (:func:`commscope.cell.timeline.blocked_intervals`), None where it was not; absent when
    ``ops`` has no ``t_end_ns`` column.
    """
    out: dict[int, list[dict[str, Any]]] = {}
    if ops.empty:
        return out
    has = set(ops.columns)
    rows = ops.to_dict("records")
    blocks = None
    if "t_end_ns" in has:
        lab = blocked_intervals(ops[["t_issue_ns", "t_end_ns", *sorted(has & _BLOCK_INPUTS)]])
        blocks = list(
            zip(lab["t_block_start_ns"].tolist(), lab["t_block_end_ns"].tolist(), strict=True)
        )
    order = sorted(
        range(len(rows)), key=lambda i: (_int(rows[i]["rank"]), _int(rows[i]["t_issue_ns"]), i)
    )
    for i in order:
        row = rows[i]
        rec = {
            "rank": _int(row["rank"]),
            "node": _int(row.get("node")),
            "op": str(row["op"]),
            "source": _str(row.get("source")),
            "group": _str(row.get("group")),
            "group_ranks": _ranks_str(row.get("group_ranks")),
            "group_size": _int(row.get("group_size")),
            "peer": _int(row.get("peer")),
            "root": _int(row.get("root")),
            "dtype": _str(row.get("dtype")),
            "numel": _int(row.get("numel")),
            "bytes": _int(row.get("bytes"), 0),
            "bytes_out": _int(row.get("bytes_out")),
            "seq": _int(row.get("seq")),
            "step": _int(row.get("step")),
            "phase": _str(row.get("phase")),
            "t_issue_ns": _int(row["t_issue_ns"]),
            "t_end_ns": None if _int(row.get("t_end_ns")) < 0 else _int(row.get("t_end_ns")),
            "split_bytes": row.get("split_bytes") if "split_bytes" in has else None,
        }
        if blocks is not None:
            start, end = blocks[i]
            rec["t_block_start_ns"] = None if _int(start) < 0 else _int(start)
            rec["t_block_end_ns"] = None if _int(end) < 0 else _int(end)
        out.setdefault(rec["rank"], []).append(rec)
    return out


def _ranks_str(value: Any) -> str:
    """``group_ranks`` as ``"0,1,2"`` whatever form the table stored it in."""
    if value is None or value is pd.NA:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isnan(value):
        return ""
    return ",".join(str(int(v)) for v in value)


def rank_nodes(ops: pd.DataFrame, steps: pd.DataFrame | None = None) -> dict[int, int]:
    """Node of every rank seen in ``ops`` or ``steps`` (both carry ``rank`` and ``node``)."""
    nodes: dict[int, int] = {}
    for frame in (ops, steps):
        if frame is None or frame.empty or not {"rank", "node"} <= set(frame.columns):
            continue
        for rank, node in (
            frame[["rank", "node"]].drop_duplicates("rank").itertuples(index=False, name=None)
        ):
            nodes.setdefault(int(rank), int(node))
    return nodes
