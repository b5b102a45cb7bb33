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

Everything that scales with the number of ops is vectorised (a cell can hold 10**6 ops); the
critical-path walk is a loop over the ops of one step on the path only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from commscope.contracts import (
    GROUP_KIND_COLUMN,
    P2P_OPS,
    WAIT_COLUMN,
    WAIT_END_COLUMN,
    WAIT_START_COLUMN,
    parse_ranks,
    with_params,
)
from commscope.contracts import SYNC_TABLES as SYNC_TABLES  # this module's tables, re-exported
from commscope.metrics._common import _param_cols
from commscope.spec.plan import DIMS, ParallelPlan
from commscope.units import NS_PER_S

# Optional ops column: True where the issuing thread waited on the op over its whole
# [t_issue_ns, t_end_ns] (synchronous op, or issue immediately followed by wait()). The capture
# records the waits themselves instead; this column applies to ops without a recorded wait
# (hand-built or imported traces). Without either every op counts as blocking (docs/sync.md).
BLOCKING_COLUMN = "blocking"
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

OP_CLASSES = ("collective", "p2p", "barrier")
# The ops columns the sync tables read (docs/traces.md); the others are not copied.
_LABEL_INPUTS = (
    "rank",
    "op",
    "group_ranks",
    "group_size",
    "peer",
    "seq",
    "step",
    "phase",
    "bytes",
    "t_issue_ns",
    "t_end_ns",
    GROUP_KIND_COLUMN,
    BLOCKING_COLUMN,
    WAIT_START_COLUMN,
    WAIT_END_COLUMN,
    WAIT_COLUMN,
)
_COLLECTIVE_CLASSES = ("collective", "barrier")


# --------------------------------------------------------------------------------------------
# Labels: op class, group kind, instances
# --------------------------------------------------------------------------------------------


def op_class(op: pd.Series) -> pd.Series:
    """``barrier`` for barriers, ``p2p`` for send/recv, ``collective`` for every other op."""
    values = np.where(
        op.eq("barrier").to_numpy(),
        "barrier",
        np.where(op.isin(P2P_OPS).to_numpy(), "p2p", "collective"),
    )
    return pd.Series(values, index=op.index, name="op_class")


def _as_plan(plan: ParallelPlan | Mapping[str, Any] | None, world: int) -> ParallelPlan | None:
    """``plan`` as a resolved :class:`ParallelPlan` (``world`` fills a -1 degree; 0: the
    product of the plan's degrees, which must then all be set)."""
    if plan is None:
        return None
    if not isinstance(plan, ParallelPlan):
        plan = ParallelPlan.from_dict(dict(plan))
    return plan.resolve(world or math.prod(max(getattr(plan, d), 1) for d in DIMS))


def _fully_set(plan: ParallelPlan | Mapping[str, Any]) -> bool:
    """Whether no degree of ``plan`` is -1 (its degrees alone give the world size)."""
    get = plan.get if isinstance(plan, Mapping) else lambda d, _: getattr(plan, d)
    return all(int(get(d, 1)) >= 1 for d in DIMS)


def _world(ops: pd.DataFrame, steps: pd.DataFrame | None = None) -> int:
    ranks = [int(ops["rank"].max()) + 1 if len(ops) else 0]
    if steps is not None and len(steps):
        ranks.append(int(steps["rank"].max()) + 1)
    return max(ranks)


