"""The critical path of one cell's steady step and its measured pipeline bubble
(docs/sync.md), from the ops labelled by :mod:`commscope.metrics.sync_labels`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from commscope.cell.timeline import union_lengths
from commscope.contracts import BLOCKING_COLUMN, GROUP_KIND_COLUMN
from commscope.metrics.sync_labels import (
    as_plan,
    label_ops,
    led_by_params,
    ops_world,
    phase_rows,
    warmup_flags,
)
from commscope.spec.plan import ParallelPlan
from commscope.units import NS_PER_S

CRITICAL_PATH_COLUMNS = [
    "step",
    "order",
    "rank",
    "segment",
    "op",
    "group_kind",
    "t_start_ns",
    "t_end_ns",
    "duration_s",
]
BUBBLE_COLUMNS = [
    "rank",
    "stage",
    "step",
    "step_s",
    "fwd_bwd_s",
    "bubble_s",
    "bubble_frac_step",
    "bubble_frac_fwd_bwd",
    "bubble_analytic",
    "pp",
    "microbatches",
    "stages_per_rank",
    "pp_schedule",
    "warmup",
]


def steady_step(steps: pd.DataFrame, warmup_steps: int = 0) -> int | None:
    """The median measured step: among steps >= ``warmup_steps`` (all steps >= 0 when none),
    the one whose duration (first rank in to last rank out) is nearest the median duration,
    the earliest on a tie; None without steps."""
    rows = phase_rows(steps)
    if rows.empty:
        return None
    per = rows.groupby("step").agg(t0=("t_start_ns", "min"), t1=("t_end_ns", "max"))
    measured = per[per.index >= warmup_steps]
    if measured.empty:
        measured = per
    duration = measured["t1"] - measured["t0"]
    gap = (duration - duration.median()).abs()
    return int(gap[gap == gap.min()].index.min())


def critical_path(
    ops: pd.DataFrame,
    steps: pd.DataFrame,
    plan: ParallelPlan | Mapping[str, Any] | None = None,
    warmup_steps: int = 0,
    step: int | None = None,
    labelled: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The chain of compute and communication that sets the end of one step.

    ``step`` defaults to :func:`steady_step`. The walk starts at the rank that finishes the
    step last, at its step end, and goes back in time on that rank: the latest (blocking,
    completed, not yet visited) op of the step ending at or before the current time is the
    next communication segment, the time between its end and the current time a compute
    segment. The op's segment starts when its last member arrived (the latest issue over the
    collective's members or the send/recv pair); when that member is another rank, the rank
    waited for it, so the walk jumps to that rank at its issue time. It ends at the current
    rank's step start (a last compute segment). ``order`` numbers the segments from the
    earliest. Columns: cell params, :data:`CRITICAL_PATH_COLUMNS` (``op`` and ``group_kind``
    empty on compute segments).
    """
    lab = labelled if labelled is not None else label_ops(ops, plan, ops_world(ops, steps))
    step = steady_step(steps, warmup_steps) if step is None else step
    bounds = phase_rows(steps)
    bounds = bounds[bounds["step"] == step].set_index("rank") if step is not None else bounds
    if step is None or bounds.empty:
        return led_by_params(ops, pd.DataFrame(), CRITICAL_PATH_COLUMNS)
    walk = lab[
        (lab["step"] == step)
        & lab["t_end_ns"].notna()
        & lab[BLOCKING_COLUMN]
        & lab["rank"].isin(bounds.index)
    ]
    rank = walk["rank"].to_numpy("int64")
    issue = walk["t_issue_ns"].to_numpy("int64")
    end = walk["t_end_ns"].to_numpy("int64")
    last_issue = walk["t_last_issue_ns"].to_numpy("int64")
    last_rank = walk["last_rank"].to_numpy("int64")
    instance = walk["instance"].to_numpy("int64")
    op = walk["op"].to_numpy(str)
    kind = walk[GROUP_KIND_COLUMN].to_numpy(str)
    row_of = {(int(i), int(r)): k for k, (i, r) in enumerate(zip(instance, rank, strict=True))}
    by_rank = {}
    for r in np.unique(rank):
        rows = np.flatnonzero(rank == r)
        rows = rows[np.argsort(end[rows], kind="stable")]
        by_rank[int(r)] = (end[rows], rows)
    visited = np.zeros(len(walk), dtype=bool)
    cur = int(bounds["t_end_ns"].idxmax())
    t = int(bounds.loc[cur, "t_end_ns"])
    segments: list[tuple[int, str, str, str, int, int]] = []
    while True:
        t_first = int(bounds.loc[cur, "t_start_ns"])
        ends, rows = by_rank.get(cur, (np.empty(0, "int64"), np.empty(0, "int64")))
        k = int(np.searchsorted(ends, t, side="right")) - 1
        while k >= 0 and visited[rows[k]]:
            k -= 1
        if k < 0 or ends[k] < t_first:
            if t > t_first:
                segments.append((cur, "compute", "", "", t_first, t))
            break
        i = int(rows[k])
        visited[i] = True
        if end[i] < t:
            segments.append((cur, "compute", "", "", int(end[i]), t))
        arrived = min(max(int(issue[i]), int(last_issue[i])), int(end[i]))
        segments.append((cur, "comm", op[i], kind[i], arrived, int(end[i])))
        if issue[i] < last_issue[i] and last_rank[i] != cur and int(last_rank[i]) in bounds.index:
            cur = int(last_rank[i])
            j = row_of.get((int(instance[i]), cur))
            if j is not None:
                visited[j] = True
        t = arrived
    segments.reverse()
    out = pd.DataFrame(
        segments, columns=["rank", "segment", "op", GROUP_KIND_COLUMN, "t_start_ns", "t_end_ns"]
    )
    out.insert(0, "step", step)
    out.insert(1, "order", np.arange(len(out)))
    out["duration_s"] = (out["t_end_ns"] - out["t_start_ns"]) / NS_PER_S
    return led_by_params(ops, out, CRITICAL_PATH_COLUMNS)


