"""One rank's timeline (commscope.cell.timeline): unions of intervals, the blocked time of ops
and the async rule, on hand-built intervals with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from commscope.cell.timeline import (
    blocked_intervals,
    compute_spans,
    free_ns,
    phase_intervals,
    rank_step_waits,
    rank_timeline,
    step_blocked_ns,
    union,
    union_lengths,
)


def test_union_lengths_matches_a_brute_force_sweep() -> None:
    rng = np.random.default_rng(0)
    n, groups = 400, 7
    group = rng.integers(0, groups, n)
    start = rng.integers(0, 1000, n)
    end = start + rng.integers(-5, 60, n)
    got = union_lengths(group, start, end, groups)
    for g in range(groups):
        covered = np.zeros(1100, dtype=bool)
        for s, e in zip(start[group == g], end[group == g], strict=True):
            covered[s:e] = True
        assert got[g] == covered.sum()


def test_union_merges_touching_intervals_clips_and_drops_empty_ones() -> None:
    intervals = [(30, 40), (0, 10), (10, 15), (5, 8), (50, 50), (60, 90)]
    assert union(intervals) == [(0, 15), (30, 40), (60, 90)]
    assert union(intervals, 12, 70) == [(12, 15), (30, 40), (60, 70)]
    assert free_ns(0, 100, union(intervals)) == 100 - 15 - 10 - 30
    assert free_ns(50, 50, union(intervals)) == 0.0


def test_blocked_intervals_prefer_recorded_waits_then_the_blocking_flag() -> None:
    ops = pd.DataFrame(
        {
            "t_issue_ns": [0, 100, 200, 300],
            "t_end_ns": [50, 180, 260, None],
            "wait_ns": [20, 0, None, None],
            "t_wait_start_ns": [30, None, None, None],
            "t_wait_end_ns": [50, None, None, None],
            "blocking": [True, True, False, True],
        }
    ).astype({"t_end_ns": "Int64", "wait_ns": "Int64"})
    ops = ops.astype({"t_wait_start_ns": "Int64", "t_wait_end_ns": "Int64"})
    out = blocked_intervals(ops)
    assert out["wait_known"].tolist() == [True, True, False, False]
    assert out["blocking"].tolist() == [True, False, False, True]
    assert out["t_block_start_ns"].tolist()[0] == 30 and out["t_block_end_ns"].tolist()[0] == 50
    # never waited on, flagged async, never completed: no interval
    assert out["t_block_start_ns"].isna().tolist() == [False, True, True, True]


def test_rank_step_waits_tell_synchronous_from_async_ops() -> None:
    # op 0: waited on from its issue (synchronous); op 1: waited on later (async); op 2: never
    # waited on; op 3: no wait recorded, the next op issued before it completed; op 4: blocking.
    us = 1000  # ns: a wait within SYNC_WAIT_TOLERANCE_NS (20 µs) of the issue is the op's own
    issue = [v * us for v in (0, 100, 200, 300, 400)]
    end = [v * us for v in (50, 180, 260, 450, 500)]
    wait_ns = [50 * us, 30 * us, 0, None, None]
    w_start = [0, 150 * us, None, None, None]
    w_end = [50 * us, 180 * us, None, None, None]
    blocked, wait_at = rank_step_waits(issue, end, wait_ns, w_start, w_end, t1=1000 * us)
    assert blocked == [(0, 50 * us), (150 * us, 180 * us), (400 * us, 500 * us)]
    assert wait_at == [None, 150 * us, 260 * us, 450 * us, None]


def _async_step() -> tuple[pd.DataFrame, pd.DataFrame]:
    """One rank, one 100 ns step: fwd [0, 40), bwd [40, 90), optim [90, 100). A bucket
    all-reduce issued at 50 runs to 80 under the backward and is waited on over [85, 88]; a
    synchronous all-reduce at 92 blocks until 95."""
    steps = pd.DataFrame(
        [
            (0, 0, "step", 0, 100),
            (0, 0, "fwd", 0, 40),
            (0, 0, "bwd", 40, 90),
            (0, 0, "optim", 90, 100),
        ],
        columns=["rank", "step", "phase", "t_start_ns", "t_end_ns"],
    )
    ops = pd.DataFrame(
        {
            "rank": [0, 0],
            "step": [0, 0],
            "op": ["allreduce", "allreduce"],
            "t_issue_ns": [50, 92],
            "t_end_ns": [80, 95],
            "wait_ns": [3, 3],
            "t_wait_start_ns": [85, 92],
            "t_wait_end_ns": [88, 95],
        }
    ).astype({c: "Int64" for c in ("t_end_ns", "wait_ns", "t_wait_start_ns", "t_wait_end_ns")})
    return ops, steps


def test_compute_is_step_time_outside_the_blocked_intervals() -> None:
    ops, steps = _async_step()
    spans = compute_spans(ops, steps, 0)
    assert [(s.start_ns, s.end_ns, s.phase) for s in spans] == [
        (0, 40, "fwd"),
        (40, 85, "bwd"),
        (88, 90, "bwd"),
        (90, 92, "optim"),
        (95, 100, "optim"),
    ]
    blocked = step_blocked_ns(ops, steps)
    assert blocked[["rank", "step", "blocked_ns"]].values.tolist() == [[0, 0, 6]]
    # Without the waits every op blocks from issue to completion: the lower bound of compute.
    no_waits = ops.drop(columns=["wait_ns", "t_wait_start_ns", "t_wait_end_ns"])
    assert step_blocked_ns(no_waits, steps)["blocked_ns"].tolist() == [33]


def test_rank_timeline_puts_the_unblocked_compute_before_each_op() -> None:
    ops, steps = _async_step()
    records = [
        {**r, "t_block_start_ns": ws, "t_block_end_ns": we}
        for r, ws, we in zip(
            ops[["t_issue_ns", "t_end_ns"]].astype(int).to_dict("records"),
            [85, 92],
            [88, 95],
            strict=True,
        )
    ]
    items = [
        (kind, (item.start_ns, item.end_ns) if kind == "compute" else item["t_issue_ns"])
        for kind, item in rank_timeline(records, phase_intervals(steps, 0))
    ]
    assert items == [
        ("compute", (0, 40)),
        ("compute", (40, 50)),
        ("op", 50),
        ("compute", (50, 85)),
        ("compute", (88, 90)),
        ("compute", (90, 92)),
        ("op", 92),
        ("compute", (95, 100)),
    ]
    # Records without blocked intervals: every op blocks over [issue, end].
    bare = [{k: r[k] for k in ("t_issue_ns", "t_end_ns")} for r in records]
    spans = [
        item for kind, item in rank_timeline(bare, phase_intervals(steps, 0)) if kind == "compute"
    ]
    assert sum(s.duration_ns for s in spans) == 100 - 30 - 3
