"""The window the cross-validation compares the wire and the ops over: op instances, the ops
inside a window, and window edges moved to quiet instants."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from commscope.cell.load import CellTraces
from commscope.collectives.matrix import Placement
from commscope.contracts import P2P_OPS, parse_ranks
from commscope.metrics._common import _shared
from commscope.metrics.steps import step_times, training_window


def _instance_keys(ops: pd.DataFrame) -> list[pd.Series] | None:
    """Columns that identify an op *instance* (all records of one collective or one send/recv
    pair): a collective's (``group``, ``seq``), a P2P pair's (``group``, sender, receiver,
    ``seq``). None when the trace lacks those columns."""
    if not {"group", "seq", "op", "rank", "peer"} <= set(ops.columns):
        return None
    p2p = ops["op"].isin(P2P_OPS)
    is_send = ops["op"] == "send"
    sender = ops["rank"].where(is_send | ~p2p, ops["peer"]).where(p2p, -1)
    receiver = ops["peer"].where(is_send, ops["rank"]).where(p2p, -1)
    return [
        ops["group"].astype(str).rename("group"),
        sender.astype("int64").rename("sender"),
        receiver.astype("int64").rename("receiver"),
        ops["seq"].astype("int64").rename("seq"),
    ]


def ops_in_window(ops: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """The op records whose transfers happen inside ``window`` (the counters' window).

    No byte of an op moves before every member has issued it (gloo posts a send-ready
    notice and waits for the peer's recv-ready one), so an op instance is placed at its last
    member's issue time and all its records are kept or dropped together (instances as in
    :func:`_instance_keys`). Without those columns each record is placed at its own issue
    time. This keeps a collective that one rank issued just before the window (pipeline
    stages start their steps at different times) from counting on one side only. Whether the
    instance's bytes also *end* inside the window is up to the window: see
    :func:`quiet_window`.
    """
    if ops.empty:
        return ops
    issued = pd.to_numeric(ops["t_issue_ns"], errors="coerce")
    keys = _instance_keys(ops)
    if keys is not None:
        issued = issued.groupby(keys, dropna=False).transform("max")
    return ops[(issued >= window[0]) & (issued <= window[1])]


def quiet_window(
    ops: pd.DataFrame, window: tuple[int, int], ranks_per_node: Any = None
) -> tuple[int, int]:
    """``window`` with each edge moved forward, if needed, to an instant when no op that
    crosses nodes is moving bytes, so the interface counters and the ops counted by
    :func:`ops_in_window` cover the same transfers.

    An op instance moves its bytes between its last member's issue (before that gloo sends
    nothing but a 48 B recv-ready notice) and its last member's completion (``t_end_ns``; an
    instance without one counts as instantaneous). Only instances whose members sit on more
    than one node matter: the others never reach the experiment interface. An edge that falls
    inside such an instance (or a chain of overlapping ones) moves to the end of that busy
    stretch: a warm-up op still running when the first measured step begins is then left out
    whole, a last-step op still running at the end is counted whole. Steps of different
    pipeline stages and data-parallel groups overlap, so the nominal edges (first rank's
    step start, last rank's step end) can fall in the middle of another rank's all-reduce;
    cutting there would count its bytes on the wire but not in the model, or the reverse.
    The window is returned unchanged when the trace lacks instance columns or when moving
    would leave it empty.
    """
    keys = _instance_keys(ops) if not ops.empty else None
    if keys is None or "t_end_ns" not in ops:
        return window
    issued = pd.to_numeric(ops["t_issue_ns"], errors="coerce")
    ended = pd.to_numeric(ops["t_end_ns"], errors="coerce").fillna(issued)
    place = Placement.from_ops(ops, ranks_per_node)
    p2p = ops["op"].isin(P2P_OPS)
    group_ranks = ops["group_ranks"].astype(str)
    spans_nodes = {
        g: len({place.node(r) for r in parse_ranks(g)}) > 1 for g in group_ranks.unique()
    }
    remote = group_ranks.map(spans_nodes).astype(bool)
    peer_node = _nodes(pd.to_numeric(ops["peer"], errors="coerce").fillna(-1), place)
    remote = remote.where(~p2p, _nodes(ops["rank"], place) != peer_node)
    frame = pd.DataFrame({"issued": issued, "ended": np.maximum(ended, issued), "remote": remote})
    inst = frame.groupby(keys, dropna=False).agg(
        start=("issued", "max"), end=("ended", "max"), remote=("remote", "any")
    )
    inst = inst[inst["remote"] & inst["start"].notna()].sort_values("start")
    if inst.empty:
        return window
    starts = inst["start"].to_numpy(dtype="int64")
    # Running maximum of the ends: busy[i] is where the stretch holding instance i ends at
    # the earliest, so an edge is inside a busy stretch when some earlier start has a later end.
    busy = np.maximum.accumulate(inst["end"].to_numpy(dtype="int64"))

    def moved(edge: int) -> int:
        while True:
            before = int(np.searchsorted(starts, edge, side="left"))
            if before == 0 or busy[before - 1] <= edge:
                break
            edge = int(busy[before - 1])
        # Then to the middle of the quiet gap around it: the counters are sampled, not
        # continuous, and an edge right at the end of a burst is interpolated between a sample
        # inside the burst and one after it, which puts part of the burst on the wrong side
        # (seen unshaped, where a 0.5 MB all-reduce takes under a millisecond). In the middle
        # of a gap of a few sample periods both neighbouring samples are quiet.
        prev_end = int(busy[before - 1]) if before > 0 else None
        next_start = int(starts[before]) if before < len(starts) else None
        if prev_end is not None and next_start is not None:
            return (prev_end + next_start) // 2
        return edge

    start, end = moved(int(window[0])), moved(int(window[1]))
    return (start, end) if start < end else window


def _nodes(ranks: pd.Series, place: Placement) -> pd.Series:
    """``ranks.map(place.node)``, calling it once per distinct rank rather than per row."""
    return ranks.map({rank: place.node(rank) for rank in pd.unique(ranks)})


def check_window(traces: CellTraces) -> tuple[tuple[int, int], int] | None:
    """The window the cross-validation compares the wire and the ops over, and the number of
    measured steps in it: :func:`training_window` with its edges moved to quiet instants
    (:func:`quiet_window`). None when the cell recorded no steps."""

    def compute() -> tuple[tuple[int, int], int] | None:
        st = step_times(traces.steps, traces.warmup_steps)
        if st.empty:
            return None
        rpn = traces.params.get("ranks_per_node")
        window = quiet_window(traces.ops, training_window(st), rpn)
        return window, int((~st["warmup"].astype(bool)).sum()) or len(st)

    # crosscheck, matrix_check and socket_stats all start here.
    return _shared("check_window", (traces, traces.ops, traces.steps), compute)
