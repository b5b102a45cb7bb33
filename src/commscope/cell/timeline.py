"""One rank's timeline: when it was blocked in communication and when it computed.

**Compute time** of a rank (the one definition, docs/traces.md *Compute and blocked time*) is
the time inside its training steps when it is not blocked in communication: a step's time minus
the union of the rank's blocked intervals in it. A rank is blocked on an op over the capture's
recorded wait where there is one (``t_wait_start_ns``..``t_wait_end_ns``; never, when
``wait_ns`` is 0), else over the op's whole [issue, end] unless the ops table's
:data:`~commscope.contracts.BLOCKING_COLUMN` says it did not block (:func:`blocked_intervals`).
So compute that overlapped an in-flight asynchronous op (DDP's bucket all-reduces under the
backward, pipelined sends) counts as compute; a trace without waits counts every op as
blocking, an upper bound of the blocked time and a lower bound of compute.

The primitives every consumer of "when was a rank busy" shares (the sync metrics, the replay
program, the exports, the predictor's measured split, the timeline figure):

* :func:`blocked_intervals`: per op, the interval its issuing rank was blocked on it;
* :func:`rank_step_waits`: the same for one rank's step in issue order, with the async rule the
  replay follows (which ops were waited on later, and when);
* :func:`step_blocked_ns`: per rank and step, the union of the blocked intervals in the step
  (step time minus it is the compute time);
* :func:`union`, :func:`union_lengths` and :func:`free_ns`: unions of intervals and the time
  outside them;
* :func:`phase_intervals`, :func:`step_spans`: a rank's step phases from ``steps.parquet``;
* :func:`compute_spans`: a rank's compute as spans inside its phases;
* :func:`rank_timeline`: one rank's compute spans and ops in time order, for the exports
  (Chakra, ASTRA-sim text): before each op the compute since the previous op's issue, cut at
  phase boundaries (one span per phase and unblocked stretch). The exports place compute in
  the named phases (``fwd``, ``bwd``, ``optim``, ``fwd_bwd``), so a step's time outside every
  phase (between the optimizer and the next forward: data loading, zeroing gradients, about
  1 ms of a step here) is not in them. A serial replay of such a trace (compute, op, compute,
  ...) runs every op after the compute before it, so what overlapped an asynchronous op takes
  the op's time on top in the replay.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from commscope.contracts import (
    BLOCKING_COLUMN,
    WAIT_COLUMN,
    WAIT_END_COLUMN,
    WAIT_START_COLUMN,
)

# Step phases that hold compute (steps.parquet also has "step", which spans a whole step).
PHASES = ("fwd", "bwd", "optim", "fwd_bwd")
# A wait that starts this close to the op's issue is the op's own (a synchronous call): the
# capture stamps a synchronous call's wait from its issue exactly; this leaves room for
# traces that stamp them separately.
SYNC_WAIT_TOLERANCE_NS = 20_000


# ------------------------------------------------------------------------ blocked time


def blocked_intervals(ops: pd.DataFrame) -> pd.DataFrame:
    """Add when the issuing rank was blocked on each op: ``wait_known`` (its wait was
    recorded), ``blocking`` (it blocked at all), ``t_block_start_ns``/``t_block_end_ns``
    (Int64, the interval; null where it did not block or the op never completed) and
    ``flagged`` (:data:`BLOCKING_COLUMN` where given, else True: the rule before waits).

    A recorded wait (``wait_ns`` not null) gives the interval [t_wait_start_ns, t_wait_end_ns],
    blocking where ``wait_ns`` > 0. Otherwise the op's whole [t_issue_ns, t_end_ns], blocking
    unless :data:`BLOCKING_COLUMN` says False: the upper bound.
    """
    n = len(ops)
    if WAIT_COLUMN in ops.columns:
        known = ops[WAIT_COLUMN].notna().to_numpy(bool)
        waited = known & (ops[WAIT_COLUMN].fillna(0).to_numpy("int64") > 0)
    else:
        known = waited = np.zeros(n, dtype=bool)
    if BLOCKING_COLUMN in ops.columns:
        flagged = ops[BLOCKING_COLUMN].astype("boolean").fillna(True).to_numpy(bool)
    else:
        flagged = np.ones(n, dtype=bool)
    blocking = np.where(known, waited, flagged)
    issue = ops["t_issue_ns"].astype("Int64")
    end = ops["t_end_ns"].astype("Int64")
    if WAIT_COLUMN in ops.columns:
        start = ops[WAIT_START_COLUMN].astype("Int64").where(known, issue)
        stop = ops[WAIT_END_COLUMN].astype("Int64").where(known, end)
    else:
        start, stop = issue, end
    blocked = blocking & stop.notna().to_numpy(bool) & start.notna().to_numpy(bool)
    return ops.assign(
        flagged=flagged,
        wait_known=known,
        **{BLOCKING_COLUMN: blocking},
        t_block_start_ns=start.where(blocked),
        t_block_end_ns=stop.where(blocked),
    )


def rank_step_waits(
    issue: Sequence[int],
    end: Sequence[int | None],
    wait_ns: Sequence[int | None],
    w_start: Sequence[int | None],
    w_end: Sequence[int | None],
    t1: int,
) -> tuple[list[tuple[int, int]], list[int | None]]:
    """One rank's step, its ops in issue order: the intervals the rank was blocked on them and,
    per op, when an async op was waited for (None: the op blocked from its issue).

    With a recorded wait (``wait_ns`` not None): an op waited on from its issue (within
    :data:`SYNC_WAIT_TOLERANCE_NS`, and before the next op's issue) blocked over [issue,
    max(wait end, end)]; one waited on later is async, blocked over its wait; one never waited
    on (``wait_ns`` 0) is async, waited for at its completion (``t1``, the step's end, when it
    has none). Without one: an op with no completion is async, waited for at ``t1``; an op
    whose next op was issued before it completed is async, waited for at its completion; any
    other op blocked over [issue, end].
    """
    m = len(issue)
    blocked: list[tuple[int, int]] = []
    wait_at: list[int | None] = [None] * m  # when an async op was waited for (None: blocking)
    for k in range(m):
        nxt = issue[k + 1] if k + 1 < m else None
        if wait_ns[k] is not None:  # the capture's waits
            if wait_ns[k] > 0 and w_start[k] is not None and w_end[k] is not None:
                ws, we = int(w_start[k]), int(w_end[k])
                if ws - issue[k] > SYNC_WAIT_TOLERANCE_NS or (nxt is not None and nxt < ws):
                    wait_at[k] = ws
                    blocked.append((ws, we))
                else:
                    blocked.append((issue[k], max(we, int(end[k] or we))))
            else:  # never blocked on: done before it was waited for
                wait_at[k] = int(end[k]) if end[k] is not None else t1
        elif end[k] is None:
            wait_at[k] = t1
        elif nxt is not None and nxt < int(end[k]):
            wait_at[k] = int(end[k])
        else:
            blocked.append((issue[k], int(end[k])))
    return blocked, wait_at


def step_blocked_ns(ops: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank and training step (``steps``' phase ``step`` rows with step >= 0): ``rank``,
    ``step``, ``t_start_ns``, ``t_end_ns`` and ``blocked_ns``, the length of the union of the
    rank's :func:`blocked_intervals` on the ops of that step, clipped to the step (its compute
    time is the step's length minus it)."""
    cols = ["rank", "step", "t_start_ns", "t_end_ns"]
    if steps.empty or "phase" not in steps.columns:
        return pd.DataFrame(columns=[*cols, "blocked_ns"], dtype="int64")
    base = steps[(steps["phase"] == "step") & (steps["step"] >= 0)][cols].astype("int64")
    base = base.reset_index(drop=True)
    if ops.empty or "t_end_ns" not in ops.columns:
        return base.assign(blocked_ns=np.zeros(len(base), dtype="int64"))
    lab = blocked_intervals(ops[ops["step"] >= 0])
    lab = lab[lab["t_block_start_ns"].notna()]
    mine = lab[["rank", "step", "t_block_start_ns", "t_block_end_ns"]].merge(
        base.reset_index(names="gid"), on=["rank", "step"], how="inner"
    )
    start = np.maximum(mine["t_block_start_ns"].to_numpy("int64"), mine["t_start_ns"].to_numpy())
    end = np.minimum(mine["t_block_end_ns"].to_numpy("int64"), mine["t_end_ns"].to_numpy())
    blocked = union_lengths(mine["gid"].to_numpy("int64"), start, end, len(base))
    return base.assign(blocked_ns=blocked)


