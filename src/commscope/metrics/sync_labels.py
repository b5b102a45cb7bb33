"""The labels the sync tables put on every op of one cell (docs/sync.md): its class
(collective, P2P, barrier), the parallel dimension of its group, when its rank was blocked on it
(:func:`commscope.cell.timeline.blocked_intervals`) and the instance it belongs to across ranks;
and the helpers every sync table shares (the plan, the world, step rows, the cell's columns).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from commscope.cell.timeline import blocked_intervals
from commscope.contracts import (
    BLOCKING_COLUMN,
    GROUP_KIND_COLUMN,
    P2P_OPS,
    WAIT_COLUMN,
    WAIT_END_COLUMN,
    WAIT_START_COLUMN,
    parse_ranks,
    with_params,
)
from commscope.metrics._common import _param_cols
from commscope.spec.plan import DIMS, ParallelPlan

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


def op_class(op: pd.Series) -> pd.Series:
    """``barrier`` for barriers, ``p2p`` for send/recv, ``collective`` for every other op."""
    values = np.where(
        op.eq("barrier").to_numpy(),
        "barrier",
        np.where(op.isin(P2P_OPS).to_numpy(), "p2p", "collective"),
    )
    return pd.Series(values, index=op.index, name="op_class")


def as_plan(plan: ParallelPlan | Mapping[str, Any] | None, world: int) -> ParallelPlan | None:
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


def ops_world(ops: pd.DataFrame, steps: pd.DataFrame | None = None) -> int:
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
        fixed = as_plan(plan, 0) if plan is not None and _fully_set(plan) else None
        world = math.prod(getattr(fixed, d) for d in DIMS) if fixed else ops_world(ops)
    resolved = as_plan(plan, world)
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


def label_ops(
    ops: pd.DataFrame, plan: ParallelPlan | Mapping[str, Any] | None, world: int
) -> pd.DataFrame:
    """``ops`` with ``op_class``, ``group_kind``, the blocked interval of
    :func:`~commscope.cell.timeline.blocked_intervals` and the instance columns of
    :func:`_instances`; a fresh frame (the input is never modified)."""
    keep = [c for c in _LABEL_INPUTS if c in ops.columns]
    out = ops[keep].copy()  # the columns used only: a cell's ops table can have 10**6 rows
    out["op_class"] = op_class(out["op"])
    out[GROUP_KIND_COLUMN] = group_kinds(out, plan, world)
    return _instances(blocked_intervals(out))


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


def led_by_params(ops: pd.DataFrame, frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    params = {c: ops[c].iloc[0] for c in _param_cols(ops)} if len(ops) else {}
    frame = frame.reindex(columns=columns) if frame.empty else frame[columns]
    return with_params(params, frame.reset_index(drop=True))


def phase_rows(steps: pd.DataFrame, phase: str = "step") -> pd.DataFrame:
    """(rank, step, t_start_ns, t_end_ns) of ``phase`` in training steps; empty when ``steps``
    is (imported traces have no steps table)."""
    if steps.empty or "phase" not in steps.columns:
        return pd.DataFrame(columns=["rank", "step", "t_start_ns", "t_end_ns"], dtype="int64")
    rows = steps[(steps["phase"] == phase) & (steps["step"] >= 0)]
    return rows[["rank", "step", "t_start_ns", "t_end_ns"]].astype("int64")


def warmup_flags(step: pd.Series, warmup_steps: int) -> pd.Series:
    return step < warmup_steps
