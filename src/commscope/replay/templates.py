"""Timing -> step templates for the replay program: per rank and source step, its rows in
issue order with the compute before and after their waits and which ops are async
(:mod:`commscope.replay.program`'s Compute and Async; the blocked time and the async rule come
from :mod:`commscope.cell.timeline`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pandas as pd

from commscope.cell.timeline import free_ns, rank_step_waits, union
from commscope.contracts import P2P_OPS
from commscope.replay.normalize import DROP

END = -1  # the step_end entry of a step template


@dataclass
class Entry:
    """One row of a step template: a source op (``row``) or the step's end (``row == END``),
    the compute before and after its waits (ns, unscaled), whether the op is async, and the
    template positions of the async ops it waits for."""

    row: int
    pre: float = 0.0
    post: float = 0.0
    async_op: bool = False
    waits: list[int] = field(default_factory=list)


def step_templates(
    kept: pd.DataFrame,
    order: dict[int, list[int]],
    steps: pd.DataFrame | None,
    source_steps: list[int],
    notes: list[str],
) -> tuple[bool, dict[tuple[int, int], list[Entry]]]:
    """Per (rank, source step, -1 for the set-up): the step's entries in issue order, the
    step's end last; and whether compute came from recorded times."""
    windows: dict[tuple[int, int], tuple[int, int]] = {}
    if steps is not None and not steps.empty:
        st = steps[steps["phase"] == "step"] if "phase" in steps.columns else steps
        for rank, step, t0, t1 in zip(
            st["rank"], st["step"], st["t_start_ns"], st["t_end_ns"], strict=True
        ):
            if pd.notna(t0) and pd.notna(t1):
                windows[(int(rank), int(step))] = (int(t0), int(t1))
    sstep = kept["sstep"]
    templates: dict[tuple[int, int], list[Entry]] = {}
    timed_any = False
    untimed = 0
    for rank, ids in order.items():
        ids = [i for i in ids if i in sstep.index and sstep[i] != DROP]
        by_step: dict[int, list[int]] = defaultdict(list)
        for i in ids:
            by_step[int(sstep[i])].append(i)
        if by_step.get(-1):
            templates[(rank, -1)] = _untimed(kept, by_step[-1], end=False)
        for s in source_steps:
            rows = by_step.get(s, [])
            timing = _timing(kept, rows, windows.get((rank, s)))
            if timing is None:
                templates[(rank, s)] = _untimed(kept, rows, end=True)
                untimed += bool(rows)
            else:
                templates[(rank, s)] = _timed(kept, rows, *timing)
                timed_any = True
    if not timed_any:
        notes.append(
            "the source records no op times: no compute between ops (each step is its "
            "communication back to back), ops blocking except batched send/recv"
        )
    elif untimed:
        notes.append(f"{untimed} rank-steps without op times replayed with no compute")
    if any(s == -1 for _, s in templates):
        notes.append("the set-up ops are replayed once, without compute")
    return timed_any, templates


def _timing(
    kept: pd.DataFrame, rows: list[int], window: tuple[int, int] | None
) -> tuple[int, int] | None:
    """The step's window [t0, t1] when its ops have issue times (None: untimed)."""
    if rows and (kept.loc[rows, "t_issue_ns"] < 0).any():
        return None
    if window is not None:
        return window
    if not rows:
        return None
    issue = kept.loc[rows, "t_issue_ns"]
    ends = [e for e in kept.loc[rows, "t_end_ns"].tolist() if e is not None]
    waits = [e for e in kept.loc[rows, "t_wait_end_ns"].tolist() if e is not None]
    return int(issue.min()), int(max([int(issue.max()), *ends, *waits]))


def _untimed(kept: pd.DataFrame, rows: list[int], end: bool) -> list[Entry]:
    """No times: blocking ops, except a run of consecutive send/recv, issued async and waited
    before the next other entry (batched P2P, as pipelining issues it)."""
    entries = [Entry(i) for i in rows]
    if end:
        entries.append(Entry(END))
    pending: list[int] = []
    for pos, entry in enumerate(entries):
        is_p2p = entry.row != END and kept.at[entry.row, "op"] in P2P_OPS
        if not is_p2p and pending:
            entry.waits = pending
            pending = []
        if is_p2p:
            entry.async_op = True
            pending.append(pos)
    if pending:  # a set-up ending in P2P: wait for them on the last one's heels
        last = entries[pending[-1]]
        last.async_op = False
        pending.pop()
        last.waits = pending
    return entries


def _timed(kept: pd.DataFrame, rows: list[int], t0: int, t1: int) -> list[Entry]:
    """The step's entries from recorded times (the module docstring's Compute and Async)."""
    m = len(rows)
    issue = [int(v) for v in kept.loc[rows, "t_issue_ns"]]
    end = kept.loc[rows, "t_end_ns"].tolist()
    wait_ns = kept.loc[rows, "wait_ns"].tolist()
    w_start = kept.loc[rows, "t_wait_start_ns"].tolist()
    w_end = kept.loc[rows, "t_wait_end_ns"].tolist()
    blocked, wait_at = rank_step_waits(issue, end, wait_ns, w_start, w_end, t1)
    entries = [Entry(i, async_op=wait_at[k] is not None) for k, i in enumerate(rows)]
    entries.append(Entry(END))
    for k in range(m):
        if wait_at[k] is None:
            continue
        j = next((j for j in range(k + 1, m) if issue[j] >= wait_at[k]), m)
        entries[j].waits.append(k)
    merged = union(blocked, t0, t1)
    for j, entry in enumerate(entries):
        lo = t0 if j == 0 else issue[j - 1]
        hi = issue[j] if j < m else t1
        lo, hi = min(max(lo, t0), t1), min(max(hi, t0), t1)
        hi = max(hi, lo)
        split = min((wait_at[k] for k in entry.waits), default=hi)
        split = min(max(split, lo), hi)
        entry.pre = free_ns(lo, split, merged)
        entry.post = free_ns(split, hi, merged)
    return entries