# ------------------------------------------------------------------------ unions of intervals


def union(
    intervals: Sequence[tuple[int, int]], lo: int | None = None, hi: int | None = None
) -> list[tuple[int, int]]:
    """The union of [start, end) intervals, clipped to [lo, hi] where given: sorted, disjoint,
    touching intervals merged, empty ones dropped."""
    out: list[list[int]] = []
    clipped = (
        (a if lo is None else max(a, lo), b if hi is None else min(b, hi)) for a, b in intervals
    )
    for a, b in sorted(clipped):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def union_lengths(group: np.ndarray, start: np.ndarray, end: np.ndarray, n: int) -> np.ndarray:
    """Total length of the union of the intervals [start, end) of each group id in 0..n-1
    (int64 ns, vectorised: sort, running max of the ends, one segment per gap)."""
    totals = np.zeros(n, dtype="int64")
    keep = end > start
    group, start, end = group[keep], start[keep], end[keep]
    if len(group) == 0:
        return totals
    order = np.lexsort((start, group))
    group, start, end = group[order], start[order], end[order]
    running = pd.Series(end).groupby(group).cummax().to_numpy("int64")
    new = np.ones(len(group), dtype=bool)
    new[1:] = (group[1:] != group[:-1]) | (start[1:] > running[:-1])
    heads = np.flatnonzero(new)
    seg_end = np.maximum.reduceat(end, heads)
    np.add.at(totals, group[heads], seg_end - start[heads])
    return totals