def group_kinds(
    ops: pd.DataFrame, plan: ParallelPlan | Mapping[str, Any] | None = None, world: int = 0
) -> pd.Series:
    """The parallel dimension of each op's group: ``dp``, ``tp``, ``pp`` or ``ep`` when the
    group is the rank's group along that mesh dimension of ``plan`` (a pure-DDP cell's world
    group is ``dp``), ``world`` when it holds every rank but is no dimension's group, ``self``
    for a one-rank group, ``other`` otherwise (e.g. the first and last pipeline stage's pair).
    A collective other than an all-to-all on an EP group is ``dp``: expert parallelism moves
    tokens with all-to-alls, the rest is the replicated (dense) part's data-parallel sync.

    An ops column ``group_kind`` (imported traces) wins where it is set. ``world`` defaults to
    one more than the largest rank of ``ops``.
    """
    if not world:
        fixed = _as_plan(plan, 0) if plan is not None and _fully_set(plan) else None
        world = math.prod(getattr(fixed, d) for d in DIMS) if fixed else _world(ops)
    resolved = _as_plan(plan, world)
    everyone = list(range(world))
    dims = [d for d in DIMS if resolved is not None and getattr(resolved, d) > 1]

    def kind(rank: int, group: object) -> str:
        members = parse_ranks(group)
        if len(members) == 1:
            return "self"
        for d in dims:
            if sorted(members) == resolved.group_of(d, rank):  # group_of is ascending
                return d
        return "world" if sorted(members) == everyone else "other"

    pairs = ops[["rank", "group_ranks"]].drop_duplicates()
    pairs[GROUP_KIND_COLUMN] = [
        kind(int(r), g) for r, g in pairs.itertuples(index=False, name=None)
    ]
    out = ops[["rank", "group_ranks"]].merge(pairs, on=["rank", "group_ranks"], how="left")
    out = pd.Series(out[GROUP_KIND_COLUMN].to_numpy(), index=ops.index, name=GROUP_KIND_COLUMN)
    # Expert parallelism moves tokens with all-to-alls only; anything else on an EP group
    # synchronises the part every EP rank replicates (the MoE's dense DDP): data parallel.
    out = out.mask(out.eq("ep") & ops["op"].ne("alltoall"), "dp")
    if GROUP_KIND_COLUMN in ops.columns:
        given = ops[GROUP_KIND_COLUMN]
        out = given.where(given.notna() & given.astype(str).ne(""), out)
    return out.astype(str)


def _label(
    ops: pd.DataFrame, plan: ParallelPlan | Mapping[str, Any] | None, world: int
) -> pd.DataFrame:
    """``ops`` with ``op_class``, ``group_kind``, the blocked interval of :func:`_blocked` and
    the instance columns of :func:`_instances`; a fresh frame (the input is never modified)."""
    keep = [c for c in _LABEL_INPUTS if c in ops.columns]
    out = ops[keep].copy()  # the columns used only: a cell's ops table can have 10**6 rows
    out["op_class"] = op_class(out["op"])
    out[GROUP_KIND_COLUMN] = group_kinds(out, plan, world)
    return _instances(_blocked(out))


def _blocked(ops: pd.DataFrame) -> pd.DataFrame:
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


def _instances(ops: pd.DataFrame) -> pd.DataFrame:
    """Tie the rows of one op instance together across ranks.

    A collective instance is (``group_ranks``, ``seq``): the capture numbers a group's
    collectives per rank in issue order, and every member issues the same sequence. A P2P
    instance is a send and its recv: (``group_ranks``, sender, receiver, ``seq``), the capture
    numbering per (group, op, peer). Adds ``instance`` (id), ``n_members`` (rows recorded),
    ``t_last_issue_ns`` and ``last_rank`` (the member that issued last; the earliest row on a
    tie) and ``t_first_issue_ns``.
    """
    out = ops.reset_index(drop=True)
    if "seq" not in out.columns:  # imported traces: number each rank's ops per group in order
        stream = out["op"].where(out["op_class"].eq("p2p"), "")  # as the capture numbers
        ordered = out.assign(stream=stream).sort_values("t_issue_ns", kind="stable")
        out["seq"] = ordered.groupby(["rank", "group_ranks", "stream", "peer"]).cumcount()
    p2p = out["op_class"].eq("p2p").to_numpy()
    rank = out["rank"].to_numpy("int64")
    peer = out["peer"].to_numpy("int64")
    is_send = out["op"].eq("send").to_numpy()
    src = np.where(p2p, np.where(is_send, rank, peer), -1)
    dst = np.where(p2p, np.where(is_send, peer, rank), -1)
    keys = pd.DataFrame(
        {"g": out["group_ranks"].astype(str).to_numpy(), "s": src, "d": dst, "q": out["seq"]}
    )
    out["instance"] = keys.groupby(["g", "s", "d", "q"], sort=False).ngroup().to_numpy()
    g = out.groupby("instance", sort=False)["t_issue_ns"]
    out["n_members"] = g.transform("size").to_numpy()
    out["t_first_issue_ns"] = g.transform("min").to_numpy("int64")
    out["t_last_issue_ns"] = g.transform("max").to_numpy("int64")
    last_row = g.transform("idxmax")
    out["last_rank"] = out.loc[last_row.to_numpy(), "rank"].to_numpy("int64")
    return out


