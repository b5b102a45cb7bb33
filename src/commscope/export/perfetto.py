"""The ops and steps tables → Chrome Trace Event JSON (Perfetto, ``chrome://tracing``).

Layout: one process per node (``pid`` = node index, named ``node N``) and per rank

* a **compute** track, ``tid`` = rank, named ``rank N``: a complete event (``"ph": "X"``) per
  step (``step 3``, category ``step``) with its phases nested inside (``fwd``, ``bwd``,
  ``optim``, ``fwd_bwd``; category ``compute``), phases clamped to their step;
* **communication** tracks, ``tid`` = :data:`COMM_TID_OFFSET` + rank x :data:`MAX_LANES` +
  lane, named ``rank N comm`` (lane 0) and ``rank N comm k``: a complete event per op from
  issue to completion, named after the op, category ``comm``, args ``bytes``, ``bytes_out``,
  ``group``, ``group_ranks``, ``peer``, ``root``, ``seq``, ``step``, ``phase``, ``dtype``,
  ``numel``, ``source`` and the exact ``t_issue_ns``/``t_end_ns``. Ops without a completion
  time get ``dur`` 0 and arg ``t_end_unknown``. Ops that overlap (asynchronous buckets,
  batched P2P) go to further lanes, since complete events on one thread must nest;
* a flow arrow (``"ph": "s"``/``"f"``, category ``p2p``) from each send to the receive it
  matches (same group, sender, receiver and sequence number).

``ts``/``dur`` are µs (floats with ns resolution) relative to ``otherData.origin_ns``, the
earliest time in the tables: absolute epoch µs would not keep ns in a double. Events are
sorted: metadata first, then by ``ts`` (enclosing events before the ones they contain).
"""

from __future__ import annotations

import json
from os import PathLike
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.cell.timeline import PHASES, step_spans
from commscope.export.records import op_records, rank_nodes

COMM_TID_OFFSET = 1_000_000
MAX_LANES = 1000
_OP_ARGS = (
    "bytes",
    "bytes_out",
    "group",
    "group_ranks",
    "peer",
    "root",
    "seq",
    "step",
    "phase",
    "dtype",
    "numel",
    "source",
    "t_issue_ns",
    "t_end_ns",
)


def comm_tid(rank: int, lane: int = 0) -> int:
    """Thread id of a rank's communication lane."""
    return COMM_TID_OFFSET + rank * MAX_LANES + lane


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


def _origin(ops: pd.DataFrame, steps: pd.DataFrame | None) -> int:
    times = []
    if not ops.empty:
        times.append(int(ops["t_issue_ns"].min()))
    if steps is not None and not steps.empty:
        times.append(int(steps["t_start_ns"].min()))
    return min(times) if times else 0


def _lanes(records: list[dict[str, Any]]) -> list[int]:
    """Lane of each op: the first whose last op has completed when this one is issued."""
    busy: list[int] = []  # per lane, when its last op ends
    lanes = []
    for rec in records:
        start = rec["t_issue_ns"]
        end = rec["t_end_ns"] if rec["t_end_ns"] is not None else start
        lane = next((i for i, until in enumerate(busy) if until <= start), len(busy))
        if lane == len(busy):
            busy.append(end)
        else:
            busy[lane] = end
        lanes.append(min(lane, MAX_LANES - 1))
    return lanes


def _thread_metadata(pid: int, tid: int, name: str, sort_index: int) -> list[dict[str, Any]]:
    """The name and sort index of one thread."""
    return [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}},
        {
            "ph": "M",
            "name": "thread_sort_index",
            "pid": pid,
            "tid": tid,
            "args": {"sort_index": sort_index},
        },
    ]


def _process_metadata(nodes: dict[int, int]) -> list[dict[str, Any]]:
    """The name and sort index of each node's process."""
    metadata: list[dict[str, Any]] = []
    for node in sorted(set(nodes.values())):
        metadata.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": node,
                "tid": 0,
                "args": {"name": f"node {node}"},
            }
        )
        metadata.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": node,
                "tid": 0,
                "args": {"sort_index": node},
            }
        )
    return metadata


