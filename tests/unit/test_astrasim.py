"""What ASTRA-sim 2.x needs of an export (CI cannot build it, so these are the invariants it
checked when run on every cell of the default study, docs/export.md): communicator-group ids
from 1 and every ``pg_name`` among them, only node types it executes, collectives it simulates
or replays, every send matched by a recv of the same tag and size, the members of a collective
issuing it alike (type and size, in the same order), messages of at least a byte, and a
network config in its units."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

from commscope.chakra_schema import node_attrs, pb, read_et
from commscope.export import op_records
from commscope.export.astrasim import (
    ASTRA_GB,
    UNCAPPED_BPS,
    group_ids,
    link_delay_ms,
    link_not_modeled,
    link_rate_bps,
    network_config,
    plan_ops,
    run_command,
)
from commscope.export.cell import export_cell
from commscope.export.chakra import write_chakra

CELLS = Path(__file__).resolve().parents[1] / "data" / "cells"
T0 = 1_700_000_000_000_000_000
MS = 1_000_000
# What ASTRA-sim's Workload::issue runs (METADATA aborts it in Statistics::get_operator_type).
RUNNABLE = {pb.COMP_NODE, pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE}
# What Workload::issue_coll_comm simulates or replays; the rest throws "Unsupported ...".
COLLECTIVES = {pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_TO_ALL, pb.BROADCAST}


def check_astra_ready(directory: Path, world_size: int) -> dict[int, list[pb.Node]]:
    """Assert every invariant of the module docstring on an exported input set; returns the
    nodes per rank."""
    groups = {int(k): v for k, v in json.loads((directory / "comm_group.json").read_text()).items()}
    assert all(gid >= 1 for gid in groups)
    assert all(
        sorted(ranks) == ranks and set(ranks) <= set(range(world_size)) for ranks in groups.values()
    )
    per_rank = {r: read_et(directory / f"chakra.{r}.et")[1] for r in range(world_size)}
    sends, recvs = defaultdict(int), defaultdict(int)
    colls: dict[int, dict[int, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for rank, nodes in per_rank.items():
        ids = {n.id for n in nodes}
        for node in nodes:
            assert node.type in RUNNABLE, (rank, node.name)
            assert set(node.data_deps) | set(node.ctrl_deps) <= ids
            attrs = node_attrs(node)
            if node.type == pb.COMP_NODE:
                assert attrs["is_cpu_op"] is False
                continue
            assert attrs["is_cpu_op"] is False and attrs["comm_size"] >= 1
            if node.type == pb.COMM_COLL_NODE:
                assert attrs["comm_type"] in COLLECTIVES
                gid = int(attrs["pg_name"])
                assert rank in groups[gid]
                if attrs["comm_type"] != pb.BROADCAST:  # replayed, not matched
                    assert attrs["comm_size"] >= len(groups[gid])
                    colls[gid][rank].append((attrs["comm_type"], attrs["comm_size"]))
            else:
                src, dst = attrs["comm_src"], attrs["comm_dst"]
                assert (src if node.type == pb.COMM_SEND_NODE else dst) == rank
                key = (src, dst, attrs["comm_tag"], attrs["comm_size"])
                (sends if node.type == pb.COMM_SEND_NODE else recvs)[key] += 1
    assert sends == recvs
    for gid, members in colls.items():
        assert set(members) == set(groups[gid])
        assert len({tuple(seq) for seq in members.values()}) == 1, gid
    return per_rank


def _ops(rows: list[dict]) -> pd.DataFrame:
    base = {
        "node": 0,
        "local_rank": 0,
        "source": "c10d",
        "group": "0",
        "group_ranks": "0,1",
        "group_size": 2,
        "peer": -1,
        "root": -1,
        "dtype": "uint8",
        "numel": -1,
        "bytes_out": -1,
        "step": 0,
        "phase": "fwd",
    }
    ops = pd.DataFrame([{**base, **r} for r in rows])
    ops["t_end_ns"] = ops["t_end_ns"].astype("Int64")
    return ops


def _steps(ranks: list[int]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"rank": r, "node": r, "step": 0, "phase": ph, "t_start_ns": T0 + a, "t_end_ns": T0 + b}
            for r in ranks
            for ph, a, b in (("step", 0, 100 * MS), ("fwd", 0, 100 * MS))
        ]
    )


def _op(rank: int, op: str, nbytes: int, seq: int, t0: float, t1: float | None, **kw) -> dict:
    return {
        "rank": rank,
        "op": op,
        "bytes": nbytes,
        "seq": seq,
        "t_issue_ns": T0 + int(t0 * MS),
        "t_end_ns": None if t1 is None else T0 + int(t1 * MS),
        **kw,
    }


def test_group_ids_start_at_one():
    assert group_ids(["0", "3", "0", ""]) == {"0": 1, "3": 4}  # c10d's names + 1
    assert group_ids(["tp", "dp"]) == {"dp": 1, "tp": 2}


def test_the_plan_makes_every_op_runnable(tmp_path):
    """Uneven all-to-all, a barrier, a scatter and a broadcast inside the step, a collective
    on a group of one, a send whose recv is missing, a gloo reduce-scatter, a tiny
    all-reduce: everything ASTRA-sim would reject or hang on is rewritten, and said so."""
    rows = []
    for rank in (0, 1):
        rows += [
            _op(rank, "alltoall", 3000 if rank == 0 else 1000, 0, 1, 2, split_bytes="1000,2000"),
            _op(rank, "barrier", 0, 1, 3, 4),
            _op(rank, "scatter", 64, 2, 5, 6, root=0),
            _op(rank, "broadcast", 64, 3, 7, 8, root=0),
            _op(rank, "reduce_scatter", 4096, 4, 9, 11),
            _op(rank, "allreduce", 1, 5, 12, 13),
            _op(rank, "allreduce", 64, 0, 14, 15, group=str(2 + rank), group_ranks=str(rank)),
        ]
    rows.append(_op(0, "send", 100, 0, 20, 21, peer=1))
    ops = _ops(rows)
    paths = write_chakra(tmp_path, ops, _steps([0, 1]), backend="gloo", world_size=2)
    per_rank = check_astra_ready(tmp_path, 2)
    summary = json.loads((tmp_path / "export_summary.json").read_text())
    assert summary["approximated"] == {
        "allreduce: group of one rank (no traffic): compute of its measured time": 2,
        "allreduce: size below the group size: raised to it": 2,
        "alltoall: uneven all-to-all: the members' mean size": 2,
        "barrier: no ASTRA-sim collective: compute of its measured time": 2,
        "broadcast: replayed by ASTRA-sim for its measured time": 2,
        "reduce_scatter: written as ALL_REDUCE: gloo runs reduce_scatter as a full all-reduce": 2,
        "scatter: no ASTRA-sim collective: compute of its measured time": 2,
        "send: no matching send/recv: compute of its time": 1,
    }
    assert summary["comm_groups"] == {"1": [0, 1], "3": [0], "4": [1]}
    comm = {n.name.split(" (")[0]: n for n in per_rank[0] if not n.name.startswith(("#", "c"))}
    assert node_attrs(comm["alltoall"])["comm_size"] == 2000  # (3000 + 1000) / 2
    assert node_attrs(comm["alltoall"])["commscope_bytes"] == 3000
    assert comm["barrier"].type == pb.COMP_NODE and comm["barrier"].duration_micros == 1000
    assert node_attrs(comm["reduce_scatter"])["comm_type"] == pb.ALL_REDUCE
    assert node_attrs(comm["send"])["commscope_op"] == "send"
    assert comm["send"].type == pb.COMP_NODE
    assert [p.name for p in paths][-1] == "export_summary.json"


def test_recv_takes_its_sends_size_and_tag():
    ops = _ops(
        [
            _op(0, "send", 100, 7, 1, 2, peer=1),
            _op(1, "recv", 96, 7, 1, 2, peer=0),
        ]
    )
    records = op_records(ops)
    summary = plan_ops(records)
    send, recv = records[0][0]["astra"], records[1][0]["astra"]
    assert (send.kind, recv.kind, send.tag, recv.tag) == ("send", "recv", 7, 7)
    assert recv.size == send.size == 100
    assert summary.notes == {"recv: recv size differs from its send's: the send's": 1}


def test_the_links_delay_and_what_the_network_leaves_out():
    params = {"bw": "none", "delay": "20ms", "jitter": "1ms", "loss": "1pct", "cc": "cubic"}
    meta = {"params": {"strategy": "tp", **params}}
    assert link_rate_bps(meta) == UNCAPPED_BPS
    assert link_delay_ms(meta) == 20.0
    assert link_not_modeled(meta) == ["jitter ±1 ms", "loss 1 %"]
    assert link_not_modeled({}) == [] and link_delay_ms({}) == 0.0
    # cell.json's numbers (the shape the nodes applied) come before its axis strings.
    applied = {"bw_bps": 5_000_000, "delay_ms": 2.5, "jitter_ms": 0.5, "loss_pct": 0.0}
    assert link_rate_bps({**meta, **applied}) == 5_000_000
    assert link_delay_ms({**meta, **applied}) == 2.5
    assert link_not_modeled({**meta, **applied}) == ["jitter ±0.5 ms"]


def test_network_config_in_astra_units():
    text = network_config(4, 50_000_000, delay_ms=5)
    values = {
        line.split(":")[0]: line.split("[")[1].split("]")[0].strip()
        for line in text.splitlines()
        if not line.startswith("#")
    }
    assert values["topology"] == "Switch" and values["npus_count"] == "4"
    assert float(values["bandwidth"]) == pytest.approx(50e6 / 8 / ASTRA_GB)
    assert float(values["latency"]) == 2.5e6  # ns per link: two links make the 5 ms
    assert UNCAPPED_BPS > 1e9


@pytest.mark.parametrize("name", ["pp-2rank", "ddp-2rank"])
def test_real_cells_export_astra_ready(name, tmp_path):
    trace = CELLS / name
    meta = json.loads((trace / "cell.json").read_text())
    export_cell(trace, tmp_path)
    directory = tmp_path / "chakra"
    per_rank = check_astra_ready(directory, meta["world_size"])
    summary = json.loads((directory / "export_summary.json").read_text())
    assert summary["command"] == run_command()
    assert summary["link"] == {"rate_bps": meta["bw_bps"], "delay_ms": 0.0, "not_modeled": []}
    assert summary["backend"] == "gloo" and summary["measured"]["steps"] == 6
    assert summary["left_out"]  # the set-up ops before step 0
    script = (directory / "run_astra.sh").read_text()
    assert "--workload-configuration=chakra" in script and "--comm-group-configuration" in script
    assert json.loads((directory / "system.json").read_text())["roofline-enabled"] == 0
    sends = sum(n.type == pb.COMM_SEND_NODE for nodes in per_rank.values() for n in nodes)
    assert (sends > 0) == (name == "pp-2rank")
