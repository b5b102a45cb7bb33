"""The step-time model's host terms: per-rank compute rates, the per-collective fixed cost
measured from the trace, a P2P message counted once, and durations from the last arrival."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from commscope.predict.cell import CellLinks, collective_overhead_s, rank_compute_rates
from commscope.predict.ops import predict_ops
from commscope.predict.timing import (
    ddp_exposed_s,
    effective_bandwidth,
    last_arrival_ns,
    op_times,
    predict_step_time,
    wire_bytes,
)
from commscope.spec.settings import CellSettings

TINY = {"layers": 2, "hidden": 64, "heads": 2, "seq": 32, "vocab": 256, "batch": 4}
MS = 1_000_000  # ns


def _cell() -> CellSettings:
    return CellSettings.from_mapping(
        dict(strategy="tp", model="tiny", nodes=2, ranks_per_node=1, bw="none", delay="0ms",
             jitter="0ms", loss="0pct", cc="cubic", steps=4, repeat=0)
    )  # fmt: skip


def _op(rank: int, seq: int, issue_ms: float, end_ms: float, wait_ms: float | None = None,
        op: str = "allreduce", nbytes: int = 1_000_000, step: int = 2) -> dict:  # fmt: skip
    wait = issue_ms if wait_ms is None else wait_ms
    return dict(rank=rank, op=op, bytes=nbytes, group_ranks="0,1", group_size=2, peer=-1,
                seq=seq, step=step, t_issue_ns=int(issue_ms * MS), t_end_ns=int(end_ms * MS),
                t_wait_start_ns=int(wait * MS))  # fmt: skip


def _ops(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows).astype({"t_end_ns": "Int64", "t_wait_start_ns": "Int64"})


def test_rank_compute_rates_are_each_ranks_own() -> None:
    rates = rank_compute_rates({0: 4e9, 1: 4e9, 2: 0.0}, pd.Series({0: 1.0, 1: 2.0, 2: 0.5}))
    assert rates[0] == 4e9 and rates[1] == 2e9
    assert rates[2] == pytest.approx(8e9 / 3.5)  # no FLOPs of its own: the pooled rate
    pred = predict_ops(TINY, {"dp": -1}, 2, 1)
    flops = pred.attrs["predict"]["flops"]
    fast = predict_step_time(pred, 1e9, 0.0, math.inf, math.inf)
    slow = predict_step_time(pred, {0: 1e9, 1: 0.5e9}, 0.0, math.inf, math.inf)
    # ranks that synchronise run at the slowest one's pace
    assert slow["critical_rank"] == 1
    assert slow["compute_s"] == pytest.approx(flops[1] / 0.5e9) == 2 * fast["compute_s"]


def test_op_overhead_is_added_to_collectives_only() -> None:
    pp = predict_ops(TINY, {"pp": -1, "microbatches": 2}, 2, 1)
    pred = pd.concat([pp, predict_ops(TINY, {"dp": -1}, 2, 1)], ignore_index=True)
    pred.attrs = pp.attrs
    base = op_times(pred, 0.0, 1e9, 1e9)
    more = op_times(pred, 0.0, 1e9, 1e9, op_overhead_s=0.01)
    p2p = pred["op"].isin(["send", "recv"])
    assert (more[p2p] == base[p2p]).all()
    assert (more[~p2p] - base[~p2p]).to_numpy() == pytest.approx(0.01)


def test_p2p_once_counts_a_message_at_its_receiver() -> None:
    pp = predict_ops(TINY, {"pp": -1, "microbatches": 4}, 2, 1)
    both = predict_step_time(pp, math.inf, 0.0, 1e6, 1e6)
    once = predict_step_time(pp, math.inf, 0.0, 1e6, 1e6, p2p_once=True)
    for t, ops in ((both, {"send", "recv"}), (once, {"recv"})):
        sel = pp[pp["op"].isin(ops)]
        per_rank = sel.groupby("rank")["bytes"].sum() / 1e6
        assert t["comm_by_traffic_s"]["pp"] == pytest.approx(per_rank.max())


def test_last_arrival_and_effective_bandwidth_from_it() -> None:
    # rank 0 issues at 0 ms, rank 1 at 90 ms; both end at 100 ms: the wire took 10 ms
    big = 2_000_000  # above effective_bandwidth's 1 MiB floor
    ops = _ops([_op(0, 0, 0, 100, nbytes=big), _op(1, 0, 90, 100, nbytes=big)])
    assert list(last_arrival_ns(ops)) == [90 * MS, 90 * MS]
    bw = effective_bandwidth(ops, ranks_per_node=1)
    assert bw["internode"] == pytest.approx(wire_bytes("allreduce", big, 2) / 0.010)


def test_collective_overhead_from_the_last_arrivals_excess() -> None:
    links = CellLinks("test", "test", 1e9, 1e9, {"allreduce": (0.0, 1e9)}, {})
    ab = wire_bytes("allreduce", 1_000_000, 2, "gloo") / 1e9  # 1 ms
    rows = []
    for seq, excess in enumerate((4.0, 5.0, 6.0)):  # ms beyond the alpha-beta time
        start = 10.0 * seq
        end = start + 3 + ab * 1e3 + excess
        rows += [_op(0, seq, start, end), _op(1, seq, start + 3, end)]
    # ops in flight together (gloo's two threads run DDP's buckets at once) do not count
    rows += [_op(0, 9, 40, 200, wait_ms=150), _op(1, 9, 40, 200, wait_ms=150)]
    rows += [_op(0, 10, 45, 200), _op(1, 10, 45, 200)]
    ops = _ops(rows)
    got = collective_overhead_s(ops, _cell(), links, warmup_steps=2, backend="gloo")
    # the median of 4, 5 and 6 ms; ops 9 and 10, concurrent, are left out
    assert got == pytest.approx(0.005)
    assert collective_overhead_s(ops.iloc[:0], _cell(), links, 2, "gloo") == 0.0


def test_ddp_buckets_hide_under_the_rest_of_the_backward() -> None:
    buckets = pd.DataFrame({"seq": [0, 1], "bytes": [1, 3], "time_s": [0.2, 0.3]})
    # backward 2/3 of 0.9 s = 0.6 s; after the first bucket (1/4 of the bytes) 0.45 s remain
    assert ddp_exposed_s(buckets, 0.9) == pytest.approx(max(0.3, 0.5 - 0.45))
    assert ddp_exposed_s(buckets, 0.0) == pytest.approx(0.5)  # nothing to hide under
    pred = predict_ops(TINY, {"dp": -1, "bucket_cap_mb": 0.01}, 2, 1)
    whole = predict_step_time(pred, 1e6, 0.0, 1e5, 1e5)
    hidden = predict_step_time(pred, 1e6, 0.0, 1e5, 1e5, ddp_overlap=True)
    assert whole["comm_by_traffic_s"]["dp"] == pytest.approx(whole["comm_s"])
    assert hidden["comm_s"] < whole["comm_s"]
    assert hidden["step_time_s"] == pytest.approx(hidden["compute_s"] + hidden["comm_s"])
    fsdp = predict_ops(TINY, {"dp": -1, "dp_kind": "fsdp"}, 2, 1)
    assert predict_step_time(fsdp, 1e6, 0.0, 1e5, 1e5, ddp_overlap=True)["comm_s"] == (
        pytest.approx(predict_step_time(fsdp, 1e6, 0.0, 1e5, 1e5)["comm_s"])
    )


def test_uneven_stages_wait_for_the_other_stages() -> None:
    pp = predict_ops(TINY, {"pp": -1, "microbatches": 4}, 2, 1)
    flops = pp.attrs["predict"]["flops"]
    equal = {r: flops[r] for r in flops}  # rate = FLOPs: every stage 1 s
    even = predict_step_time(pp, equal, 0.0, math.inf, math.inf)
    assert predict_step_time(pp, equal, 0.0, math.inf, math.inf, uneven_stages=True)[
        "bubble_s"
    ] == pytest.approx(even["bubble_s"])  # Eq. 6 when the stages are equal
    slow = {0: flops[0] / 3, 1: flops[1]}  # stage 0 takes 3 s, stage 1 1 s
    t = predict_step_time(pp, slow, 0.0, math.inf, math.inf, uneven_stages=True)
    assert t["critical_rank"] == 0
    # fill and drain through the other stage's micro-batches (1 s / 4), not p - 1 of its own
    assert t["bubble_s"] == pytest.approx(1 / 4)
    assert t["step_time_s"] == pytest.approx(3 + 1 / 4)
