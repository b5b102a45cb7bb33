"""One rank's timeline (commscope.cell.timeline): unions of intervals, the blocked time of ops
and the async rule, on hand-built intervals with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from commscope.cell.timeline import (
    blocked_intervals,
    free_ns,
    rank_step_waits,
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