def free_ns(lo: int, hi: int, blocked: Sequence[tuple[int, int]]) -> float:
    """Length of [lo, hi] outside the (disjoint: :func:`union`) blocked intervals."""
    if hi <= lo:
        return 0.0
    busy = sum(max(0, min(b, hi) - max(a, lo)) for a, b in blocked)
    return float(hi - lo - busy)


# ------------------------------------------------------------------------ step phases


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


# ------------------------------------------------------------------------ compute


@dataclass(frozen=True)
class ComputeSpan:
    """Compute of one rank: an unblocked stretch inside one step phase."""

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


def _unblocked(
    span: ComputeSpan, blocked: list[tuple[int, int]], blocked_ends: list[int]
) -> Iterator[ComputeSpan]:
    """The pieces of ``span`` outside the (disjoint, sorted: :func:`union`) blocked intervals."""
    cursor = span.start_ns
    for a, b in blocked[bisect.bisect_right(blocked_ends, cursor) :]:
        if a >= span.end_ns:
            break
        if a > cursor:
            yield ComputeSpan(cursor, a, span.step, span.phase)
        cursor = max(cursor, b)
    if span.end_ns > cursor:
        yield ComputeSpan(cursor, span.end_ns, span.step, span.phase)


def compute_spans(ops: pd.DataFrame, steps: pd.DataFrame, rank: int) -> list[ComputeSpan]:
    """The compute of ``rank`` (the module docstring's definition) as spans inside its step
    phases (:func:`phase_intervals`), in time order: each phase minus the union of the rank's
    :func:`blocked_intervals`."""
    intervals = phase_intervals(steps, rank)
    mine = blocked_intervals(ops[ops["rank"] == rank]) if len(ops) else None
    blocked: list[tuple[int, int]] = []
    if mine is not None:
        mine = mine[mine["t_block_start_ns"].notna()]
        blocked = union(
            list(
                zip(
                    mine["t_block_start_ns"].tolist(),
                    mine["t_block_end_ns"].tolist(),
                    strict=True,
                )
            )
        )
    blocked_ends = [b for _, b in blocked]
    return [
        piece
        for iv in intervals
        for piece in _unblocked(
            ComputeSpan(iv.start_ns, iv.end_ns, iv.step, iv.phase),
            blocked,
            blocked_ends,
        )
    ]


def _record_blocks(records: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The union of the records' blocked intervals: ``t_block_start_ns``..``t_block_end_ns``
    where the records carry them (:func:`commscope.export.records.op_records`), else every op
    with a completion over [issue, end] (the rule for ops without a recorded wait)."""
    spans = []
    for rec in records:
        if "t_block_start_ns" in rec:
            start, end = rec["t_block_start_ns"], rec["t_block_end_ns"]
        else:
            start, end = rec["t_issue_ns"], rec["t_end_ns"]
        if start is not None and end is not None:
            spans.append((int(start), int(end)))
    return union(spans)


def rank_timeline(
    records: list[dict[str, Any]], intervals: list[Interval]
) -> Iterator[tuple[str, Any]]:
    """One rank's ``("compute", ComputeSpan)`` and ``("op", record)`` items in time order, with
    compute as the module docstring defines it: before each op, the time since the previous
    op's issue inside the phases and outside the blocked intervals; after the last op, the
    same up to the end of the last phase.

    ``records``: the rank's ops as dicts in issue order (``t_issue_ns``, ``t_end_ns`` None when
    unknown, the blocked interval where known; :func:`commscope.export.records.op_records`);
    ``intervals``: its :func:`phase_intervals`."""
    ends = [iv.end_ns for iv in intervals]
    blocked = _record_blocks(records)
    blocked_ends = [b for _, b in blocked]

    def compute(lo: int, hi: int) -> Iterator[tuple[str, Any]]:
        for span in _clip(intervals, ends, lo, hi):
            yield from (("compute", piece) for piece in _unblocked(span, blocked, blocked_ends))

    cursor = -(2**63)  # the latest issue so far
    for rec in records:
        issue = rec["t_issue_ns"]
        yield from compute(cursor, issue)
        yield "op", rec
        cursor = max(cursor, issue)
    if intervals:
        yield from compute(cursor, intervals[-1].end_ns)
