"""Synchronization structure per step, from one cell's ``ops`` and ``steps`` tables.

Definitions, units and assumptions: docs/sync.md. Every function takes the tables of **one**
cell (its plan is one cell's) and returns a tidy DataFrame led by the cell's parameter columns
(whichever ``ops`` carries), so the tables of many cells aggregate by concatenation.

What the capture knows (:mod:`commscope.workload.capture`, docs/traces.md): per op its issue
time (``t_issue_ns``), its completion (``t_end_ns``) and the training thread's wait on it
(``t_wait_start_ns``, ``t_wait_end_ns``, ``wait_ns``: when it blocked on the op, 0 if it never
did). A rank is blocked in communication over the union of its wait intervals: that is its
exposed communication, exact for ops with a recorded wait. An op whose wait is unknown (traces
from before the wait columns, imported traces, CUDA ops) counts over its whole [issue, end], an
upper bound, unless the ops table has a boolean :data:`BLOCKING_COLUMN` (True where the issuer
waited on the op over its whole interval); ``exposed_source`` says which rule a rank's step
took. Compute is step time outside the blocked intervals.

Tables (:data:`SYNC_TABLES`, built together by :func:`sync_tables`):

* :func:`sync_counts` ops, instances and bytes per step, group kind and op class;
* :func:`sync_points` every collective instance: who arrived first and last, the skew;
* :func:`exposed_comm` per rank and step: communication, exposed communication, its ratio;
* :func:`critical_path` the chain of compute and communication that ends the steady step;
* :func:`pipeline_bubble` per pipeline rank and step: the measured bubble vs (p-1)/(p-1+m);
* :func:`sync_summary` one row per cell with the headline numbers of all of them.

The ops are labelled once (:mod:`commscope.metrics.sync_labels`); the critical path and the
bubble live in :mod:`commscope.metrics.sync_path`; this module builds the other tables and
re-exports every table function. Everything that scales with the number of ops is vectorised (a
cell can hold 10**6 ops); the critical-path walk is a loop over the ops of one step on the path
only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from commscope.cell.timeline import union_lengths
from commscope.contracts import BLOCKING_COLUMN, GROUP_KIND_COLUMN, WAIT_COLUMN
from commscope.contracts import SYNC_TABLES as SYNC_TABLES  # this module's tables, re-exported
from commscope.metrics.sync_labels import (
    OP_CLASSES,
    group_kinds,
    label_ops,
    led_by_params,
    op_class,
    ops_world,
    phase_rows,
    warmup_flags,
)
from commscope.metrics.sync_path import (
    BUBBLE_COLUMNS,
    CRITICAL_PATH_COLUMNS,
    bubble_analytic,
    critical_path,
    pipeline_bubble,
    steady_step,
)
from commscope.spec.plan import ParallelPlan
from commscope.units import NS_PER_S

__all__ = [
    "BLOCKING_COLUMN",
    "BUBBLE_COLUMNS",
    "CRITICAL_PATH_COLUMNS",
    "EXPOSED_COLUMNS",
    "OP_CLASSES",
    "SYNC_COUNT_COLUMNS",
    "SYNC_POINT_COLUMNS",
    "SYNC_SUMMARY_COLUMNS",
    "SYNC_TABLES",
    "bubble_analytic",
    "critical_path",
    "exposed_comm",
    "group_kinds",
    "op_class",
    "pipeline_bubble",
    "steady_step",
    "sync_counts",
    "sync_points",
    "sync_summary",
    "sync_tables",
]

# exposed_source: which rule gave a rank's exposed time (docs/sync.md).
SOURCE_WAITS, SOURCE_BLOCKING, SOURCE_UPPER = "waits", "blocking", "upper_bound"


SYNC_COUNT_COLUMNS = ["step", "group_kind", "op_class", "n_ops", "n_instances", "bytes"]
SYNC_POINT_COLUMNS = [
    "step",
    "phase",
    "op",
    "group_kind",
    "group_ranks",
    "group_size",
    "seq",
    "n_ranks",
    "world",
    "first_rank",
    "last_rank",
    "t_first_issue_ns",
    "t_last_issue_ns",
    "t_end_ns",
    "skew_s",
    "warmup",
]
EXPOSED_COLUMNS = [
    "rank",
    "step",
    "step_s",
    "comm_s",
    "exposed_comm_s",
    "compute_s",
    "comm_ratio",
    "exposed_source",
    "blocking_recorded",
    "warmup",
]
SYNC_SUMMARY_COLUMNS = [
    "steady_step",
    "measured_steps",
    "collectives_per_step",
    "p2p_per_step",
    "barriers_per_step",
    "world_sync_points_per_step",
    "sync_skew_mean_s",
    "sync_skew_max_s",
    "comm_ratio_median",
    "comm_ratio_max",
    "comm_inflight_s",
    "comm_blocked_s",
    "comm_overlap",
    "exposed_source",
    "blocking_recorded",
    "critical_path_s",
    "critical_compute_s",
    "critical_comm_s",
    "critical_comm_share",
    "critical_rank_switches",
    "critical_ops",
    "bubble_measured_fwd_bwd",
    "bubble_measured_step",
    "bubble_analytic",
    "bubble_predicted",
]

_COLLECTIVE_CLASSES = ("collective", "barrier")


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def sync_counts(
    ops: pd.DataFrame,
    plan: ParallelPlan | Mapping[str, Any] | None = None,
    world: int = 0,
    labelled: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Ops per step (``-1``: set-up and teardown), group kind and op class.

    ``n_ops`` counts rows (one per op per rank); ``n_instances`` counts each collective once
    over its members and each send/recv pair once; ``bytes`` sums the framework bytes of the
    rows (docs/traces.md ``bytes``). Columns: cell params, :data:`SYNC_COUNT_COLUMNS`.
    """
    lab = labelled if labelled is not None else label_ops(ops, plan, world or ops_world(ops))
    if lab.empty:
        return led_by_params(ops, pd.DataFrame(), SYNC_COUNT_COLUMNS)
    out = (
        lab.groupby(["step", GROUP_KIND_COLUMN, "op_class"], sort=True)
        .agg(
            n_ops=("op", "size"),
            n_instances=("instance", "nunique"),
            bytes=("bytes", "sum"),
        )
        .reset_index()
    )
    return led_by_params(ops, out, SYNC_COUNT_COLUMNS)


