"""Exports (Perfetto, Chakra, ASTRA-sim text, flow list) on a synthetic cell with answers known in
closed form and on two real measured cells (tests/data/cells: gpt-tiny, 2 nodes x 1 rank, 200
Mbit/s, 6 steps, warm-up 2; ``pp-2rank`` 1F1B pipeline over send/recv, ``ddp-2rank`` DDP with one
gradient bucket), copied from results/runs.

The synthetic cell (2 ranks on 2 nodes, group "0" = ranks 0,1) runs set-up ops (a broadcast from
rank 0, a barrier) and two identical 100 ms steps with phases fwd [+1, +40), bwd [+40, +80),
optim [+80, +95) ms; in each step both ranks issue, in ms from the step start:

====== =================================================== ===============
issue  op                                                  completes
====== =================================================== ===============
+10    allreduce 4096 B (functional: tensor parallel)      +12
+20    rank 0 sends 8192 B to rank 1 (rank 1 recv at +19)  +25
+30    alltoall 4000 B                                     +32
+50    allgather 1000 B shard (2000 B out)                 +53
+60    allreduce 600000 B (c10d: a DDP bucket)             +70
+65    allreduce 400000 B (c10d, overlaps the one before)  +75
+76    reduce_scatter 2000 B                               never (null)
+90    allreduce 8 B (optimizer phase: a gradient norm)    +91
====== =================================================== ===============
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from commscope import metrics
from commscope.chakra_schema import attr_value, decode_et, node_attrs, pb
from commscope.export import (
    PHASES,
    AstraLayer,
    astra_workload,
    export_cell,
    parse_astra_text,
    to_astra_text,
    to_chakra,
    to_chrome_trace,
    to_flows,
    write_chakra,
    write_chrome_trace,
    write_flows_csv,
)
from commscope.export import chakra as chakra_export
from commscope.export.astrasim import TIMED
from commscope.export.perfetto import COMM_TID_OFFSET
from commscope.importers import load_chakra, normalize_dtype

CELLS = Path(__file__).resolve().parents[1] / "data" / "cells"
T0 = 1_700_000_000_000_000_000
MS = 1_000_000
# Everything of the ops table a Chakra round trip keeps exactly (node and local_rank are not
# in the format; times are whole µs; source becomes "chakra").
ROUND_TRIP = [
    "rank",
    "op",
    "group",
    "group_ranks",
    "group_size",
    "peer",
    "root",
    "dtype",
    "numel",
    "bytes",
    "bytes_out",
    "seq",
    "step",
    "phase",
]


# --------------------------------------------------------------------------------------------
# The synthetic cell
# --------------------------------------------------------------------------------------------


def _synthetic() -> tuple[pd.DataFrame, pd.DataFrame]:
    rows: list[dict[str, Any]] = []
    seq: dict[tuple, int] = defaultdict(int)

    def op(rank, step, phase, name, nbytes, t0, t1, *, source="c10d", peer=-1, root=-1, **kw):
        key = (rank, name, peer) if name in ("send", "recv") else (rank,)
        dtype = kw.get("dtype", "uint8")
        size = {"uint8": 1, "float32": 4}[dtype]
        rows.append(
            {
                "rank": rank,
                "node": rank,
                "local_rank": 0,
                "op": name,
                "source": source,
                "group": "0",
                "group_ranks": "0,1",
                "group_size": 2,
                "peer": peer,
                "root": root,
                "dtype": dtype,
                "numel": nbytes // size,
                "bytes": nbytes,
                "bytes_out": kw.get("bytes_out", nbytes),
                "seq": seq[key],
                "step": step,
                "phase": phase,
                "t_issue_ns": T0 + int(t0 * MS),
                "t_end_ns": None if t1 is None else T0 + int(t1 * MS),
            }
        )
        seq[key] += 1

    steps = []
    for rank in (0, 1):
        op(rank, -1, "other", "broadcast", 400, 1, 3, root=0, dtype="float32")
        op(rank, -1, "other", "barrier", 1, 4, 5)
    for step in (0, 1):
        s = 10 + 100 * step
        for rank in (0, 1):
            steps += [
                (rank, step, "step", s, s + 100),
                (rank, step, "fwd", s + 1, s + 40),
                (rank, step, "bwd", s + 40, s + 80),
                (rank, step, "optim", s + 80, s + 95),
            ]
            op(rank, step, "fwd", "allreduce", 4096, s + 10, s + 12, source="functional")
            if rank == 0:
                op(0, step, "fwd", "send", 8192, s + 20, s + 25, peer=1, dtype="float32")
            else:
                op(1, step, "fwd", "recv", 8192, s + 19, s + 25, peer=0, dtype="float32")
            op(rank, step, "fwd", "alltoall", 4000, s + 30, s + 32, dtype="float32")
            op(rank, step, "bwd", "allgather", 1000, s + 50, s + 53, bytes_out=2000)
            op(rank, step, "bwd", "allreduce", 600_000, s + 60, s + 70, dtype="float32")
            op(rank, step, "bwd", "allreduce", 400_000, s + 65, s + 75, dtype="float32")
            op(rank, step, "bwd", "reduce_scatter", 2000, s + 76, None, bytes_out=1000)
            op(rank, step, "optim", "allreduce", 8, s + 90, s + 91, dtype="float32")
    ops = pd.DataFrame(rows)
    ops["t_end_ns"] = ops["t_end_ns"].astype("Int64")
    steps_df = pd.DataFrame(
        [
            {
                "rank": r,
                "node": r,
                "step": st,
                "phase": ph,
                "t_start_ns": T0 + a * MS,
                "t_end_ns": T0 + b * MS,
            }
            for r, st, ph, a, b in steps
        ]
    )
    return ops, steps_df


@pytest.fixture()
def synthetic() -> tuple[pd.DataFrame, pd.DataFrame]:
    return _synthetic()


def _in_issue_order(ops: pd.DataFrame, rank: int) -> pd.DataFrame:
    mine = ops[ops["rank"] == rank]
    return mine.sort_values("t_issue_ns", kind="stable").reset_index(drop=True)


def _assert_round_trip(ops: pd.DataFrame, path: Path, rank: int) -> None:
    """load_chakra on the export gives this rank's ops of the training steps back in issue
    order (set-up ops are not exported; ops ASTRA-sim cannot run are compute nodes, which the
    importer does not read): every ROUND_TRIP column equal (group membership, step, seq,
    bytes_out and the pipeline's fwd_bwd phase included; the group named by its ASTRA-sim id,
    c10d's name + 1), issue time to the µs, end times to the µs and null exactly where they
    were, all-to-all splits where recorded."""
    back = load_chakra(path)
    exported = ops[(ops["step"] >= 0) & ~ops["op"].isin(TIMED)]
    want = _in_issue_order(exported, rank)
    want = want.assign(group=[str(int(g) + 1) for g in want["group"]])
    assert len(back) == len(want)
    assert back[ROUND_TRIP].astype(str).to_dict("records") == want[ROUND_TRIP].astype(str).to_dict(
        "records"
    )
    assert (back["t_issue_ns"] == want["t_issue_ns"] // 1000 * 1000).all()
    ended = want["t_end_ns"].notna().to_numpy()
    assert back["t_end_ns"].notna().tolist() == ended.tolist()
    err = (back["t_end_ns"][ended].astype("int64") - want["t_end_ns"][ended].astype("int64")).abs()
    assert (err <= 500).all()  # µs resolution
    if "split_bytes" in want and want["split_bytes"].notna().any():
        assert back["split_bytes"].tolist() == want["split_bytes"].tolist()


# --------------------------------------------------------------------------------------------
# Chakra (decoded through the vendored schema; the ASTRA-sim invariants: test_astrasim.py)
# --------------------------------------------------------------------------------------------


def test_element_types_read_back_as_contract_dtypes():
    for dtype, spelling in chakra_export._ET_TYPES.items():
        assert normalize_dtype(f"Tensor({spelling})") == dtype


def test_chakra_round_trip_synthetic(synthetic, tmp_path):
    ops, steps = synthetic
    paths = write_chakra(tmp_path, ops, steps)
    assert [p.name for p in paths] == [
        "chakra.0.et",
        "chakra.1.et",
        "comm_group.json",
        "network.yml",
        "system.json",
        "memory.json",
        "run_astra.sh",
        "export_summary.json",
    ]
    assert json.loads((tmp_path / "comm_group.json").read_text()) == {"1": [0, 1]}
    for rank in (0, 1):
        _assert_round_trip(ops, paths[rank], rank)


def test_chakra_layout_follows_the_schema(synthetic):
    ops, steps = synthetic
    meta, nodes = decode_et(to_chakra(ops, steps, 0, world_size=2))
    assert meta.version == "0.0.4"
    assert {a.name: attr_value(a) for a in meta.attr} == {
        "source": "commscope",
        "rank": 0,
        "world_size": 2,
        "backend": "nccl",
    }
    assert [n.id for n in nodes] == list(range(len(nodes)))
    # Issue order as data dependencies: every node waits for the one before it on the rank.
    assert list(nodes[0].data_deps) == []
    for before, node in zip(nodes, nodes[1:], strict=False):
        assert list(node.data_deps) == [before.id]

    markers = {n.id: n for n in nodes if n.name.startswith("## ")}
    assert len(markers) == 6  # (step, phase) for 2 steps x fwd/bwd/optim
    assert all(n.type == pb.COMP_NODE and n.duration_micros == 0 for n in markers.values())
    assert {n.name.split(" step")[0] for n in markers.values()} == {
        "## forward ##",
        "## backward ##",
        "## optimizer ##",
    }
    others = [n for n in nodes if n.id not in markers]
    assert all(markers[n.ctrl_deps[0]].name.startswith("## ") for n in others)

    comm = [n for n in others if not n.name.startswith("compute ")]
    assert len(comm) == len(ops[(ops["rank"] == 0) & (ops["step"] >= 0)])  # set-up left out
    for node in comm:
        attrs = node_attrs(node)
        assert attrs["is_cpu_op"] is False and attrs["pg_ranks"] == [0, 1]
        assert attrs["commscope_pg_name"] == "0"
    types = [(n.type, node_attrs(n).get("comm_type")) for n in comm[:4]]
    assert types == [
        (pb.COMM_COLL_NODE, pb.ALL_REDUCE),  # written although 0 is the default
        (pb.COMM_SEND_NODE, None),
        (pb.COMM_COLL_NODE, pb.ALL_TO_ALL),
        (pb.COMM_COLL_NODE, pb.ALL_GATHER),
    ]
    send = node_attrs(comm[1])
    assert (send["comm_src"], send["comm_dst"], send["comm_tag"]) == (0, 1, 0)
    assert send["comm_size"] == 8192 and comm[1].duration_micros == 5000
    assert node_attrs(comm[3])["comm_size"] == 1000  # all-gather: the per-rank input
    no_end = [n for n in comm if node_attrs(n).get("t_end_unknown")]
    assert len(no_end) == 2 and all(n.duration_micros == 0 for n in no_end)
    assert node_attrs(no_end[0])["comm_type"] == pb.REDUCE_SCATTER  # nccl: as recorded

    # Compute = phase time with no op in flight: per step fwd 9+8+5+8, bwd 10+7+0+1+4,
    # optim 10+4 ms (see the module docstring's table).
    compute = [n for n in others if n.name.startswith("compute ")]
    assert all(n.type == pb.COMP_NODE and node_attrs(n)["is_cpu_op"] is False for n in compute)
    assert sum(n.duration_micros for n in compute) == 2 * 66_000


def test_chakra_recv_matches_send_tag(synthetic):
    ops, steps = synthetic
    _, nodes = decode_et(to_chakra(ops, steps, 1))
    recvs = [node_attrs(n) for n in nodes if n.type == pb.COMM_RECV_NODE]
    assert [(a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"]) for a in recvs] == [
        (0, 1, 0, 8192),
        (0, 1, 1, 8192),
    ]


def test_chakra_setup_ops_on_request(synthetic):
    """With ``setup`` the ops before the first step are written too: the broadcast replayed
    (BROADCAST), the barrier as compute of its measured 1 ms."""
    ops, steps = synthetic
    _, nodes = decode_et(to_chakra(ops, steps, 0, setup=True))
    bcast, barrier = nodes[0], nodes[1]
    assert node_attrs(bcast)["comm_type"] == pb.BROADCAST
    assert node_attrs(bcast)["comm_root"] == 0
    assert barrier.type == pb.COMP_NODE and barrier.duration_micros == 1000
    assert node_attrs(barrier)["commscope_op"] == "barrier"


def test_uneven_all_to_all_splits_reach_chakra_and_flows(synthetic):
    ops, steps = synthetic
    ops["split_bytes"] = None
    ops.loc[ops["op"] == "alltoall", "split_bytes"] = "1000,3000"
    _, nodes = decode_et(to_chakra(ops, steps, 0))
    a2a = [node_attrs(n) for n in nodes if node_attrs(n).get("comm_type") == pb.ALL_TO_ALL]
    assert [a["split_bytes"] for a in a2a] == [[1000, 3000], [1000, 3000]]
    flows = to_flows(ops)
    sent = flows[flows["op"] == "alltoall"].groupby("src_rank")["bytes"].first()
    assert sent.to_dict() == {0: 3000.0, 1: 1000.0}  # exact per-destination bytes


def test_chakra_import_reads_back_splits_and_the_rank_from_metadata(synthetic, tmp_path):
    ops, steps = synthetic
    ops["split_bytes"] = None
    ops.loc[ops["op"] == "alltoall", "split_bytes"] = "1000,3000"
    # A file name without a rank: the GlobalMetadata's rank attribute names it.
    path = tmp_path / "trace.et"
    path.write_bytes(to_chakra(ops, steps, 1, world_size=2))
    back = load_chakra(path)
    assert (back["rank"] == 1).all()
    a2a = back["op"] == "alltoall"
    assert back.loc[a2a, "split_bytes"].tolist() == ["1000,3000", "1000,3000"]
    assert back.loc[~a2a, "split_bytes"].isna().all()
    # The reduce-scatter had no completion time: null, not its start time.
    rs = back[back["op"] == "reduce_scatter"]
    assert len(rs) == 2 and rs["t_end_ns"].isna().all()
    assert back.loc[back["op"] != "reduce_scatter", "t_end_ns"].notna().all()


# --------------------------------------------------------------------------------------------
# Perfetto
# --------------------------------------------------------------------------------------------


def _check_chrome_trace(doc: dict, ops: pd.DataFrame) -> list[dict]:
    doc = json.loads(json.dumps(doc))  # valid JSON
    events = doc["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    timed = [e for e in events if e["ph"] != "M"]
    assert events[: len(meta)] == meta  # metadata first
    assert all(a["ts"] <= b["ts"] for a, b in zip(timed, timed[1:], strict=False))
    names = [e["args"]["name"] for e in meta if e["name"] == "thread_name"]
    ranks = sorted(int(r) for r in ops["rank"].unique())
    assert sorted(n for n in names if "comm" not in n) == [f"rank {r}" for r in ranks]
    for e in meta:
        if e["name"] == "thread_name" and "comm" not in e["args"]["name"]:
            assert e["tid"] == int(e["args"]["name"].split()[1])  # tid = rank
            assert e["pid"] == int(ops.loc[ops["rank"] == e["tid"], "node"].iloc[0])
    comm = [e for e in timed if e.get("cat") == "comm"]
    assert len(comm) == len(ops)
    assert all(e["tid"] >= COMM_TID_OFFSET for e in comm)
    assert {e["name"] for e in timed if e.get("cat") == "compute"} <= set(PHASES)
    return timed


def test_chrome_trace_synthetic(synthetic, tmp_path):
    ops, steps = synthetic
    doc = to_chrome_trace(ops, steps)
    timed = _check_chrome_trace(doc, ops)
    assert doc["otherData"]["origin_ns"] == T0 + 1 * MS
    comm = [e for e in timed if e.get("cat") == "comm"]
    no_end = [e for e in comm if e["args"].get("t_end_unknown")]
    assert len(no_end) == 4 and all(e["dur"] == 0 for e in no_end)
    bucket = next(e for e in comm if e["args"]["bytes"] == 600_000)
    assert bucket["dur"] == 10_000.0 and bucket["args"]["group"] == "0"
    assert bucket["args"]["seq"] >= 0 and bucket["args"]["peer"] == -1
    # The overlapping bucket goes to a second lane, so complete events nest on each thread.
    overlapping = next(e for e in comm if e["args"]["bytes"] == 400_000)
    assert overlapping["tid"] != bucket["tid"]
    steps_ev = [e for e in timed if e.get("cat") == "step"]
    assert len(steps_ev) == 4 and steps_ev[0]["dur"] == 100_000.0
    arrows = [e for e in timed if e.get("cat") == "p2p"]
    assert sorted(e["ph"] for e in arrows) == ["f", "f", "s", "s"]
    path = write_chrome_trace(tmp_path / "trace.json", ops, steps)
    assert json.loads(path.read_text()) == json.loads(json.dumps(doc))


# --------------------------------------------------------------------------------------------
# Flows
# --------------------------------------------------------------------------------------------


def _check_flows_match_comm_matrix(flows: pd.DataFrame, ops: pd.DataFrame, measured: list[int]):
    matrix = metrics.comm_matrix(ops, measured_steps=measured)
    want = matrix.groupby(["src_rank", "dst_rank"])["bytes"].sum() * len(measured)
    got = flows[flows["step"].isin(measured)].groupby(["src_rank", "dst_rank"])["bytes"].sum()
    pd.testing.assert_series_equal(got.sort_index(), want.sort_index(), check_names=False)


def _check_deps(flows: pd.DataFrame) -> None:
    start = dict(zip(flows["flow_id"], flows["start_ns"], strict=True))
    for fid, deps in zip(flows["flow_id"], flows["deps"], strict=True):
        for dep in filter(None, str(deps).split(";")):
            assert int(dep) in start and int(dep) != fid
            assert start[int(dep)] <= start[fid]


def test_flows_synthetic(synthetic, tmp_path):
    ops, _ = synthetic
    flows = to_flows(ops)
    # Set-up: the broadcast root sends once; per step rank 0 has 8 flows, rank 1 7 (no send).
    assert len(flows) == 1 + 2 * (8 + 7)
    assert flows["flow_id"].tolist() == list(range(len(flows)))
    assert (flows["src_node"] == flows["src_rank"]).all()
    _check_flows_match_comm_matrix(flows, ops, [0, 1])
    _check_deps(flows)
    # A ring all-reduce is one flow of 2(n-1)/n * S to the ring successor.
    bucket = flows[(flows["bytes"] == 600_000) & (flows["src_rank"] == 0)]
    assert bucket["dst_rank"].tolist() == [1, 1]
    # Rank 1's all-to-all waits for what it sent before it (nothing since the all-reduce)
    # and for the data of the receive that completed before it was issued.
    step0 = flows[flows["step"] == 0]
    send = step0[(step0["op"] == "send")].iloc[0]
    a2a = step0[(step0["op"] == "alltoall") & (step0["src_rank"] == 1)].iloc[0]
    assert a2a["deps"] == str(send["flow_id"])
    # After the reduce-scatter with no completion time, only its own flows are dependencies.
    rs = step0[(step0["op"] == "reduce_scatter") & (step0["src_rank"] == 0)].iloc[0]
    norm = step0[(step0["op"] == "allreduce") & (step0["src_rank"] == 0)].iloc[-1]
    assert norm["deps"] == str(rs["flow_id"])
    path = write_flows_csv(tmp_path / "flows.csv", ops)
    back = pd.read_csv(path, keep_default_na=False, dtype={"deps": str, "group": str})
    assert back["deps"].tolist() == flows["deps"].tolist()


# --------------------------------------------------------------------------------------------
# ASTRA-sim text
# --------------------------------------------------------------------------------------------


def test_astra_workload_synthetic(synthetic):
    ops, steps = synthetic
    work = astra_workload(ops, steps, rank=0, step=1)
    assert work.parallelism == "HYBRID_DATA_MODEL"
    assert work.dropped == ["send 8192"]
    update = round(14_000 / ((600_000 + 400_000 + 2000 + 8) / 1024))
    expected = [
        AstraLayer("layer_0", 9000, "ALLREDUCE", 4096, 0, "NONE", 0, 4000, "ALLREDUCE", 8),
        AstraLayer("layer_1", 13000, "ALLTOALL", 4000, 0, "NONE", 0, 1000, "REDUCESCATTER", 2000),
        AstraLayer("layer_2", 4000, "NONE", 0, 0, "NONE", 0, 0, "ALLREDUCE", 400_000),
        AstraLayer(
            "layer_3", 4000, "NONE", 0, 10000, "ALLGATHER", 1000, 7000, "ALLREDUCE", 600_000
        ),
    ]
    for layer in expected:
        layer.update = update
    assert work.layers == expected
    parsed = parse_astra_text(work.to_text())
    assert parsed.parallelism == work.parallelism and parsed.layers == expected
    # Compute is conserved: fwd 30 ms and bwd 22 ms of the step, in µs.
    assert sum(x.fwd_compute for x in parsed.layers) == 30_000
    assert sum(x.ig_compute + x.wg_compute for x in parsed.layers) == 22_000


def test_astra_text_format(synthetic):
    ops, steps = synthetic
    text = to_astra_text(ops, steps, rank=1, time_unit_ns=1)  # ns
    lines = text.splitlines()
    assert lines[0] == "HYBRID_DATA_MODEL" and int(lines[1]) == len(lines) - 2
    assert all(len(ln.split()) == 12 and ln.split()[1] == "-1" for ln in lines[2:])
    assert parse_astra_text(text).layers[0].fwd_compute == 9 * MS
    assert to_astra_text(ops, steps, rank=1, parallelism="DATA").startswith("DATA\n")
    with pytest.raises(ValueError, match="12"):
        parse_astra_text("DATA\n1\nlayer -1 1 NONE 0\n")
    with pytest.raises(ValueError, match="layers"):
        parse_astra_text("DATA\n2\n" + lines[2] + "\n")


def test_astra_pure_data_parallel_is_one_weight_gradient_layer_per_bucket(synthetic):
    ops, steps = synthetic
    buckets = ops[(ops["op"] == "allreduce") & (ops["phase"] == "bwd")]
    work = astra_workload(buckets, steps, rank=0)
    assert work.parallelism == "DATA"
    assert [(x.wg_comm, x.wg_size) for x in work.layers] == [
        ("ALLREDUCE", 400_000),
        ("ALLREDUCE", 600_000),
    ]


# --------------------------------------------------------------------------------------------
# Real measured cells
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pp-2rank", "ddp-2rank"])
def test_export_real_cell(name, tmp_path):
    trace = CELLS / name
    meta = json.loads((trace / "cell.json").read_text())
    ops = pd.read_parquet(trace / "ops.parquet")
    paths = export_cell(trace, tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == [
        "trace.json",
        "chakra/chakra.0.et",
        "chakra/chakra.1.et",
        "chakra/comm_group.json",
        "chakra/network.yml",
        "chakra/system.json",
        "chakra/memory.json",
        "chakra/run_astra.sh",
        "chakra/export_summary.json",
        "astra_workload.txt",
        "flows.csv",
    ]

    _check_chrome_trace(json.loads((tmp_path / "trace.json").read_text()), ops)

    for rank in (0, 1):
        _assert_round_trip(ops, tmp_path / "chakra" / f"chakra.{rank}.et", rank)

    flows = pd.read_csv(tmp_path / "flows.csv", keep_default_na=False, dtype={"group": str})
    measured = sorted(s for s in ops["step"].unique() if s >= meta["warmup_steps"])
    _check_flows_match_comm_matrix(flows, ops, measured)
    _check_deps(flows)

    work = parse_astra_text((tmp_path / "astra_workload.txt").read_text())
    assert work.parallelism == "DATA" and len(work.layers) == 1
    layer = work.layers[0]
    assert layer.fwd_compute > 0 and layer.wg_compute > 0
    if name == "ddp-2rank":
        # One DDP bucket: the weight-gradient all-reduce of all of rank 0's gradients.
        assert (layer.wg_comm, layer.wg_size) == ("ALLREDUCE", meta["grad_bytes"])
    else:
        # Pipeline send/recv have no comm type in the format.
        assert layer.wg_comm == layer.fwd_comm == layer.ig_comm == "NONE"
        dropped = astra_workload(ops, pd.read_parquet(trace / "steps.parquet")).dropped
        assert dropped and {d.split()[0] for d in dropped} == {"send", "recv"}