def bubble_analytic(plan: ParallelPlan | Mapping[str, Any] | None, world: int = 0) -> float:
    """(p−1)/v / (m + (p−1)/v): GPipe's and 1F1B's (p−1)/(p−1+m) for p pipeline ranks and m
    microbatches, the interleaved schedule's bubble shrunk by v stages per rank; 0 without a
    pipeline, NaN without a plan."""
    resolved = as_plan(plan, world)
    if resolved is None:
        return math.nan
    if resolved.pp <= 1:
        return 0.0
    b = (resolved.pp - 1) / max(resolved.stages_per_rank, 1)
    return b / (resolved.microbatches + b)


def pipeline_bubble(
    ops: pd.DataFrame,
    steps: pd.DataFrame,
    plan: ParallelPlan | Mapping[str, Any] | None,
    warmup_steps: int = 0,
    labelled: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The measured pipeline bubble per pipeline rank and training step (empty unless pp > 1).

    Inside ``fwd_bwd`` a rank either computes, moves data, or waits for a neighbour stage: its
    blocking recv on the PP group was issued before the peer issued the matching send. That
    wait, [recv issue, min(send issue, recv end)], is the bubble; the rest of the recv (from the
    send's issue to its end) is the rank's own communication. ``bubble_s`` is the union of the
    waits clipped to the rank's ``fwd_bwd`` phase; ``bubble_frac_step`` = bubble_s / step_s
    (the rank's own step), ``bubble_frac_fwd_bwd`` = bubble_s / fwd_bwd_s, the one
    ``bubble_analytic`` ((p−1)/(p−1+m), :func:`bubble_analytic`) describes. ``stage`` is the
    rank's pipeline coordinate. Columns: cell params, :data:`BUBBLE_COLUMNS`.
    """
    world = ops_world(ops, steps)
    resolved = as_plan(plan, world)
    if resolved is None or resolved.pp <= 1:
        return led_by_params(ops, pd.DataFrame(), BUBBLE_COLUMNS)
    lab = labelled if labelled is not None else label_ops(ops, resolved, world)
    step_rows = phase_rows(steps)
    fb = phase_rows(steps, "fwd_bwd").rename(columns={"t_start_ns": "fb0", "t_end_ns": "fb1"})
    base = step_rows.merge(fb, on=["rank", "step"], how="inner").reset_index(drop=True)
    if base.empty:
        return led_by_params(ops, pd.DataFrame(), BUBBLE_COLUMNS)
    sends = lab[lab["op"].eq("send")][["instance", "t_issue_ns"]].rename(
        columns={"t_issue_ns": "t_send_ns"}
    )
    # Every completed recv from its issue, as before the waits were recorded: the pipelining
    # schedule posts recvs early and gloo's sends block too, so the recv waits alone are not
    # the bubble (docs/sync.md).
    recvs = lab[
        lab["op"].eq("recv")
        & lab[GROUP_KIND_COLUMN].eq("pp")
        & lab["t_end_ns"].notna()
        & lab["flagged"]
        & (lab["step"] >= 0)
    ]
    recvs = recvs[["instance", "rank", "step", "t_issue_ns"]].assign(
        t_end=recvs["t_end_ns"].to_numpy("int64")
    )
    waits = recvs.merge(sends, on="instance", how="inner")
    waits = waits.merge(base.reset_index(names="gid"), on=["rank", "step"], how="inner")
    start = np.maximum(waits["t_issue_ns"].to_numpy("int64"), waits["fb0"].to_numpy("int64"))
    stop = np.minimum(
        np.minimum(waits["t_send_ns"].to_numpy("int64"), waits["t_end"].to_numpy("int64")),
        waits["fb1"].to_numpy("int64"),
    )
    bubble = union_lengths(waits["gid"].to_numpy("int64"), start, stop, len(base))
    step_ns = (base["t_end_ns"] - base["t_start_ns"]).to_numpy("int64")
    fb_ns = (base["fb1"] - base["fb0"]).to_numpy("int64")
    nan = np.full(len(base), np.nan)
    out = base[["rank", "step"]].assign(
        stage=[resolved.coords(int(r))["pp"] for r in base["rank"]],
        step_s=step_ns / NS_PER_S,
        fwd_bwd_s=fb_ns / NS_PER_S,
        bubble_s=bubble / NS_PER_S,
        bubble_frac_step=np.divide(bubble, step_ns, out=nan.copy(), where=step_ns > 0),
        bubble_frac_fwd_bwd=np.divide(bubble, fb_ns, out=nan.copy(), where=fb_ns > 0),
        bubble_analytic=bubble_analytic(resolved, world),
        pp=resolved.pp,
        microbatches=resolved.microbatches,
        stages_per_rank=resolved.stages_per_rank,
        pp_schedule=resolved.pp_schedule,
        warmup=warmup_flags(base["step"], warmup_steps),
    )
    out = out.sort_values(["step", "rank"], kind="stable")
    return led_by_params(ops, out, BUBBLE_COLUMNS)
