"""Exports of one measured cell for other tools.

* :mod:`~commscope.export.perfetto`: Chrome Trace Event JSON for Perfetto / ``chrome://tracing``
  (a compute track and a communication track per rank, ranks grouped by node);
* :mod:`~commscope.export.chakra`: Chakra execution traces (``.et``, written through
  mlcommons/chakra's ``et_def.proto``, vendored in :mod:`~commscope.chakra_schema`), one
  file per rank, that ASTRA-sim 2.x runs as written, with the rest of ASTRA-sim's input set
  beside them (:mod:`~commscope.export.astrasim`: what each op becomes, communicator groups,
  network, system and memory configs, the command);
* :mod:`~commscope.export.astra`: the ASTRA-sim 1.0 text workload (one layer per line), with
  the Chakra export's comm types and sizes;
* :mod:`~commscope.export.flows`: a flow list (src, dst, bytes, start, dependencies) from the
  traffic model :func:`commscope.collectives.traffic.op_destinations`;
* :mod:`~commscope.export.cell`: :func:`export_cell` writes all of them for one cell.

The helpers below turn one rank's ops and step phases into a single timeline of compute spans
and ops, which the Chakra and ASTRA-sim exports share, so both count compute the same way:

**Compute time** of a rank is the time inside its step phases (``fwd``, ``bwd``, ``optim``,
``fwd_bwd`` of ``steps.parquet``) when none of its communication ops is in flight (issued and
not yet completed). Before each op the compute span runs from the completion of every earlier
op to this op's issue (none if an earlier op is still in flight), cut at phase boundaries (one
span per phase it crosses); after the last op it runs to the end of the last phase. Time
outside step phases (set-up, data loading between steps) is not compute. An op with no
completion time (null ``t_end_ns``) counts as completing when it is issued. A serial replay
(compute, op, compute, ...) therefore reproduces the measured timeline when ops do not overlap
compute; compute that overlapped an in-flight op (asynchronous DDP buckets, pipelined sends) is
not counted, so such a replay serialises what overlapped.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd

# Step phases that hold compute (steps.parquet also has "step", which spans a whole step).
PHASES = ("fwd", "bwd", "optim", "fwd_bwd")


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
    """
    out: dict[int, list[dict[str, Any]]] = {}
    if ops.empty:
        return out
    has = set(ops.columns)
    rows = ops.to_dict("records")
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


@dataclass(frozen=True)
class Interval:
    """One step phase of one rank: [start_ns, end_ns)."""

    start_ns: int
    end_ns: int
    step: int
    phase: str


def phase_intervals(steps: pd.DataFrame, rank: int) -> list[Interval]:
    """The rank's compute phases in time order, made disjoint (a phase that starts before the
    previous one ends is cut to start at that end, so no time counts twice)."""
    if steps is None or steps.empty:
        return []
    rows = steps[(steps["rank"] == rank) & steps["phase"].isin(PHASES)]
    raw = sorted(
        (int(a), int(b), int(s), str(p))
        for a, b, s, p in rows[["t_start_ns", "t_end_ns", "step", "phase"]].itertuples(
            index=False, name=None
        )
        if not (pd.isna(a) or pd.isna(b))
    )
    out: list[Interval] = []
    covered = -(2**63)
    for start, end, step, phase in raw:
        start = max(start, covered)
        if end > start:
            out.append(Interval(start, end, step, phase))
            covered = end
    return out


def step_spans(steps: pd.DataFrame, rank: int) -> dict[int, tuple[int, int]]:
    """(start, end) of each whole step of ``rank`` (phase ``step``)."""
    if steps is None or steps.empty:
        return {}
    rows = steps[(steps["rank"] == rank) & (steps["phase"] == "step")]
    return {
        int(s): (int(a), int(b))
        for s, a, b in rows[["step", "t_start_ns", "t_end_ns"]].itertuples(index=False, name=None)
    }


@dataclass(frozen=True)
class ComputeSpan:
    """Compute of one rank between two ops, inside one step phase."""

    start_ns: int
    end_ns: int
    step: int
    phase: str

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def _clip(intervals: list[Interval], ends: list[int], lo: int, hi: int) -> Iterator[ComputeSpan]:
    """Pieces of [lo, hi) inside the (disjoint, sorted) phase intervals."""
    if hi <= lo:
        return
    for iv in intervals[bisect.bisect_right(ends, lo) :]:
        if iv.start_ns >= hi:
            break
        start, end = max(iv.start_ns, lo), min(iv.end_ns, hi)
        if end > start:
            yield ComputeSpan(start, end, iv.step, iv.phase)


def rank_timeline(
    records: list[dict[str, Any]], intervals: list[Interval]
) -> Iterator[tuple[str, Any]]:
    """One rank's ``("compute", ComputeSpan)`` and ``("op", record)`` items in time order, with
    compute as defined in this package's docstring (phase time with no op in flight)."""
    ends = [iv.end_ns for iv in intervals]
    busy_until = -(2**63)  # completion of every op issued so far
    for rec in records:
        issue = rec["t_issue_ns"]
        yield from (("compute", span) for span in _clip(intervals, ends, busy_until, issue))
        yield "op", rec
        end = rec["t_end_ns"] if rec["t_end_ns"] is not None else issue
        busy_until = max(busy_until, issue, end)
    if intervals:
        tail = _clip(intervals, ends, busy_until, intervals[-1].end_ns)
        yield from (("compute", span) for span in tail)


# The submodules import the helpers above, so they come last.
from commscope.export.astra import (  # noqa: E402
    AstraLayer,
    AstraWorkload,
    astra_workload,
    parse_astra_text,
    to_astra_text,
    write_astra_text,
)
from commscope.export.cell import export_cell  # noqa: E402
from commscope.export.chakra import to_chakra, write_chakra  # noqa: E402
from commscope.export.flows import FLOW_COLUMNS, to_flows, write_flows_csv  # noqa: E402
from commscope.export.perfetto import to_chrome_trace, write_chrome_trace  # noqa: E402

__all__ = [
    "FLOW_COLUMNS",
    "AstraLayer",
    "AstraWorkload",
    "astra_workload",
    "export_cell",
    "parse_astra_text",
    "to_astra_text",
    "to_chakra",
    "to_chrome_trace",
    "to_flows",
    "write_astra_text",
    "write_chakra",
    "write_chrome_trace",
    "write_flows_csv",
]
