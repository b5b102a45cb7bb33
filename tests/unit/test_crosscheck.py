"""Backend-aware traffic model (gloo's algorithms) and the per-cell cross-validation of the
wire against the recorded ops, on hand-built traces whose answers are known exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from commscope import metrics as m

MB = 1_000_000
STEP_NS = 100_000_000
T0 = 1_700_000_000_000_000_000
HDR = m.HEADER_BYTES_PER_PACKET
PRE = m.GLOO_PREAMBLE_BYTES


# ------------------------------------------------------------------------ gloo's algorithms


def test_gloo_ring_chunks_follow_allreduce_cc() -> None:
    # 10 float32 over 4 ranks: 8 segments of 2 elements (8 B), chunks of 2 segments.
    assert m.gloo_ring_chunks(40, 4, element_size=4) == [16, 16, 8, 0]
    # Large buffers: segments capped at 1 MiB, still summing to S.
    big = 10 * 2**20 + 12
    chunks = m.gloo_ring_chunks(big, 4, element_size=4)
    assert sum(chunks) == big and len(chunks) == 4


def test_gloo_allreduce_goes_to_the_previous_rank() -> None:
    s = 4 * MB
    dests = m.op_destinations("allreduce", s, "0,1,2,3", 1, backend="gloo", element_size=4)
    assert [d for d, _ in dests] == [0]  # sendRank = rank - 1 in gloo's ring
    assert dests[0][1] == pytest.approx(1.5 * s)
    # The ring model of other backends sends to the next rank.
    assert m.op_destinations("allreduce", s, "0,1,2,3", 1) == [(2, 1.5 * s)]


def test_gloo_uneven_allreduce_sends_all_chunks_but_two() -> None:
    chunks = [16, 16, 8, 0]  # see test_gloo_ring_chunks_follow_allreduce_cc
    sent = {
        r: sum(
            b
            for _, b in m.op_destinations(
                "allreduce", 40, [0, 1, 2, 3], r, backend="gloo", element_size=4
            )
        )
        for r in range(4)
    }
    for r in range(4):
        assert sent[r] == 2 * 40 - chunks[r] - chunks[(r - 1) % 4]
    assert sum(sent.values()) == 2 * 3 * 40  # every byte crosses n-1 links twice


def test_gloo_reduce_scatter_is_a_full_allreduce() -> None:
    s = 2 * MB
    for n in (2, 4):
        rs = m.ring_send_bytes("reduce_scatter", s, n, backend="gloo")
        ar = m.ring_send_bytes("allreduce", s, n, backend="gloo")
        assert rs == ar == pytest.approx(2 * (n - 1) / n * s)
        assert m.ring_send_bytes("reduce_scatter", s, n) == pytest.approx((n - 1) / n * s)


def test_gloo_broadcast_is_a_binomial_tree() -> None:
    s = 1000
    tree = {
        r: m.op_destinations("broadcast", s, "0,1,2,3", r, root=0, backend="gloo") for r in range(4)
    }
    assert tree == {0: [(1, s), (2, s)], 1: [(3, s)], 2: [], 3: []}
    # Root 2: virtual ranks shift, the tree is the same shape.
    shifted = {
        r: m.op_destinations("broadcast", s, "0,1,2,3", r, root=2, backend="gloo") for r in range(4)
    }
    assert shifted == {2: [(3, s), (0, s)], 3: [(1, s)], 0: [], 1: []}
    # Unknown root: the expectation over roots keeps the (n-1) S total.
    total = sum(
        b
        for r in range(4)
        for _, b in m.op_destinations("broadcast", s, "0,1,2,3", r, backend="gloo")
    )
    assert total == pytest.approx(3 * s)


def test_gloo_allgather_alltoall_scatter_match_the_generic_model() -> None:
    for op, s in (("allgather", 1000), ("alltoall", 4000), ("send", 10)):
        for r in range(4):
            assert m.op_destinations(op, s, "0,1,2,3", r, peer=(r + 1) % 4, backend="gloo") == (
                m.op_destinations(op, s, "0,1,2,3", r, peer=(r + 1) % 4)
            )


def test_gloo_message_counts() -> None:
    # Two ranks, 256 KiB float32: 4 segments, each rank sends 2 per phase.
    assert m.op_messages("allreduce", 262144, "0,1", 0, backend="gloo", element_size=4) == [
        (1, 4.0)
    ]
    # Dissemination barrier: empty messages to rank + 1 and rank + 2.
    assert m.op_messages("barrier", 1, "0,1,2,3", 3, backend="gloo") == [(0, 1.0), (1, 1.0)]
    assert m.op_messages("allgather", 100, "0,1,2", 0, backend="gloo") == [(1, 4.0)]
    assert m.op_messages("recv", 100, "0,1", 0, peer=1, backend="gloo") == []
    assert m.op_messages("allreduce", 100, "0,1", 0, backend="nccl") == []


# ------------------------------------------------------------------ a two-node gloo cell


def _cell(extra_tx: float = 0.0, steps: int = 4) -> m.CellTraces:
    """Two nodes, one rank each, one 1 MB float32 all-reduce per step under gloo; counters
    that carry exactly the payload, 48 B preambles and 66 B headers, plus ``extra_tx`` bytes
    node 0 sends per step (e.g. unmodelled traffic)."""
    size = 1_000_000
    msgs = m.op_messages("allreduce", size, "0,1", 0, backend="gloo", element_size=4)[0][1]
    payload = sum(
        b for _, b in m.op_destinations("allreduce", size, "0,1", 0, backend="gloo", element_size=4)
    )
    protocol = PRE * (2 * msgs + msgs)  # each side sends its messages and acks the other's
    packets = 30
    ops, step_rows, counters = [], [], []
    for step in range(steps):
        t = T0 + step * STEP_NS
        for rank in (0, 1):
            step_rows.append(
                {
                    "rank": rank,
                    "step": step,
                    "phase": "step",
                    "t_start_ns": t,
                    "t_end_ns": t + STEP_NS - 1000,
                }
            )
            ops.append(
                {
                    "rank": rank,
                    "node": rank,
                    "op": "allreduce",
                    "group": "0",
                    "group_ranks": "0,1",
                    "group_size": 2,
                    "peer": -1,
                    "root": -1,
                    "numel": size // 4,
                    "bytes": size,
                    "seq": step,
                    "phase": "bwd",
                    "step": step,
                    "t_issue_ns": t + 10_000_000,
                    "t_end_ns": t + 50_000_000,
                }
            )
    per_step = {
        0: payload + protocol + packets * HDR + extra_tx,
        1: payload + protocol + packets * HDR,
    }
    for node in (0, 1):
        for k in range(steps * 100 + 1):  # 1 ms samples; traffic inside [20, 40) ms of a step
            t = T0 + k * 1_000_000
            step, ms = divmod(k, 100)
            frac = min(max((ms - 20) / 20, 0.0), 1.0) + step
            other = 1 - node
            counters.append(
                {
                    "node": node,
                    "iface": "exp0",
                    "t_ns": t,
                    "tx_bytes": round(per_step[node] * frac),
                    "rx_bytes": round(per_step[other] * frac),
                    "tx_packets": round(packets * frac),
                    "rx_packets": round(packets * frac),
                }
            )
    params = {"strategy": "ddp", "nodes": 2, "ranks_per_node": 1}
    meta = {
        "cell": "strategy~ddp/nodes~2",
        "params": params,
        "backend": "gloo",
        "world_size": 2,
        "warmup_steps": 1,
    }
    return m.CellTraces(
        ops=pd.DataFrame(ops),
        steps=pd.DataFrame(step_rows),
        counters=pd.DataFrame(counters),
        meta=meta,
    )


def test_crosscheck_explains_every_byte_of_a_clean_cell() -> None:
    table = m.crosscheck(_cell())
    assert list(table.columns[:4]) == ["cell", "strategy", "nodes", "ranks_per_node"]
    assert set(table["direction"]) == {"tx", "rx"} and len(table) == 4
    assert table["measured_steps"].eq(3).all()
    assert table["unexplained_bytes"].abs().max() < 2.0  # rounding of the counters only
    assert table["passed"].all()
    tx0 = table[(table["node"] == 0) & (table["direction"] == "tx")].iloc[0]
    assert tx0["framework_bytes"] == pytest.approx(3 * 1_000_000)
    assert tx0["header_bytes"] == pytest.approx(3 * 30 * HDR)
    assert tx0["ratio"] > 1.0


def test_crosscheck_flags_unexplained_traffic() -> None:
    table = m.crosscheck(_cell(extra_tx=100_000))  # 10 % more than the ops imply
    bad = table[~table["passed"]]
    assert set(zip(bad["node"], bad["direction"], strict=True)) == {(0, "tx"), (1, "rx")}
    assert bad["unexplained_fraction"].tolist() == pytest.approx([0.1, 0.1], abs=1e-5)
    assert bad["unexplained_bytes_per_step"].tolist() == pytest.approx([1e5, 1e5], abs=1)


def test_the_ring_model_misses_gloo_reduce_scatter() -> None:
    cell = _cell()
    cell.ops["op"] = "reduce_scatter"  # gloo runs it as a full all-reduce: same wire bytes
    assert m.crosscheck(cell)["passed"].all()
    ring = m.crosscheck(cell, backend="nccl")
    assert not ring["passed"].any()
    assert ring["ratio"].min() > 1.9  # the ring model expects half the bytes


def test_ops_are_placed_at_their_last_issue() -> None:
    cell = _cell()
    window = (T0 + STEP_NS, T0 + 4 * STEP_NS)
    ops = cell.ops.copy()
    # Rank 1 issues step 0's all-reduce late, inside the window: the instance moves with it.
    late = (ops["rank"] == 1) & (ops["step"] == 0)
    ops.loc[late, "t_issue_ns"] = T0 + STEP_NS + 5
    kept = m._ops_in_window(ops, window)
    assert sorted(kept.loc[kept["step"] == 0, "rank"]) == [0, 1]
    assert len(kept) == 8


# ---------------------------------------------------------------------- matrix check


def test_matrix_check_against_captured_flows() -> None:
    cell = _cell()
    assert m.matrix_check(cell, pd.DataFrame()).empty
    assert list(m.matrix_check(cell, pd.DataFrame()).columns[-3:]) == [
        "unexplained_bytes",
        "tolerance_bytes",
        "passed",
    ]
    crosscheck = m.crosscheck(cell)
    tx = crosscheck[crosscheck["direction"] == "tx"].set_index("node")
    flows = []
    for step in range(4):  # one 1 ms bin per step and direction, all of the step's bytes
        for src in (0, 1):
            flows.append(
                {
                    "t_ns": T0 + step * STEP_NS + 30_000_000,
                    "src_node": src,
                    "dst_node": 1 - src,
                    "bytes": round(tx.loc[src, "wire_bytes"] / 3),
                    "packets": round(tx.loc[src, "wire_packets"] / 3),
                }
            )
    table = m.matrix_check(cell, pd.DataFrame(flows))
    assert len(table) == 2 and table["passed"].all()
    assert table["framework_bytes"].tolist() == pytest.approx([3e6, 3e6])
    assert table["unexplained_bytes"].abs().max() < 2.0
    flows[-1]["bytes"] += 200_000
    assert not m.matrix_check(cell, pd.DataFrame(flows))["passed"].all()


def test_compute_cell_metrics_reads_wire_flows(tmp_path: Path) -> None:
    cell = _cell()
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "cell.json").write_text(json.dumps(cell.meta))
    cell.ops.to_parquet(trace / "ops.parquet")
    cell.steps.to_parquet(trace / "steps.parquet")
    cell.counters.to_parquet(trace / "counters.parquet")
    m.compute_cell_metrics(trace, tmp_path / "metrics")
    assert pd.read_parquet(tmp_path / "metrics" / "matrix_check.parquet").empty
    flows = pd.DataFrame(
        [{"t_ns": T0 + STEP_NS + 1, "src_node": 0, "dst_node": 1, "bytes": 10, "packets": 1}]
    )
    flows.to_parquet(trace / m.WIRE_FLOWS_FILE)
    m.compute_cell_metrics(trace, tmp_path / "metrics")
    assert len(pd.read_parquet(tmp_path / "metrics" / "matrix_check.parquet")) == 2
    check = pd.read_parquet(tmp_path / "metrics" / "crosscheck.parquet")
    assert check["passed"].all() and check["backend"].eq("gloo").all()


# --------------------------------------------------------------------- per strategy


def test_crosscheck_by_strategy(tmp_path: Path) -> None:
    good = m.crosscheck(_cell())
    bad = m.crosscheck(_cell(extra_tx=100_000))
    bad["cell"] = "strategy~fsdp/nodes~2"
    bad["strategy"] = "fsdp"
    table = pd.concat([good, bad], ignore_index=True)
    table.to_parquet(tmp_path / "crosscheck.parquet")
    summary = m.crosscheck_by_strategy(tmp_path).set_index("strategy")
    assert summary.loc["ddp", "cells"] == 1 and summary.loc["ddp", "cells_passed"] == 1
    assert summary.loc["fsdp", "cells_passed"] == 0
    assert summary.loc["fsdp", "unexplained_fraction_max"] == pytest.approx(0.05, abs=1e-4)
    assert summary.loc["ddp", "ratio_min"] > 1.0
    assert m.crosscheck_by_strategy(pd.DataFrame()).empty
