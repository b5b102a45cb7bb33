"""Synchronization metrics (commscope.metrics.sync) on hand-built traces with known answers."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from commscope.metrics import sync

MS = 1_000_000  # ns
T0 = 1_700_000_000_000_000_000  # an epoch-ns origin, as the capture stamps
CELL = "strategy~x/repeat~0"


def op(
    rank: int,
    name: str,
    t0_ms: float,
    t1_ms: float | None,
    *,
    group: str = "0,1",
    seq: int = 0,
    step: int = 0,
    peer: int = -1,
    nbytes: int = 1000,
    phase: str = "fwd",
    **extra: object,
) -> dict:
    """One ops.parquet row; times in ms after T0."""
    return {
        "cell": CELL,
        "rank": rank,
        "op": name,
        "group_ranks": group,
        "group_size": len(group.split(",")),
        "peer": peer,
        "seq": seq,
        "step": step,
        "phase": phase,
        "bytes": nbytes,
        "t_issue_ns": T0 + round(t0_ms * MS),
        "t_end_ns": None if t1_ms is None else T0 + round(t1_ms * MS),
        **extra,
    }


def ops_frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    # From the ints themselves: via float64 (a None makes the column float) ns would round.
    df["t_end_ns"] = pd.array([r["t_end_ns"] for r in rows], dtype="Int64")
    return df


def phase(rank: int, step: int, name: str, t0_ms: float, t1_ms: float) -> dict:
    return {
        "cell": CELL,
        "rank": rank,
        "step": step,
        "phase": name,
        "t_start_ns": T0 + round(t0_ms * MS),
        "t_end_ns": T0 + round(t1_ms * MS),
    }


# --------------------------------------------------------------------------------------------
# Two ranks, one world all-reduce: rank 1 arrives 5 ms late
# --------------------------------------------------------------------------------------------


def segments(path: pd.DataFrame, *columns: str) -> list[tuple]:
    """The critical path's rows as tuples: ``columns``, then start and end in ms from T0."""
    ms = [(path["t_start_ns"] - T0) // MS, (path["t_end_ns"] - T0) // MS]
    return list(zip(*(path[c] for c in columns), *ms, strict=True))


@pytest.fixture
def late_allreduce() -> tuple[pd.DataFrame, pd.DataFrame]:
    ops = ops_frame(
        [
            op(0, "allreduce", 5, 12, seq=0),
            op(1, "allreduce", 10, 12.000001, seq=0),  # 1 ns later: ends stay exact ints
        ]
    )
    steps = pd.DataFrame(
        [phase(0, 0, "step", 0, 20), phase(1, 0, "step", 0, 19), phase(0, 0, "fwd", 0, 20)]
    )
    return ops, steps


def test_sync_point_skew_and_last_rank(late_allreduce: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    ops, _ = late_allreduce
    points = sync.sync_points(ops)
    assert len(points) == 1
    p = points.iloc[0]
    assert p["cell"] == CELL
    assert p["skew_s"] == 0.005
    assert (p["first_rank"], p["last_rank"], p["n_ranks"]) == (0, 1, 2)
    assert bool(p["world"]) is True
    assert p["group_kind"] == "world"  # no plan: a group of every rank is the world
    assert p["t_end_ns"] == T0 + 12 * MS + 1


def test_critical_path_goes_through_the_late_rank(
    late_allreduce: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    ops, steps = late_allreduce
    path = sync.critical_path(ops, steps)
    got = segments(path, "rank", "segment", "op")
    # Back from rank 0's end (20 ms): its compute after the all-reduce, the all-reduce from
    # the moment rank 1 arrived, then rank 1's compute before it arrived.
    assert got == [
        (1, "compute", "", 0, 10),
        (0, "comm", "allreduce", 10, 12),  # rank 0's own row: it ends at 12 ms sharp
        (0, "compute", "", 12, 20),
    ]
    assert list(path["order"]) == [0, 1, 2]
    summary = sync.sync_tables(ops, steps)["sync_summary"].iloc[0]
    assert summary["critical_path_s"] == 0.02
    assert summary["critical_compute_s"] == 0.018
    assert summary["critical_comm_s"] == 0.002
    assert summary["critical_rank_switches"] == 1
    assert summary["critical_ops"] == "allreduce/world x1"
    assert summary["sync_skew_max_s"] == 0.005
    assert summary["world_sync_points_per_step"] == 1.0


# --------------------------------------------------------------------------------------------
# Exposed communication
# --------------------------------------------------------------------------------------------


def test_overlapped_async_op_is_not_exposed_and_a_synchronous_one_is() -> None:
    ops = ops_frame(
        [
            # async all-reduce fully under rank 0's compute: not waited on
            op(0, "allreduce", 2, 8, seq=0, blocking=False),
            op(1, "allreduce", 2, 8, seq=0, blocking=False),
            # a synchronous 3 ms broadcast
            op(0, "broadcast", 10, 13, seq=1, blocking=True),
            op(1, "broadcast", 10, 13, seq=1, blocking=True),
        ]
    )
    steps = pd.DataFrame([phase(0, 0, "step", 0, 20), phase(1, 0, "step", 0, 20)])
    exposed = sync.exposed_comm(ops, steps)
    assert list(exposed["rank"]) == [0, 1]
    row = exposed.iloc[0]
    assert row["comm_s"] == 0.009  # 6 ms async + 3 ms synchronous
    assert row["exposed_comm_s"] == 0.003
    assert row["compute_s"] == 0.017
    assert row["comm_ratio"] == 3 / 20
    assert bool(row["blocking_recorded"]) is True

    only_async = sync.exposed_comm(ops[ops["op"] == "allreduce"], steps)
    assert list(only_async["exposed_comm_s"]) == [0.0, 0.0]
    assert list(only_async["comm_s"]) == [0.006, 0.006]


def test_without_the_blocking_column_every_op_counts_and_overlaps_merge() -> None:
    # Overlapping ops are counted once (their union); an op running past the step is clipped;
    # an op without an end is left out.
    ops = ops_frame(
        [
            op(0, "allreduce", 2, 6, seq=0),
            op(0, "allreduce", 4, 9, seq=1),
            op(0, "allreduce", 18, 25, seq=2),
            op(0, "allreduce", 12, None, seq=3),
        ]
    )
    steps = pd.DataFrame([phase(0, 0, "step", 0, 20)])
    row = sync.exposed_comm(ops, steps).iloc[0]
    assert row["comm_s"] == 0.009  # [2, 9] + [18, 20]
    assert row["exposed_comm_s"] == 0.009
    assert bool(row["blocking_recorded"]) is False


def waited(t0_ms: float | None, t1_ms: float | None) -> dict:
    """The capture's wait columns of one row: blocked over [t0, t1] ms after T0, or never
    (``None, None``)."""
    if t0_ms is None or t1_ms is None:
        return {"t_wait_start_ns": None, "t_wait_end_ns": None, "wait_ns": 0}
    a, b = T0 + round(t0_ms * MS), T0 + round(t1_ms * MS)
    return {"t_wait_start_ns": a, "t_wait_end_ns": b, "wait_ns": b - a}


def with_waits(rows: list[dict]) -> pd.DataFrame:
    df = ops_frame(rows)
    for col in ("t_wait_start_ns", "t_wait_end_ns", "wait_ns"):
        df[col] = pd.array([r.get(col) for r in rows], dtype="Int64")
    return df


def ddp_step_with_waits() -> tuple[pd.DataFrame, pd.DataFrame]:
    """One rank, one 20 ms step, as the capture records a DDP step and its neighbours:

    * two bucket all-reduces issued under backward at 2 and 5 ms, done at 9 and 12 ms; the
      reducer waited on them from 8 ms (backward's compute ended): waits [8, 9] and [8, 12];
    * an all-reduce done at 4 ms, before the reducer waited: never blocked on (wait 0);
    * a synchronous barrier [14, 15]: the wait is the whole call;
    * an isend at 16 ms never waited on (no end, wait 0).
    """
    rows = [
        op(0, "allreduce", 2, 9, seq=0, phase="bwd", **waited(8, 9)),
        op(0, "allreduce", 5, 12, seq=1, phase="bwd", **waited(8, 12)),
        op(0, "allreduce", 1, 4, seq=2, phase="bwd", **waited(None, None)),
        op(0, "barrier", 14, 15, seq=3, phase="optim", **waited(14, 15)),
        op(0, "send", 16, None, seq=0, peer=1, phase="optim", **waited(None, None)),
    ]
    return with_waits(rows), pd.DataFrame([phase(0, 0, "step", 0, 20)])


def test_exposed_comm_is_the_union_of_the_recorded_waits() -> None:
    ops, steps = ddp_step_with_waits()
    row = sync.exposed_comm(ops, steps).iloc[0]
    # In flight: [1, 12] and [14, 15] = 12 ms; blocked: [8, 12] and [14, 15] = 5 ms.
    assert row["comm_s"] == 0.012
    assert row["exposed_comm_s"] == 0.005
    assert row["compute_s"] == 0.015
    assert row["comm_ratio"] == 5 / 20
    assert row["exposed_source"] == "waits"
    assert bool(row["blocking_recorded"]) is False
    # The same trace without its wait columns (a trace from before them): the upper bound.
    old = ops.drop(columns=["t_wait_start_ns", "t_wait_end_ns", "wait_ns"])
    row = sync.exposed_comm(old, steps).iloc[0]
    assert row["exposed_comm_s"] == 0.012
    assert row["exposed_source"] == "upper_bound"


def test_an_op_with_an_unknown_wait_counts_whole_and_marks_the_step() -> None:
    ops, steps = ddp_step_with_waits()
    ops.loc[1, "wait_ns"] = pd.NA  # e.g. a CUDA op: its wait cannot be observed
    ops.loc[1, ["t_wait_start_ns", "t_wait_end_ns"]] = pd.NA
    row = sync.exposed_comm(ops, steps).iloc[0]
    # [5, 12] whole, [8, 9] inside it, [14, 15]: 8 ms.
    assert row["exposed_comm_s"] == 0.008
    assert row["exposed_source"] == "upper_bound"
    row = sync.exposed_comm(ops.assign(blocking=True), steps).iloc[0]
    assert row["exposed_source"] == "blocking"  # the blocking column decided for that op


def test_waits_decide_the_critical_path_and_the_summary() -> None:
    ops, steps = ddp_step_with_waits()
    path = sync.critical_path(ops, steps)
    got = segments(path, "segment", "op")
    # The all-reduce done at 4 ms never held the rank up: not on the path (it was, as the
    # upper bound counted every op).
    assert got == [
        ("compute", "", 0, 5),
        ("comm", "allreduce", 5, 12),
        ("compute", "", 12, 14),
        ("comm", "barrier", 14, 15),
        ("compute", "", 15, 20),
    ]
    old_path = sync.critical_path(ops.drop(columns=["wait_ns"]), steps)
    comm = old_path[old_path["segment"] == "comm"]
    assert list((comm["t_end_ns"] - T0) // MS) == [4, 12, 15]
    summary = sync.sync_tables(ops, steps)["sync_summary"].iloc[0]
    assert summary["exposed_source"] == "waits"
    assert summary["comm_ratio_median"] == 5 / 20
    old = ops.drop(columns=["t_wait_start_ns", "t_wait_end_ns", "wait_ns"])
    summary = sync.sync_tables(old, steps)["sync_summary"].iloc[0]
    assert summary["exposed_source"] == "upper_bound"
    assert summary["comm_ratio_median"] == 12 / 20


def test_the_summary_measures_how_much_communication_the_compute_hid() -> None:
    ops, steps = ddp_step_with_waits()
    summary = sync.sync_tables(ops, steps)["sync_summary"].iloc[0]
    # In flight 12 ms ([1, 12] and [14, 15]), blocked 5 ms ([8, 12] and [14, 15]): 7/12 hidden.
    assert summary["comm_inflight_s"] == 0.012
    assert summary["comm_blocked_s"] == 0.005
    assert summary["comm_overlap"] == pytest.approx(7 / 12)
    # Without waits every op blocks over its whole flight: nothing hidden.
    old = ops.drop(columns=["t_wait_start_ns", "t_wait_end_ns", "wait_ns"])
    assert sync.sync_tables(old, steps)["sync_summary"].iloc[0]["comm_overlap"] == 0.0


def test_the_bubble_keeps_its_rule_when_waits_are_recorded() -> None:
    # 2-stage pipeline, one microbatch: rank 1 posts its recv at 0 ms (and waits on it only
    # from 5 ms), rank 0 sends at 6 ms, done at 7 ms. The bubble is still [recv issue, send
    # issue]: gloo's sends block too, so the recv waits alone would miss idle time.
    rows = [
        op(0, "send", 6, 7, seq=0, peer=1, phase="fwd_bwd", **waited(6, 7)),
        op(1, "recv", 0, 7, seq=0, peer=0, phase="fwd_bwd", **waited(5, 7)),
    ]
    steps = pd.DataFrame([phase(r, 0, p, 0, 10) for r in range(2) for p in ("step", "fwd_bwd")])
    bubble = sync.pipeline_bubble(with_waits(rows), steps, {"pp": 2, "microbatches": 1})
    assert bubble.set_index("rank")["bubble_s"].to_dict() == {0: 0.0, 1: 0.006}
    exposed = sync.exposed_comm(with_waits(rows), steps).set_index("rank")["exposed_comm_s"]
    assert exposed.to_dict() == {0: 0.001, 1: 0.002}


# --------------------------------------------------------------------------------------------
# Counts per step and group kind
# --------------------------------------------------------------------------------------------


def test_counts_per_step_group_kind_and_class() -> None:
    # 4 ranks, dp=2 x tp=2 (mapping pp-dp-ep-tp: TP groups {0,1} {2,3}, DP groups {0,2} {1,3}).
    plan = {"dp": 2, "tp": 2}
    rows = []
    for r in range(4):
        tp = "0,1" if r < 2 else "2,3"
        dp = "0,2" if r % 2 == 0 else "1,3"
        rows += [
            op(r, "allreduce", 1, 2, group=tp, seq=0, nbytes=100),
            op(r, "allreduce", 3, 4, group=tp, seq=1, nbytes=100),
            op(r, "allreduce", 5, 6, group=dp, seq=0, nbytes=1000),
            op(r, "barrier", 7, 8, group="0,1,2,3", seq=0, nbytes=0, step=-1),
        ]
    # one P2P pair from rank 0 to rank 2 on the DP group
    rows += [
        op(0, "send", 9, 10, group="0,2", seq=0, peer=2, nbytes=64),
        op(2, "recv", 9, 10, group="0,2", seq=0, peer=0, nbytes=64),
    ]
    counts = sync.sync_counts(ops_frame(rows), plan)
    got = {
        (s, k, c): (n, i, b)
        for s, k, c, n, i, b in counts[
            ["step", "group_kind", "op_class", "n_ops", "n_instances", "bytes"]
        ].itertuples(index=False)
    }
    assert got == {
        (-1, "world", "barrier"): (4, 1, 0),
        (0, "dp", "collective"): (4, 2, 4000),
        (0, "dp", "p2p"): (2, 1, 128),
        (0, "tp", "collective"): (8, 4, 800),
    }


def test_group_kinds_follow_the_plan() -> None:
    rows = [
        op(0, "allreduce", 0, 1, group="0,1,2,3"),
        op(0, "allreduce", 0, 1, group="0,1"),
        op(0, "send", 0, 1, group="0,4", peer=4),
        op(5, "allreduce", 0, 1, group="5,7"),
        op(3, "allreduce", 0, 1, group="3"),
        op(0, "allreduce", 0, 1, group="0,1,2,3,4,5,6,7"),
    ]
    kinds = sync.group_kinds(ops_frame(rows), {"pp": 2, "dp": 2, "tp": 2})
    assert list(kinds) == ["other", "tp", "pp", "dp", "self", "world"]
    given = ops_frame(rows).assign(group_kind=["ep", None, "", None, None, None])
    kinds = sync.group_kinds(given, {"pp": 2, "dp": 2, "tp": 2})
    assert list(kinds) == ["ep", "tp", "pp", "dp", "self", "world"]
    moe = ops_frame(
        [
            op(0, "alltoall", 0, 1, group="0,1,2,3"),
            op(0, "allreduce", 0, 1, group="0,1,2,3"),
            op(0, "alltoall", 0, 1, group="0,1,2,3,4,5,6,7"),
        ]
    )
    assert list(sync.group_kinds(moe, {"ep": 4, "dp": 2}, world=8)) == ["ep", "dp", "world"]


# --------------------------------------------------------------------------------------------
# Pipeline bubble: 2-stage GPipe, 4 microbatches, 10 ms per forward and per backward
# --------------------------------------------------------------------------------------------

U = 10  # ms per microbatch forward or backward


def gpipe_two_stages() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The steady state of a 2-stage GPipe step with m = 4 and zero transfer time.

    Stage 0 (rank 0, step [0, 10] U): forwards at [i, i+1], sends each activation at i+1; at 4
    it waits for the first gradient, which stage 1 sends at 6; backwards at [6, 10]. Stage 1
    (rank 1, step [-1, 9] U: it finished the previous step one unit early and started this one)
    waits from -1 for the first activation (sent at 1), forwards at [i+1, i+2], backwards at
    [5, 9], sending a gradient after each. Each stage idles 2 U of 10: (p-1)/(p-1+m) = 1/5.
    """
    base = 100  # ms: keep every time positive
    g = "0,1"

    def t(u: float) -> float:
        return base + u * U

    rows = []
    for i in range(4):
        rows.append(op(0, "send", t(i + 1), t(i + 1), group=g, seq=i, peer=1, phase="fwd_bwd"))
        recv_issue = -1 if i == 0 else i + 1
        rows.append(op(1, "recv", t(recv_issue), t(i + 1), group=g, seq=i, peer=0, phase="fwd_bwd"))
        rows.append(op(1, "send", t(6 + i), t(6 + i), group=g, seq=i, peer=0, phase="fwd_bwd"))
        grad_issue = 4 if i == 0 else 6 + i
        rows.append(op(0, "recv", t(grad_issue), t(6 + i), group=g, seq=i, peer=1, phase="fwd_bwd"))
    steps = pd.DataFrame(
        [
            phase(0, 0, "step", t(0), t(10)),
            phase(0, 0, "fwd_bwd", t(0), t(10)),
            phase(1, 0, "step", t(-1), t(9)),
            phase(1, 0, "fwd_bwd", t(-1), t(9)),
        ]
    )
    return ops_frame(rows), steps


PP_PLAN = {"pp": 2, "microbatches": 4, "pp_schedule": "gpipe"}


def test_gpipe_bubble_is_one_fifth() -> None:
    ops, steps = gpipe_two_stages()
    bubble = sync.pipeline_bubble(ops, steps, PP_PLAN)
    assert list(bubble["rank"]) == [0, 1]
    assert list(bubble["stage"]) == [0, 1]
    assert list(bubble["bubble_s"]) == [0.02, 0.02]
    assert list(bubble["bubble_frac_step"]) == [0.2, 0.2]
    assert list(bubble["bubble_frac_fwd_bwd"]) == [0.2, 0.2]
    assert list(bubble["bubble_analytic"]) == [0.2, 0.2]
    assert sync.bubble_analytic(PP_PLAN) == 1 / 5
    summary = sync.sync_tables(ops, steps, PP_PLAN, predicted_bubble_ratio=0.25)["sync_summary"]
    row = summary.iloc[0]
    assert (row["bubble_measured_fwd_bwd"], row["bubble_analytic"]) == (0.2, 0.2)
    assert row["bubble_predicted"] == 0.25
    assert row["p2p_per_step"] == 8.0
    assert row["collectives_per_step"] == 0.0


def test_gpipe_critical_path_and_exposed_time() -> None:
    ops, steps = gpipe_two_stages()
    tables = sync.sync_tables(ops, steps, PP_PLAN)
    # Without the blocking column the recvs' waits count as exposed: 2 U per stage.
    assert list(tables["exposed_comm"]["exposed_comm_s"]) == [0.02, 0.02]
    path = tables["critical_path"]
    # From stage 0's end back: its backwards, then the first gradient (sent by stage 1 at 6),
    # stage 1's backward and forwards back to the first activation (sent by stage 0 at 1),
    # stage 0's first forward.
    compute = path[path["segment"] == "compute"]
    got = [
        (r, (a - T0) // MS, (b - T0) // MS)
        for r, a, b in compute[["rank", "t_start_ns", "t_end_ns"]].itertuples(index=False)
    ]
    assert got == [
        (0, 100, 110),  # stage 0's first forward
        (1, 110, 120),  # stage 1's four forwards, back to back
        (1, 120, 130),
        (1, 130, 140),
        (1, 140, 160),  # its last forward and first backward
        (0, 160, 170),  # stage 0's four backwards
        (0, 170, 180),
        (0, 180, 190),
        (0, 190, 200),
    ]
    comm = path[path["segment"] == "comm"]
    assert set(comm["op"]) == {"recv"} and set(comm["group_kind"]) == {"pp"}
    assert comm["duration_s"].sum() == 0.0  # zero transfer time: the chain is all compute
    summary = tables["sync_summary"].iloc[0]
    assert (summary["critical_path_s"], summary["critical_comm_s"]) == (0.1, 0.0)
    assert summary["critical_ops"] == "recv/pp x8"


def test_no_pipeline_no_bubble_rows() -> None:
    ops, steps = gpipe_two_stages()
    assert sync.pipeline_bubble(ops, steps, {"dp": 2}).empty
    assert list(sync.pipeline_bubble(ops, steps, None).columns) == [
        "cell",
        *sync.BUBBLE_COLUMNS,
    ]
    assert sync.bubble_analytic({"dp": 2}) == 0.0
    assert math.isnan(sync.bubble_analytic(None))


def test_interleaved_bubble_shrinks_by_stages_per_rank() -> None:
    plan = {"pp": 4, "microbatches": 8, "stages_per_rank": 2, "pp_schedule": "interleaved-1f1b"}
    assert sync.bubble_analytic(plan) == 1.5 / 9.5


# --------------------------------------------------------------------------------------------
# Steady step and the table set
# --------------------------------------------------------------------------------------------


def test_steady_step_is_the_median_measured_step() -> None:
    durations = {0: 90, 1: 50, 2: 12, 3: 10, 4: 11}
    steps = pd.DataFrame(
        [phase(r, s, "step", 100 * s, 100 * s + d) for s, d in durations.items() for r in (0, 1)]
    )
    assert sync.steady_step(steps, warmup_steps=2) == 4  # median of 12, 10, 11
    assert sync.steady_step(steps, warmup_steps=0) == 2  # median of all five: 12
    assert sync.steady_step(steps.iloc[0:0]) is None


def test_sync_tables_has_every_table_with_documented_columns() -> None:
    ops, steps = gpipe_two_stages()
    tables = sync.sync_tables(ops, steps, PP_PLAN, warmup_steps=0)
    assert tuple(tables) == sync.SYNC_TABLES
    expected = {
        "sync_counts": sync.SYNC_COUNT_COLUMNS,
        "sync_points": sync.SYNC_POINT_COLUMNS,
        "exposed_comm": sync.EXPOSED_COLUMNS,
        "critical_path": sync.CRITICAL_PATH_COLUMNS,
        "pipeline_bubble": sync.BUBBLE_COLUMNS,
        "sync_summary": sync.SYNC_SUMMARY_COLUMNS,
    }
    for name, columns in expected.items():
        assert list(tables[name].columns) == ["cell", *columns], name
    assert tables["sync_points"].empty  # P2P only: no collective instance
    empty = sync.sync_tables(ops.iloc[0:0], steps.iloc[0:0])
    for name, columns in expected.items():
        assert list(empty[name].columns)[-len(columns) :] == columns, name


def test_sync_tables_refuses_several_cells() -> None:
    ops, steps = gpipe_two_stages()
    two = pd.concat([ops, ops.assign(cell="strategy~y/repeat~0")])
    with pytest.raises(ValueError, match="one cell"):
        sync.sync_tables(two, steps, PP_PLAN)


def test_ops_without_steps_give_counts_and_sync_points_only() -> None:
    ops, _ = gpipe_two_stages()
    tables = sync.sync_tables(ops, pd.DataFrame(), PP_PLAN)  # an imported trace: no steps
    assert tables["sync_counts"]["n_instances"].sum() == 8
    for name in ("exposed_comm", "critical_path", "pipeline_bubble"):
        assert tables[name].empty, name
    assert tables["sync_summary"].iloc[0]["steady_step"] == -1


def test_a_cell_without_ops_gives_empty_tables_with_their_columns() -> None:
    tables = sync.sync_tables(pd.DataFrame(), pd.DataFrame())
    assert set(tables) == set(sync.SYNC_TABLES)
    for name in ("sync_counts", "sync_points", "exposed_comm", "critical_path"):
        assert tables[name].empty, name