def sync_points(
    ops: pd.DataFrame,
    plan: ParallelPlan | Mapping[str, Any] | None = None,
    warmup_steps: int = 0,
    world: int = 0,
    labelled: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per collective instance (barriers included) in a training step.

    Every member of a collective must arrive before any can finish, so the first to issue
    waits for the last: ``skew_s`` = (latest − earliest issue time over the members), the wait
    of the fastest rank when it blocks on the op (an upper bound of it when the op is async).
    ``world`` marks the blocking points where every rank of the cell takes part (the group
    holds all ``world`` ranks); the others synchronise one group of a dimension (``group_kind``).
    Columns: cell params, :data:`SYNC_POINT_COLUMNS`.
    """
    world = world or ops_world(ops)
    lab = labelled if labelled is not None else label_ops(ops, plan, world)
    rows = lab[lab["op_class"].isin(_COLLECTIVE_CLASSES) & (lab["step"] >= 0)]
    if rows.empty:
        return led_by_params(ops, pd.DataFrame(), SYNC_POINT_COLUMNS)
    first_row = rows.groupby("instance", sort=False)["t_issue_ns"].idxmin()
    ends = rows["t_end_ns"].astype("Int64").groupby(rows["instance"], sort=False).max()
    out = rows.loc[first_row.to_numpy()].reset_index(drop=True)
    out = out.assign(
        first_rank=out["rank"].to_numpy("int64"),
        n_ranks=out["n_members"],
        t_first_issue_ns=out["t_first_issue_ns"],
        t_end_ns=ends.reindex(out["instance"]).astype("Int64").to_numpy(),
        skew_s=(out["t_last_issue_ns"] - out["t_first_issue_ns"]) / NS_PER_S,
        world=out["group_size"].eq(world).to_numpy(),
        warmup=warmup_flags(out["step"], warmup_steps),
    )
    out = out.sort_values(["t_first_issue_ns", "instance"], kind="stable")
    return led_by_params(ops, out, SYNC_POINT_COLUMNS)


def exposed_comm(
    ops: pd.DataFrame,
    steps: pd.DataFrame,
    warmup_steps: int = 0,
    labelled: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per rank and training step: time inside communication ops and the exposed part.

    ``comm_s``: length of the union of every completed op's [t_issue_ns, t_end_ns], clipped to
    the rank's step (time with communication in flight; the upper bound of the exposed time).
    ``exposed_comm_s``: length of the union of the intervals the rank was blocked on its ops
    (:func:`~commscope.cell.timeline.blocked_intervals`: the recorded waits; an op without one
    over its whole interval), clipped to the step. ``exposed_source`` is ``waits`` when every
    op of the rank's step had a recorded wait, else ``blocking`` (the ops table's
    :data:`BLOCKING_COLUMN` decided for the others) or ``upper_bound``. ``compute_s`` = step_s −
    exposed_comm_s; ``comm_ratio`` = exposed_comm_s / step_s. Columns: cell params,
    :data:`EXPOSED_COLUMNS`.
    """
    lab = labelled if labelled is not None else label_ops(ops, None, ops_world(ops, steps))
    recorded = BLOCKING_COLUMN in ops.columns
    base = phase_rows(steps)
    if base.empty:
        return led_by_params(ops, pd.DataFrame(), EXPOSED_COLUMNS)
    base = base.reset_index(drop=True)
    gid = base.reset_index(names="gid")
    n = len(base)
    mine = lab[lab["step"] >= 0].merge(gid, on=["rank", "step"], how="inner")
    s0 = mine["t_start_ns"].to_numpy("int64")
    s1 = mine["t_end_ns_y"].to_numpy("int64")
    g = mine["gid"].to_numpy("int64")
    done = mine["t_end_ns_x"].notna().to_numpy(bool)
    issue = mine["t_issue_ns"].to_numpy("int64")
    end = mine["t_end_ns_x"].fillna(0).to_numpy("int64")
    comm = union_lengths(
        g[done], np.maximum(issue[done], s0[done]), np.minimum(end[done], s1[done]), n
    )
    blocked = mine["t_block_start_ns"].notna().to_numpy(bool)
    b0 = mine["t_block_start_ns"].fillna(0).to_numpy("int64")[blocked]
    b1 = mine["t_block_end_ns"].fillna(0).to_numpy("int64")[blocked]
    exposed = union_lengths(g[blocked], np.maximum(b0, s0[blocked]), np.minimum(b1, s1[blocked]), n)
    # A step is exact when every op in it had its wait recorded (a step without ops too, when
    # the table records waits at all).
    unknown = np.zeros(n, dtype=bool)
    unknown[g[~mine["wait_known"].to_numpy(bool)]] = True
    if WAIT_COLUMN not in ops.columns:
        unknown[:] = True
    fallback = SOURCE_BLOCKING if recorded else SOURCE_UPPER
    step_ns = (base["t_end_ns"] - base["t_start_ns"]).to_numpy("int64")
    out = base[["rank", "step"]].assign(
        step_s=step_ns / NS_PER_S,
        comm_s=comm / NS_PER_S,
        exposed_comm_s=exposed / NS_PER_S,
        compute_s=(step_ns - exposed) / NS_PER_S,
        comm_ratio=np.divide(exposed, step_ns, out=np.full(n, np.nan), where=step_ns > 0),
        exposed_source=np.where(unknown, fallback, SOURCE_WAITS),
        blocking_recorded=recorded,
        warmup=warmup_flags(base["step"], warmup_steps),
    )
    out = out.sort_values(["step", "rank"], kind="stable")
    return led_by_params(ops, out, EXPOSED_COLUMNS)


def _ops_on_path(path: pd.DataFrame) -> str:
    comm = path[path["segment"] == "comm"]
    if comm.empty:
        return ""
    counts = (comm["op"] + "/" + comm[GROUP_KIND_COLUMN]).value_counts()
    counts = counts.sort_index().sort_values(ascending=False, kind="stable")
    return ", ".join(f"{name} x{n}" for name, n in counts.items())


def _one_source(sources: pd.Series) -> str:
    """The rule every rank's step took (:func:`exposed_comm`), ``mixed`` when they differ, ``''``
    without steps."""
    values = sorted(set(sources))
    return values[0] if len(values) == 1 else ("mixed" if values else "")


def _overlap(exposed: pd.DataFrame) -> float:
    """1 - (time blocked on communication) / (time communication was in flight), summed over
    ``exposed``'s rank-steps, in [0, 1]; NaN when nothing was in flight."""
    inflight = float(exposed["comm_s"].sum()) if len(exposed) else 0.0
    if not inflight > 0:
        return math.nan
    return min(1.0, max(0.0, 1.0 - float(exposed["exposed_comm_s"].sum()) / inflight))


def sync_summary(
    ops: pd.DataFrame,
    tables: Mapping[str, pd.DataFrame],
    plan: ParallelPlan | Mapping[str, Any] | None = None,
    world: int = 0,
    predicted_bubble_ratio: float | None = None,
) -> pd.DataFrame:
    """One row per cell from the other sync tables (``tables``, keyed as :data:`SYNC_TABLES`).

    Per measured step (steps >= warmup, all when none are): the mean number of collective,
    P2P and barrier instances and of world-wide sync points, and their skew (mean, max);
    the median and the largest per-rank comm ratio; the measured overlap (docs/analysis.md
    *Overlap*): ``comm_inflight_s`` and ``comm_blocked_s``, the mean per rank and measured step
    of :func:`exposed_comm`'s ``comm_s`` (communication in flight) and ``exposed_comm_s`` (the
    rank blocked on it), and ``comm_overlap`` = 1 - blocked / in flight over all of them (the
    share of its communication the rank's compute hid; clipped to [0, 1], a blocked interval
    being stamped a few µs past its op's end; NaN without communication); the steady step's
    critical path (length,
    compute, communication, the comm share, rank switches, the ops on it); the measured bubble
    (mean over pipeline ranks and measured steps, of fwd_bwd and of the step), the analytic
    one and ``predicted_bubble_ratio`` as given (the predictor's ``predicted_bubble_ratio``,
    NaN when not given). Columns: cell params, :data:`SYNC_SUMMARY_COLUMNS`.
    """
    exposed = tables["exposed_comm"]
    points = tables["sync_points"]
    path = tables["critical_path"]
    bubble = tables["pipeline_bubble"]
    counts = tables["sync_counts"]
    measured = sorted(set(exposed.loc[~exposed["warmup"].astype(bool), "step"]))
    if not measured:
        measured = sorted(set(exposed["step"]))
    n = len(measured)

    def per_step(op_cls: str) -> float:
        rows = counts[counts["step"].isin(measured) & counts["op_class"].eq(op_cls)]
        return float(rows["n_instances"].sum()) / n if n else math.nan

    pts = points[points["step"].isin(measured)]
    world_pts = pts[pts["world"].astype(bool)]
    ex = exposed[exposed["step"].isin(measured)]
    # Sum integer ns, then convert: float seconds would not add up exactly.
    length = path["t_end_ns"] - path["t_start_ns"]
    comm = int(length[path["segment"] == "comm"].sum()) / NS_PER_S
    compute = int(length[path["segment"] == "compute"].sum()) / NS_PER_S
    total = int(length.sum()) / NS_PER_S
    bub = bubble[bubble["step"].isin(measured)]
    row = {
        "steady_step": int(path["step"].iloc[0]) if len(path) else -1,
        "measured_steps": n,
        "collectives_per_step": per_step("collective"),
        "p2p_per_step": per_step("p2p"),
        "barriers_per_step": per_step("barrier"),
        "world_sync_points_per_step": len(world_pts) / n if n else math.nan,
        "sync_skew_mean_s": float(pts["skew_s"].mean()) if len(pts) else math.nan,
        "sync_skew_max_s": float(pts["skew_s"].max()) if len(pts) else math.nan,
        "comm_ratio_median": float(ex["comm_ratio"].median()) if len(ex) else math.nan,
        "comm_ratio_max": float(ex["comm_ratio"].max()) if len(ex) else math.nan,
        "comm_inflight_s": float(ex["comm_s"].mean()) if len(ex) else math.nan,
        "comm_blocked_s": float(ex["exposed_comm_s"].mean()) if len(ex) else math.nan,
        "comm_overlap": _overlap(ex),
        "exposed_source": _one_source(ex["exposed_source"]),
        "blocking_recorded": BLOCKING_COLUMN in ops.columns,
        "critical_path_s": float(total) if len(path) else math.nan,
        "critical_compute_s": float(compute) if len(path) else math.nan,
        "critical_comm_s": float(comm) if len(path) else math.nan,
        "critical_comm_share": float(comm / total) if total > 0 else math.nan,
        "critical_rank_switches": int((path["rank"].diff().fillna(0) != 0).sum()),
        "critical_ops": _ops_on_path(path),
        "bubble_measured_fwd_bwd": float(bub["bubble_frac_fwd_bwd"].mean())
        if len(bub)
        else math.nan,
        "bubble_measured_step": float(bub["bubble_frac_step"].mean()) if len(bub) else math.nan,
        "bubble_analytic": bubble_analytic(plan, world) if plan is not None else math.nan,
        "bubble_predicted": math.nan
        if predicted_bubble_ratio is None
        else float(predicted_bubble_ratio),
    }
    return led_by_params(ops, pd.DataFrame([row]), SYNC_SUMMARY_COLUMNS)


def sync_tables(
    ops: pd.DataFrame,
    steps: pd.DataFrame,
    plan: ParallelPlan | Mapping[str, Any] | None = None,
    warmup_steps: int = 0,
    predicted_bubble_ratio: float | None = None,
) -> dict[str, pd.DataFrame]:
    """Every table of :data:`SYNC_TABLES` for one cell, labelling the ops once.

    ``ops``/``steps``: the cell's ``trace/ops.parquet`` and ``trace/steps.parquet``; ``plan``:
    cell.json ``plan`` (a resolved :class:`~commscope.spec.plan.ParallelPlan` as a dict; without
    it groups are only ``world``/``other``/``self`` and there is no bubble); ``warmup_steps``:
    cell.json ``warmup_steps``; ``predicted_bubble_ratio``: the predictor's, for the summary.
    """
    for frame in (ops, steps):
        if "cell" in frame.columns and frame["cell"].nunique(dropna=False) > 1:
            raise ValueError("sync_tables: pass the ops and steps of one cell at a time")
    if "op" not in ops.columns:  # a cell that recorded no op at all: empty tables
        ops = pd.DataFrame(
            {
                **{c: pd.Series(dtype="int64") for c in ("rank", "step", "seq", "bytes")},
                **{c: pd.Series(dtype="int64") for c in ("group_size", "peer")},
                **{c: pd.Series(dtype="Int64") for c in ("t_issue_ns", "t_start_ns", "t_end_ns")},
                **{c: pd.Series(dtype="object") for c in ("op", "phase", "group_ranks")},
            }
        )
    world = ops_world(ops, steps if "rank" in steps.columns else None)
    lab = label_ops(ops, plan, world)
    tables = {
        "sync_counts": sync_counts(ops, plan, world, labelled=lab),
        "sync_points": sync_points(ops, plan, warmup_steps, world, labelled=lab),
        "exposed_comm": exposed_comm(ops, steps, warmup_steps, labelled=lab),
        "critical_path": critical_path(ops, steps, plan, warmup_steps, labelled=lab),
        "pipeline_bubble": pipeline_bubble(ops, steps, plan, warmup_steps, labelled=lab),
    }
    tables["sync_summary"] = sync_summary(ops, tables, plan, world, predicted_bubble_ratio)
    return tables
