"""Metrics against synthetic traces whose answers are known in closed form (see synthetic.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from synthetic import (
    DDP_EXPECTED,
    MS,
    T0_NS,
    constant_rate_counters,
    make_ddp_cell,
    on_off_counters,
    piecewise_counters,
)

from commscope import metrics as m
from commscope.collectives.traffic import ring_send_bytes
from commscope.contracts import METRIC_TABLES, PARAM_COLUMNS

approx = pytest.approx


@pytest.fixture(scope="module")
def ddp_cell(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ddp_cell(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def traces(ddp_cell: Path) -> m.CellTraces:
    return m.load_cell(ddp_cell)


def _shape_row(shape: pd.DataFrame, bin_ms: float, direction: str = "tx") -> pd.Series:
    rows = shape[(shape["bin_ms"] == bin_ms) & (shape["direction"] == direction)]
    assert len(rows) == 1
    return rows.iloc[0]


# ------------------------------------------------------------------------------ loading, steps


def test_load_cell_reads_all_tables(traces: m.CellTraces) -> None:
    assert traces.meta["world_size"] == 2
    assert traces.warmup_steps == 1
    assert traces.params["strategy"] == "ddp"
    assert traces.params["cell"].startswith("strategy~ddp/")
    assert len(traces.ops) == 2 * (1 + 5 * 3)  # broadcast + 5 steps x (2 buckets + barrier)
    assert set(traces.counters["node"]) == {0, 1}


def test_step_times_span_all_ranks_and_flag_warmup(traces: m.CellTraces) -> None:
    st = m.step_times(traces.steps, warmup_steps=1)
    assert st["step"].tolist() == [0, 1, 2, 3, 4]
    assert st["duration_s"].tolist() == approx([0.12, 0.1, 0.1, 0.1, 0.1], abs=1e-12)
    assert st["warmup"].tolist() == [True, False, False, False, False]
    assert st["n_ranks"].tolist() == [2] * 5
    assert st["start_spread_s"].tolist() == approx([0.001] * 5, abs=1e-12)
    # The first step starts when rank 0 enters it: 10 ms after t0.
    assert st["t_start_ns"].iloc[0] == T0_NS + 10 * MS
    # Cell parameters lead the table so aggregation is a concat.
    assert st.columns[0] == "cell" and (st["strategy"] == "ddp").all()


def test_training_window_covers_measured_steps(traces: m.CellTraces) -> None:
    st = m.step_times(traces.steps, warmup_steps=1)
    assert m.training_window(st) == (T0_NS + 130 * MS, T0_NS + 530 * MS)


def test_zoom_window_is_the_typical_measured_step(traces: m.CellTraces) -> None:
    st = m.step_times(traces.steps, warmup_steps=1)
    # Equal steps (100 ms each): the latest of the equally typical ones.
    assert m.zoom_window(st) == (T0_NS + 430 * MS, T0_NS + 530 * MS)
    # Measured steps of 100, 100, 160 and 40 ms (a stall stretches one, the next catches up):
    # median 100 ms, so the second 100 ms step, not the last (40 ms) one.
    stalled = st.copy()
    stalled.loc[stalled["step"] == 3, "t_end_ns"] += 60 * MS
    stalled.loc[stalled["step"] == 4, "t_start_ns"] += 60 * MS
    assert m.zoom_window(stalled) == (T0_NS + 230 * MS, T0_NS + 330 * MS)
    # Every step a warm-up step: the last step all the same.
    assert m.zoom_window(m.step_times(traces.steps, warmup_steps=9)) == m.zoom_window(st)
    # Found by start time, not by row order; a warm-up step after it is not measured.
    shuffled = st.iloc[::-1].reset_index(drop=True)
    assert m.zoom_window(shuffled) == m.zoom_window(st)
    late_warmup = st.assign(warmup=st["step"].isin([0, 4]))
    assert m.zoom_window(late_warmup) == (T0_NS + 330 * MS, T0_NS + 430 * MS)


# ------------------------------------------------------------------------------ volume, sizes


def test_op_volume_per_rank_and_per_step(traces: m.CellTraces) -> None:
    per_rank = m.op_volume(traces.ops)
    ar = per_rank[(per_rank["op"] == "allreduce") & (per_rank["step"] == 2)]
    assert ar[["rank", "node", "bytes", "count"]].values.tolist() == [
        [0, 0, 1_000_000, 2],
        [1, 1, 1_000_000, 2],
    ]
    per_step = m.op_volume(traces.ops, per_rank=False)
    ar = per_step[per_step["op"] == "allreduce"]
    assert ar["bytes"].tolist() == [2_000_000] * 5
    assert ar["count"].tolist() == [4] * 5
    assert ar["n_ranks"].tolist() == [2] * 5
    bc = per_step[per_step["op"] == "broadcast"]
    assert bc[["step", "bytes", "count"]].values.tolist() == [[-1, 800_000, 2]]
    # Summing the per-rank table gives the per-step table.
    assert per_rank["bytes"].sum() == per_step["bytes"].sum() == 10_800_000


def test_bytes_per_step(traces: m.CellTraces) -> None:
    bps = m.bytes_per_step(traces.ops)
    assert bps["step"].tolist() == [-1, 0, 1, 2, 3, 4]
    assert bps["bytes"].tolist() == [800_000] + [2_000_000] * 5
    assert bps["messages"].tolist() == [2] + [6] * 5


def test_message_sizes_flag_measured_steps(traces: m.CellTraces) -> None:
    msgs = m.message_sizes(traces.ops, warmup_steps=1)
    assert len(msgs) == len(traces.ops)
    assert msgs["measured"].sum() == 2 * 4 * 3  # 2 ranks x 4 measured steps x 3 ops
    assert not msgs.loc[msgs["step"] <= 0, "measured"].any()


def test_size_cdf_is_exact_monotone_and_ends_at_one(traces: m.CellTraces) -> None:
    cdf = m.size_cdf(traces.ops)
    assert "barrier" not in set(cdf["op"])  # zero-byte ops have no place on a log axis
    ar = cdf[cdf["op"] == "allreduce"]
    assert ar[["bytes", "count", "cum_fraction"]].values.tolist() == [
        [400_000, 10, 0.5],
        [600_000, 10, 1.0],
    ]
    pooled = m.size_cdf(traces.ops, by=["strategy"])
    assert pooled["bytes"].tolist() == [400_000, 600_000]
    assert pooled["cum_fraction"].tolist() == approx([12 / 22, 1.0])
    for _, group in cdf.groupby("op"):
        assert np.all(np.diff(group["cum_fraction"]) > 0)
        assert group["cum_fraction"].iloc[-1] == 1.0


# ------------------------------------------------------------------------------ throughput


def test_constant_rate_is_flat_at_every_bin_width() -> None:
    counters = constant_rate_counters(8e6, duration_ms=1000)
    shape = m.traffic_shape(counters, (T0_NS, T0_NS + 1000 * MS))
    for bin_ms, n_bins in ((1, 1000), (10, 100), (100, 10)):
        row = _shape_row(shape, bin_ms)
        assert row["n_bins"] == n_bins
        assert row["mean_bps"] == approx(8e6, rel=1e-12)
        assert row["peak_bps"] == approx(8e6, rel=1e-12)
        assert row["peak_to_mean"] == approx(1.0, rel=1e-12)
        assert row["cov"] == approx(0.0, abs=1e-12)
        assert bool(row["resolved"])
        tp = m.throughput(counters, bin_ms)
        assert len(tp) == n_bins
        assert tp["tx_bps"].to_numpy() == approx(np.full(n_bins, 8e6), rel=1e-12)
        # 8 Mbit in one second, whatever the bin width.
        assert (tp["tx_bps"] * bin_ms / 8000).sum() == approx(1_000_000)


def test_on_off_traffic_has_expected_burstiness() -> None:
    # 16 Mbit/s for the first 50 ms of every 100 ms: duty cycle 1/2.
    counters = on_off_counters(16e6, period_ms=100, on_ms=50, periods=10)
    shape = m.traffic_shape(counters, (T0_NS, T0_NS + 1000 * MS))
    for bin_ms in (1, 10):
        row = _shape_row(shape, bin_ms)
        assert row["mean_bps"] == approx(8e6)
        assert row["peak_bps"] == approx(16e6)
        assert row["peak_to_mean"] == approx(2.0)
        assert row["cov"] == approx(1.0)
    # A 100 ms bin holds exactly one on and one off period: the bursts average out.
    row = _shape_row(shape, 100)
    assert row["peak_to_mean"] == approx(1.0)
    assert row["cov"] == approx(0.0, abs=1e-12)


def test_short_duty_cycle() -> None:
    # On 10 ms out of 100 ms: peak/mean = 1/d = 10, cov = sqrt((1 - d) / d) = 3.
    counters = on_off_counters(80e6, period_ms=100, on_ms=10, periods=5)
    row = _shape_row(m.traffic_shape(counters, (T0_NS, T0_NS + 500 * MS)), 10)
    assert row["mean_bps"] == approx(8e6)
    assert row["peak_to_mean"] == approx(10.0)
    assert row["cov"] == approx(3.0)


def test_irregular_sampling_is_interpolated_exactly() -> None:
    # 8 Mbit/s is one byte per microsecond: counters sampled at random microseconds are
    # exact integers, and interpolation onto the bin edges must recover the rate exactly.
    rng = np.random.default_rng(7)
    times_us = np.unique(np.concatenate([[0, 1_000_000], rng.integers(0, 1_000_000, 300)]))
    counters = constant_rate_counters(8e6, 1000, sample_times_ns=T0_NS + times_us * 1000)
    tp = m.throughput(counters, 10)
    assert len(tp) == 100
    assert tp["tx_bps"].to_numpy() == approx(np.full(100, 8e6), rel=1e-9)
    assert tp["t_start_ns"].iloc[0] == T0_NS
    assert (np.diff(tp["t_start_ns"]) == 10 * MS).all()


def test_counter_reset_never_gives_negative_rates() -> None:
    times = T0_NS + np.arange(0, 101) * MS
    counters = constant_rate_counters(8e6, 100, sample_times_ns=times)
    # The interface is recreated at 50 ms: the counter restarts from zero.
    counters.loc[counters["t_ns"] >= T0_NS + 50 * MS, ["tx_bytes", "rx_bytes"]] -= 7_000_050_000
    assert counters["tx_bytes"].diff().min() < 0
    tp = m.throughput(counters, 1)
    assert (tp[["tx_bps", "rx_bps"]] >= 0).all().all()
    # Only the interval across the reset is lost: 99 of 100 ms at 1000 bytes/ms.
    assert (tp["tx_bps"] / 8000).sum() == approx(99_000)
    assert (tp["tx_bps"] == 0).sum() == 1


def test_bins_finer_than_sampling_are_flagged_not_faked() -> None:
    counters = constant_rate_counters(8e6, duration_ms=1000, sample_ms=5)
    shape = m.traffic_shape(counters, (T0_NS, T0_NS + 1000 * MS))
    fine = _shape_row(shape, 1)
    assert not fine["resolved"]
    assert fine["sample_interval_ms"] == approx(5.0)
    assert math.isnan(fine["peak_bps"])
    assert math.isnan(fine["peak_to_mean"])
    assert math.isnan(fine["cov"])
    assert fine["mean_bps"] == approx(8e6)  # the average does not depend on resolution
    coarse = _shape_row(shape, 10)
    assert coarse["resolved"]
    assert coarse["peak_to_mean"] == approx(1.0)
    assert not m.throughput(counters, 1)["resolved"].any()
    assert m.throughput(counters, 10)["resolved"].all()


def test_shape_of_ddp_cell(traces: m.CellTraces) -> None:
    window = m.training_window(m.step_times(traces.steps, 1))
    shape = m.traffic_shape(traces.counters, window)
    assert set(shape["node"]) == {0, 1}
    for node in (0, 1):
        node_shape = shape[shape["node"] == node]
        for bin_ms in (1, 10):
            row = _shape_row(node_shape, bin_ms)
            assert row["mean_bps"] == approx(84e6)
            assert row["peak_bps"] == approx(420e6)
            assert row["peak_to_mean"] == approx(5.0)
            assert row["cov"] == approx(2.0)
        assert _shape_row(node_shape, 100)["peak_to_mean"] == approx(1.0)


# ------------------------------------------------------------------------------ wire model


def test_ring_send_bytes() -> None:
    s = 1_000_000
    assert ring_send_bytes("allreduce", s, 2) == s
    assert ring_send_bytes("allreduce", s, 4) == 1.5 * s
    assert ring_send_bytes("allreduce", s, 8) == 1.75 * s
    assert ring_send_bytes("reduce_scatter", s, 4) == 0.75 * s
    assert ring_send_bytes("allgather", s, 4) == 3 * s  # input is the shard
    assert ring_send_bytes("alltoall", s, 4) == 0.75 * s
    # Chain broadcast: the root and every rank but the last send S once; (n-1) S in total.
    assert ring_send_bytes("broadcast", s, 4, is_root=True) == s
    assert ring_send_bytes("broadcast", s, 4, is_root=False) == approx(2 / 3 * s)
    assert ring_send_bytes("broadcast", s, 4) == 0.75 * s  # root unknown: even share
    assert ring_send_bytes("reduce", s, 4, is_root=True) == 0
    assert ring_send_bytes("scatter", 4 * s, 4, is_root=True) == 3 * s
    assert ring_send_bytes("scatter", s, 4, is_root=False) == 0
    assert ring_send_bytes("gather", s, 4, is_root=False) == s
    assert ring_send_bytes("gather", s, 4, is_root=True) == 0
    assert ring_send_bytes("send", s, 2) == s
    assert ring_send_bytes("recv", s, 2) == 0
    assert ring_send_bytes("barrier", 0, 4) == 0
    assert ring_send_bytes("allreduce", s, 1) == 0  # a group of one talks to nobody
    with pytest.raises(ValueError, match="no traffic model"):
        ring_send_bytes("all_to_all_single_typo", s, 2)


def test_wire_vs_framework_per_node(traces: m.CellTraces) -> None:
    wf = m.wire_vs_framework(traces.ops, traces.counters, traces.meta).set_index("node")
    steps, grad, params = 5, 1_000_000, 400_000
    # Framework: each rank's ring share of the gradients (n=2: all of it) plus an even share
    # of the broadcast, whose root the trace does not record.
    assert wf.loc[0, "framework_tx_bytes"] == approx(steps * grad + params / 2)
    assert wf.loc[1, "framework_tx_bytes"] == approx(steps * grad + params / 2)
    assert wf.loc[0, "estimated_tx_bytes"] == approx(params / 2)
    # Wire: 1.05 x the actual sends; the broadcast root (node 0) sent the parameters.
    assert wf.loc[0, "wire_tx_bytes"] == approx(1.05 * (steps * grad + params))
    assert wf.loc[1, "wire_tx_bytes"] == approx(1.05 * steps * grad)
    assert wf.loc[1, "wire_rx_bytes"] == approx(1.05 * (steps * grad + params))
    total = wf["wire_tx_bytes"].sum() / wf["framework_tx_bytes"].sum()
    assert total == approx(1.05)
    assert wf.loc[1, "wire_over_framework"] == approx(1.05 * 5 / 5.2)
    assert wf["covered"].all()
    assert wf["window_start_ns"].iloc[0] == T0_NS + 2 * MS  # the first op's issue
    assert wf["strategy"].iloc[0] == "ddp"


def _op(rank: int, op: str, nbytes: int, group: str, peer: int = -1, root: int = -1) -> dict:
    return {
        "root": root,
        "rank": rank,
        "node": rank // 2,
        "step": 0,
        "op": op,
        "bytes": nbytes,
        "group_ranks": group,
        "group_size": len(group.split(",")),
        "peer": peer,
        "t_issue_ns": T0_NS,
        "t_end_ns": T0_NS + 10 * MS,
    }


def test_only_internode_traffic_counts_toward_the_wire() -> None:
    # 2 nodes x 2 ranks: ranks 0, 1 on node 0 and ranks 2, 3 on node 1.
    ops = [_op(r, "allreduce", 4000, "0,1,2,3") for r in range(4)]  # ring 0-1-2-3-0
    ops += [_op(r, "allreduce", 8000, "0,1") for r in (0, 1)]  # inside node 0: loopback
    ops += [_op(1, "send", 100, "1,2", peer=2), _op(2, "recv", 100, "1,2", peer=1)]
    ops += [_op(0, "send", 50, "0,1", peer=1), _op(1, "recv", 50, "0,1", peer=0)]
    ops += [_op(r, "broadcast", 3000, "0,1,2,3") for r in range(4)]  # root not recorded
    meta = {"cell": "c", "params": {"ranks_per_node": 2}}
    wf = m.wire_vs_framework(pd.DataFrame(ops), pd.DataFrame(), meta).set_index("node")
    # Ring allreduce: 2(n-1)/n x 4000 = 6000 per rank; only 1->2 and 3->0 cross nodes.
    # Broadcast: even share 3/4 x 3000 = 2250 per rank, crossing on the same ring edges.
    assert wf.loc[0, "framework_tx_bytes"] == 6000 + 100 + 2250
    assert wf.loc[1, "framework_tx_bytes"] == 6000 + 2250
    assert wf["estimated_tx_bytes"].tolist() == [2250, 2250]
    assert wf.loc[0, "framework_tx_bytes_with_local"] == 2 * (6000 + 2250) + 2 * 8000 + 150
    assert wf.loc[1, "framework_tx_bytes_with_local"] == 2 * (6000 + 2250)
    assert wf["wire_tx_bytes"].isna().all()  # no counters: nothing to compare
    assert not wf["covered"].any()


def test_recorded_root_makes_rooted_ops_exact() -> None:
    # Broadcast from rank 0 along the chain 0->1->2->3: only 1->2 crosses nodes, rank 3 is
    # last and forwards nothing. Gather to rank 2: ranks 0 and 1 send theirs across nodes,
    # rank 3 stays on node 1.
    ops = [_op(r, "broadcast", 3000, "0,1,2,3", root=0) for r in range(4)]
    ops += [_op(r, "gather", 500, "0,1,2,3", root=2) for r in range(4)]
    meta = {"cell": "c", "params": {"ranks_per_node": 2}}
    wf = m.wire_vs_framework(pd.DataFrame(ops), pd.DataFrame(), meta).set_index("node")
    assert wf.loc[0, "framework_tx_bytes"] == 3000 + 2 * 500
    assert wf.loc[1, "framework_tx_bytes"] == 0
    assert wf.loc[1, "framework_tx_bytes_with_local"] == 3000 + 500  # 2->3 and 3->2
    assert wf["estimated_tx_bytes"].tolist() == [0, 0]


# ------------------------------------------------------------------------------ summary, files


def test_cell_summary_matches_known_answers(traces: m.CellTraces) -> None:
    summary = m.cell_summary(traces)
    assert len(summary) == 1
    row = summary.iloc[0]
    assert row["measured_steps"] == 4
    assert row["world_size"] == 2
    assert row["bw_bps"] == 1e9
    for key, expected in DDP_EXPECTED.items():
        assert row[key] == approx(expected, abs=1e-9), key
    assert row["bw_utilization"] == approx(0.084)
    assert row["p2p_byte_share"] == 0.0
    assert bool(row["shape_resolved_10ms"])
    assert list(summary.columns[: len(PARAM_COLUMNS)]) == list(PARAM_COLUMNS)


def test_uncapped_cell_has_nan_utilization(tmp_path: Path) -> None:
    cell = make_ddp_cell(tmp_path, bw="none", step_ms=(100, 100))
    row = m.cell_summary(m.load_cell(cell)).iloc[0]
    assert math.isnan(row["bw_bps"])
    assert math.isnan(row["bw_utilization"])
    assert math.isnan(row["step_time_std_s"])  # one measured step has no spread
    assert row["step_time_mean_s"] == approx(0.1)


def test_compute_and_aggregate_cells(tmp_path: Path) -> None:
    metric_dirs = []
    for strategy in ("ddp", "fsdp"):
        cell = make_ddp_cell(tmp_path / "runs", strategy=strategy, step_ms=(100, 100, 100))
        out = tmp_path / "metrics" / strategy
        m.compute_cell_metrics(cell, out)
        metric_dirs.append(out)
    for name in METRIC_TABLES:
        assert (metric_dirs[0] / f"{name}.parquet").exists(), name
    tp = pd.read_parquet(metric_dirs[0] / "throughput.parquet")
    assert sorted(tp["bin_ms"].unique()) == [0.1, 1.0, 10.0, 100.0]
    # Epoch-aligned edges: every 100 ms bin edge is also a 10 ms, 1 ms and 100 µs edge.
    assert (tp["t_start_ns"] % (tp["bin_ms"] * MS).round().astype("int64") == 0).all()
    # 100 µs bins only over the typical measured step, the figure's zoom (10 ms, the 100 ms
    # warm-up step, then 110-210 and 210-310 ms): 1,000 per node; 1 ms over the whole run.
    fine = tp[tp["bin_ms"] == 0.1]
    assert fine["t_start_ns"].min() == T0_NS + 210 * MS
    assert fine["t_start_ns"].max() == T0_NS + 310 * MS - 100_000
    assert fine.groupby("node").size().tolist() == [1000, 1000]
    assert tp.loc[tp["bin_ms"] == 1.0, "t_start_ns"].min() < T0_NS + 110 * MS

    m.aggregate_cells(metric_dirs, tmp_path / "agg")
    for name in METRIC_TABLES:
        per_cell = [pd.read_parquet(d / f"{name}.parquet") for d in metric_dirs]
        agg = pd.read_parquet(tmp_path / "agg" / f"{name}.parquet")
        assert len(agg) == sum(len(t) for t in per_cell), name
        if len(agg):  # matrix_check stays empty without a packet capture
            assert sorted(agg["strategy"].unique()) == ["ddp", "fsdp"], name
    summary = pd.read_parquet(tmp_path / "agg" / "summary.parquet")
    assert summary["framework_bytes_per_step"].tolist() == [2e6, 2e6]


def test_empty_inputs_give_documented_columns() -> None:
    empty = pd.DataFrame(columns=["rank", "node", "step", "op", "bytes"])
    assert list(m.op_volume(empty).columns) == ["rank", "node", "step", "op", "bytes", "count"]
    assert list(m.size_cdf(empty, by=["op"]).columns) == ["op", "bytes", "count", "cum_fraction"]
    assert m.throughput(pd.DataFrame(columns=["node", "t_ns"]), 10).empty


def test_piecewise_counters_helper_is_cumulative() -> None:
    # Guard the fixture itself: cumulative, integer, starting at the kernel base value.
    c = piecewise_counters(0, [(0, 0), (10, 1000)], T0_NS + np.arange(0, 11) * MS)
    assert np.all(np.diff(c["tx_bytes"]) == 100)
