"""Step-time prediction fed by microbenchmark fits, and the measured compute/communication split."""

from __future__ import annotations

import pandas as pd
import pytest

from commscope.predict.cell import rank_step_split
from commscope.predict.ops import predict_ops
from commscope.predict.timing import predict_step_time, wire_bytes

TINY = {"layers": 2, "hidden": 64, "heads": 2, "seq": 32, "vocab": 256, "batch": 4}


def test_per_op_fits_take_precedence_over_scalars() -> None:
    pred = predict_ops(TINY, {"dp": -1}, 2, 1)
    ar = pred[pred.op == "allreduce"]
    fits = {"allreduce": (1e-3, 2e6)}
    t = predict_step_time(pred, 1e12, 0.0, 1e9, 1e9, ab_internode=fits, ab_intranode=fits)
    expected = sum(
        2 * 1e-3 + wire_bytes("allreduce", b, 2) / 2e6 for b in ar[ar["rank"] == 0].bytes
    )
    assert t["comm_s"] == pytest.approx(expected)
    # Without fits the scalars apply; an unfitted op falls back to them too.
    t0 = predict_step_time(pred, 1e12, 0.0, 1e9, 1e9, ab_internode={"sendrecv": (1.0, 1.0)})
    assert t0["comm_s"] == pytest.approx(
        sum(wire_bytes("allreduce", b, 2) / 1e9 for b in ar[ar["rank"] == 0].bytes)
    )


def test_rank_step_split_unions_overlapping_ops() -> None:
    steps = pd.DataFrame(
        [(0, s, "step", s * 1000, s * 1000 + 1000) for s in range(3)],
        columns=["rank", "step", "phase", "t_start_ns", "t_end_ns"],
    )
    ops = pd.DataFrame(
        # step 2: two overlapping ops (100-400, 300-500) and one past the step's end (900-1200)
        [(0, 2, 2100, 2400), (0, 2, 2300, 2500), (0, 2, 2900, 3200), (0, 0, 0, 999)],
        columns=["rank", "step", "t_issue_ns", "t_end_ns"],
    ).astype({"t_end_ns": "Int64"})
    split = rank_step_split(ops, steps, warmup_steps=1).set_index("step")
    assert list(split.index) == [1, 2]
    assert split.loc[1, "comm_s"] == 0 and split.loc[1, "compute_s"] == pytest.approx(1e-6)
    assert split.loc[2, "comm_s"] == pytest.approx(500e-9)  # 400 + 100 clipped at the end
    assert split.loc[2, "compute_s"] == pytest.approx(500e-9)


def test_gloo_reduce_scatter_is_timed_as_the_all_reduce_gloo_runs() -> None:
    # ZeRO-style reduce-scatters: NCCL's ring sends (n-1)/n S, gloo a full all-reduce of S.
    pred = predict_ops(TINY, {"dp": -1}, 4, 1)
    pred = pred.assign(op="reduce_scatter")
    nccl = predict_step_time(pred, 1e12, 1e-3, 1e6, 1e6)
    gloo = predict_step_time(pred, 1e12, 1e-3, 1e6, 1e6, backend="gloo")
    as_allreduce = predict_step_time(pred.assign(op="allreduce"), 1e12, 1e-3, 1e6, 1e6)
    assert gloo["comm_s"] == pytest.approx(as_allreduce["comm_s"])
    assert nccl["comm_s"] < gloo["comm_s"]
    assert wire_bytes("reduce_scatter", 100.0, 4, "gloo") == wire_bytes("allreduce", 100.0, 4)


def test_rank_step_split_counts_compute_under_an_async_op_where_waits_are_recorded() -> None:
    steps = pd.DataFrame(
        [(0, 0, "step", 0, 1000)], columns=["rank", "step", "phase", "t_start_ns", "t_end_ns"]
    )
    # A bucket all-reduce in flight over [100, 800), waited on over [700, 800) only.
    ops = pd.DataFrame(
        [(0, 0, 100, 800, 100, 700, 800)],
        columns=[
            "rank",
            "step",
            "t_issue_ns",
            "t_end_ns",
            "wait_ns",
            "t_wait_start_ns",
            "t_wait_end_ns",
        ],
    ).astype("Int64")
    split = rank_step_split(ops, steps, warmup_steps=0)
    assert split.loc[0, "comm_s"] == pytest.approx(100e-9)
    assert split.loc[0, "compute_s"] == pytest.approx(900e-9)
    unknown = ops.drop(columns=["wait_ns", "t_wait_start_ns", "t_wait_end_ns"])
    assert rank_step_split(unknown, steps, 0).loc[0, "comm_s"] == pytest.approx(700e-9)