def _compute_events(
    steps: pd.DataFrame | None, rank: int, pid: int, origin: int
) -> list[dict[str, Any]]:
    """The events of a rank's compute track: its steps, then its phases clamped to them."""
    events: list[dict[str, Any]] = []
    spans = step_spans(steps, rank) if steps is not None else {}
    for step, (start, end) in spans.items():
        events.append(_complete(f"step {step}", "step", pid, rank, start, end, origin))
    if steps is not None and not steps.empty:
        rows = steps[(steps["rank"] == rank) & steps["phase"].isin(PHASES)]
        for step, phase, start, end in rows[["step", "phase", "t_start_ns", "t_end_ns"]].itertuples(
            index=False, name=None
        ):
            start, end = int(start), int(end)
            if int(step) in spans:  # keep phases inside their step: events must nest
                lo, hi = spans[int(step)]
                start, end = min(max(start, lo), hi), max(min(end, hi), lo)
            events.append(
                _complete(str(phase), "compute", pid, rank, start, end, origin, step=int(step))
            )
    return events


def _comm_events(
    recs: list[dict[str, Any]], rank: int, pid: int, origin: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The metadata of a rank's communication lanes and one event per op on them; each
    record keeps its event under ``_event`` for :func:`_p2p_flows`."""
    metadata: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    lanes = _lanes(recs)
    for lane in sorted(set(lanes)):
        name = f"rank {rank} comm" + (f" {lane}" if lane else "")
        metadata += _thread_metadata(
            pid, comm_tid(rank, lane), name, rank * (MAX_LANES + 1) + 1 + lane
        )
    for rec, lane in zip(recs, lanes, strict=True):
        end = rec["t_end_ns"]
        event = _complete(
            rec["op"],
            "comm",
            pid,
            comm_tid(rank, lane),
            rec["t_issue_ns"],
            end if end is not None else rec["t_issue_ns"],
            origin,
        )
        event["args"] = {k: rec[k] for k in _OP_ARGS}
        if end is None:
            event["args"]["t_end_unknown"] = True
        rec["_event"] = event
        events.append(event)
    return metadata, events


def to_chrome_trace(
    ops: pd.DataFrame, steps: pd.DataFrame | None, *, meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The Chrome Trace Event document of one cell (see the module docstring)."""
    origin = _origin(ops, steps)
    nodes = rank_nodes(ops, steps)
    records = op_records(ops)
    metadata = _process_metadata(nodes)
    events: list[dict[str, Any]] = []
    for rank in sorted(nodes):
        pid = nodes[rank]
        metadata += _thread_metadata(pid, rank, f"rank {rank}", rank * (MAX_LANES + 1))
        events += _compute_events(steps, rank, pid, origin)
        lane_metadata, comm = _comm_events(records.get(rank, []), rank, pid, origin)
        metadata += lane_metadata
        events += comm

    events += _p2p_flows(records)
    events.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0), e["pid"], e["tid"]))
    other = {"origin_ns": origin, "source": "commscope"}
    if meta:
        other.update({k: meta[k] for k in ("cell", "world_size", "backend") if k in meta})
    return {"traceEvents": metadata + events, "displayTimeUnit": "ns", "otherData": other}


def _complete(
    name: str,
    cat: str,
    pid: int,
    tid: int,
    start_ns: int,
    end_ns: int,
    origin: int,
    **args: Any,
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": _us(start_ns - origin),
        "dur": _us(max(end_ns - start_ns, 0)),
        "pid": pid,
        "tid": tid,
    }
    if args:
        event["args"] = args
    return event


def _p2p_flows(records: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Flow arrows from each send to its matching receive."""
    recvs = {
        (rec["group"], rec["peer"], rank, rec["seq"]): rec
        for rank, recs in records.items()
        for rec in recs
        if rec["op"] == "recv"
    }
    flows: list[dict[str, Any]] = []
    for rank, recs in records.items():
        for rec in recs:
            if rec["op"] != "send":
                continue
            match = recvs.get((rec["group"], rank, rec["peer"], rec["seq"]))
            if match is None:
                continue
            send, recv = rec["_event"], match["_event"]
            # The arrow ends where the data can arrive: not before the send, inside the recv.
            arrive = min(max(recv["ts"], send["ts"]), recv["ts"] + recv["dur"])
            common = {"name": "p2p", "cat": "p2p", "id": len(flows) // 2}
            flows.append(
                {**common, "ph": "s", "ts": send["ts"], "pid": send["pid"], "tid": send["tid"]}
            )
            flows.append(
                {
                    **common,
                    "ph": "f",
                    "bp": "e",
                    "ts": arrive,
                    "pid": recv["pid"],
                    "tid": recv["tid"],
                }
            )
    return flows


def write_chrome_trace(
    path: str | PathLike[str],
    ops: pd.DataFrame,
    steps: pd.DataFrame | None,
    *,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write :func:`to_chrome_trace` as JSON (Perfetto opens it directly)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_chrome_trace(ops, steps, meta=meta), separators=(",", ":")))
    return path