def _with_params(ops: pd.DataFrame, frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    params = {c: ops[c].iloc[0] for c in _param_cols(ops)} if len(ops) else {}
    frame = frame.reindex(columns=columns) if frame.empty else frame[columns]
    return with_params(params, frame.reset_index(drop=True))


def _step_rows(steps: pd.DataFrame, phase: str = "step") -> pd.DataFrame:
    """(rank, step, t_start_ns, t_end_ns) of ``phase`` in training steps; empty when ``steps``
    is (imported traces have no steps table)."""
    if steps.empty or "phase" not in steps.columns:
        return pd.DataFrame(columns=["rank", "step", "t_start_ns", "t_end_ns"], dtype="int64")
    rows = steps[(steps["phase"] == phase) & (steps["step"] >= 0)]
    return rows[["rank", "step", "t_start_ns", "t_end_ns"]].astype("int64")


def _union_lengths(group: np.ndarray, start: np.ndarray, end: np.ndarray, n: int) -> np.ndarray:
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


def _warmup(step: pd.Series, warmup_steps: int) -> pd.Series:
    return step < warmup_steps


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
    lab = labelled if labelled is not None else _label(ops, plan, world or _world(ops))
    if lab.empty:
        return _with_params(ops, pd.DataFrame(), SYNC_COUNT_COLUMNS)
    out = (
        lab.groupby(["step", GROUP_KIND_COLUMN, "op_class"], sort=True)
        .agg(
            n_ops=("op", "size"),
            n_instances=("instance", "nunique"),
            bytes=("bytes", "sum"),
        )
        .reset_index()
    )
    return _with_params(ops, out, SYNC_COUNT_COLUMNS)


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
    world = world or _world(ops)
    lab = labelled if labelled is not None else _label(ops, plan, world)
    rows = lab[lab["op_class"].isin(_COLLECTIVE_CLASSES) & (lab["step"] >= 0)]
    if rows.empty:
        return _with_params(ops, pd.DataFrame(), SYNC_POINT_COLUMNS)
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
        warmup=_warmup(out["step"], warmup_steps),
    )
    out = out.sort_values(["t_first_issue_ns", "instance"], kind="stable")
    return _with_params(ops, out, SYNC_POINT_COLUMNS)


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
    (:func:`_blocked`: the recorded waits; an op without one over its whole interval), clipped
    to the step. ``exposed_source`` is ``waits`` when every op of the rank's step had a recorded
    wait, else ``blocking`` (the ops table's :data:`BLOCKING_COLUMN` decided for the others) or
    ``upper_bound``. ``compute_s`` = step_s − exposed_comm_s; ``comm_ratio`` = exposed_comm_s /
    step_s. Columns: cell params, :data:`EXPOSED_COLUMNS`.
    """
    lab = labelled if labelled is not None else _label(ops, None, _world(ops, steps))
    recorded = BLOCKING_COLUMN in ops.columns
    base = _step_rows(steps)
    if base.empty:
        return _with_params(ops, pd.DataFrame(), EXPOSED_COLUMNS)
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
    comm = _union_lengths(
        g[done], np.maximum(issue[done], s0[done]), np.minimum(end[done], s1[done]), n
    )
    blocked = mine["t_block_start_ns"].notna().to_numpy(bool)
    b0 = mine["t_block_start_ns"].fillna(0).to_numpy("int64")[blocked]
    b1 = mine["t_block_end_ns"].fillna(0).to_numpy("int64")[blocked]
    exposed = _union_lengths(
        g[blocked], np.maximum(b0, s0[blocked]), np.minimum(b1, s1[blocked]), n
    )
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
        warmup=_warmup(base["step"], warmup_steps),
    )
    out = out.sort_values(["step", "rank"], kind="stable")
    return _with_params(ops, out, EXPOSED_COLUMNS)


def steady_step(steps: pd.DataFrame, warmup_steps: int = 0) -> int | None:
    """The median measured step: among steps >= ``warmup_steps`` (all steps >= 0 when none),
    the one whose duration (first rank in to last rank out) is nearest the median duration,
    the earliest on a tie; None without steps."""
    rows = _step_rows(steps)
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
    lab = labelled if labelled is not None else _label(ops, plan, _world(ops, steps))
    step = steady_step(steps, warmup_steps) if step is None else step
    bounds = _step_rows(steps)
    bounds = bounds[bounds["step"] == step].set_index("rank") if step is not None else bounds
    if step is None or bounds.empty:
        return _with_params(ops, pd.DataFrame(), CRITICAL_PATH_COLUMNS)
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
    return _with_params(ops, out, CRITICAL_PATH_COLUMNS)


def bubble_analytic(plan: ParallelPlan | Mapping[str, Any] | None, world: int = 0) -> float:
    """(p−1)/v / (m + (p−1)/v): GPipe's and 1F1B's (p−1)/(p−1+m) for p pipeline ranks and m
    microbatches, the interleaved schedule's bubble shrunk by v stages per rank; 0 without a
    pipeline, NaN without a plan."""
    resolved = _as_plan(plan, world)
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
    world = _world(ops, steps)
    resolved = _as_plan(plan, world)
    if resolved is None or resolved.pp <= 1:
        return _with_params(ops, pd.DataFrame(), BUBBLE_COLUMNS)
    lab = labelled if labelled is not None else _label(ops, resolved, world)
    step_rows = _step_rows(steps)
    fb = _step_rows(steps, "fwd_bwd").rename(columns={"t_start_ns": "fb0", "t_end_ns": "fb1"})
    base = step_rows.merge(fb, on=["rank", "step"], how="inner").reset_index(drop=True)
    if base.empty:
        return _with_params(ops, pd.DataFrame(), BUBBLE_COLUMNS)
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
    bubble = _union_lengths(waits["gid"].to_numpy("int64"), start, stop, len(base))
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
        warmup=_warmup(base["step"], warmup_steps),
    )
    out = out.sort_values(["step", "rank"], kind="stable")
    return _with_params(ops, out, BUBBLE_COLUMNS)


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
    the median and the largest per-rank comm ratio; the steady step's critical path (length,
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
    return _with_params(ops, pd.DataFrame([row]), SYNC_SUMMARY_COLUMNS)


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
    world = _world(ops, steps if "rank" in steps.columns else None)
    lab = _label(ops, plan, world)
    tables = {
        "sync_counts": sync_counts(ops, plan, world, labelled=lab),
        "sync_points": sync_points(ops, plan, warmup_steps, world, labelled=lab),
        "exposed_comm": exposed_comm(ops, steps, warmup_steps, labelled=lab),
        "critical_path": critical_path(ops, steps, plan, warmup_steps, labelled=lab),
        "pipeline_bubble": pipeline_bubble(ops, steps, plan, warmup_steps, labelled=lab),
    }
    tables["sync_summary"] = sync_summary(ops, tables, plan, world, predicted_bubble_ratio)
    return tables
