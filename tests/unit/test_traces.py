"""Raw per-node run output -> tidy per-cell tables (build_cell_tables) on a synthetic raw dir."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from commscope.cell.parse import build_cell_tables, cell_table_paths
from commscope.config import cell_id
from commscope.contracts import SWEEP_AXES
from commscope.spec.settings import CellSettings
from commscope.workload.capture import OpRecord

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
GRAD_BYTES = [120_320, 120_320]


def make_cell(**kw: Any) -> dict[str, Any]:
    cell = {
        "strategy": "ddp",
        "model": "gpt-tiny",
        "nodes": 2,
        "ranks_per_node": 1,
        "bw": "50mbit",
        "delay": "0ms",
        "jitter": "0ms",
        "loss": "0pct",
        "cc": "cubic",
        "steps": 3,
        "repeat": 1,
    }
    return cell | kw


def _ops(rank: int, node: int) -> pd.DataFrame:
    """Rows shaped like train.py writes them: rank, node, local_rank, then OpRecord fields."""
    rows = []
    # Written out of time order: the table must come out sorted by (rank, t_issue_ns).
    for step in (2, 0, 1):
        t = T0 + (10 + 100 * step + rank) * MS
        rec = OpRecord(
            op="allreduce",
            source="c10d",
            group="0",
            group_ranks="0,1",
            group_size=2,
            peer=-1,
            root=-1,
            dtype="float32",
            numel=GRAD_BYTES[rank] // 4,
            bytes=GRAD_BYTES[rank],
            bytes_out=GRAD_BYTES[rank],
            split_bytes=None,
            seq=step,
            step=step,
            phase="bwd",
            t_issue_ns=t,
            t_end_ns=t + 5 * MS,
        )
        rows.append({"rank": rank, "node": node, "local_rank": 0, **dataclasses.asdict(rec)})
    frame = pd.DataFrame(rows)
    frame["t_end_ns"] = frame["t_end_ns"].astype("Int64")
    return frame


def _steps(rank: int, node: int) -> pd.DataFrame:
    rows = [(rank, node, s, "step", T0 + 100 * s * MS, T0 + 100 * (s + 1) * MS) for s in (1, 0, 2)]
    return pd.DataFrame(rows, columns=["rank", "node", "step", "phase", "t_start_ns", "t_end_ns"])


def _counters(base: int, n: int = 5) -> pd.DataFrame:
    # Sampler layout: iface first, then COLUMNS (t_ns, rx_bytes, rx_packets, tx_bytes, tx_packets).
    times = [T0 + k * MS for k in reversed(range(n))]  # unsorted on purpose
    return pd.DataFrame(
        {
            "iface": "exp0",
            "t_ns": times,
            "rx_bytes": [base + 10 * k for k in reversed(range(n))],
            "rx_packets": [base // 1000 + k for k in reversed(range(n))],
            "tx_bytes": [base + 20 * k for k in reversed(range(n))],
            "tx_packets": [base // 1000 + 2 * k for k in reversed(range(n))],
        }
    )


def make_raw(
    root: Path,
    cell: dict[str, Any],
    names: tuple[str, ...] = ("node0", "node1"),
    indices: tuple[int, ...] = (0, 1),
) -> Path:
    """A raw dir as experiment.cell.run_cell leaves it: one dir per node, one rank per node."""
    raw = root / "raw"
    for name, index in zip(names, indices, strict=True):
        rank = index  # one rank per node
        d = raw / name
        d.mkdir(parents=True)
        _ops(rank, index).to_parquet(d / f"ops_rank{rank}.parquet", index=False)
        _steps(rank, index).to_parquet(d / f"steps_rank{rank}.parquet", index=False)
        _counters(base=1_000_000 * (index + 1)).to_parquet(d / "counters.parquet", index=False)
        meta = {
            "rank": rank,
            "node": index,
            "world_size": len(names),
            "backend": "gloo",
            "hostname": name,
            "grad_bytes_local": GRAD_BYTES[rank],
            "param_count_local": GRAD_BYTES[rank] // 4,
            "torch": "2.13.0+cpu",
        }
        (d / f"rank{rank}.json").write_text(json.dumps(meta))
        (d / "torchrun.log").write_text("ok\n")
    run = {
        "tag": "commscope-0123456789ab",
        "shape": CellSettings.from_mapping(cell).link_shape().__dict__,
        # Listed in reverse: the node index must come from here, not from the listing order.
        "nodes": [
            {"name": n, "index": i, "exp_iface": "exp0"}
            for n, i in reversed(list(zip(names, indices, strict=True)))
        ],
        "t_start_ns": T0,
        "t_end_ns": T0 + 400 * MS,
        "qdisc_before": {n: {"exp0": {"sent_bytes": 0}} for n in names},
        "qdisc_after": {n: {"exp0": {"sent_bytes": 123}} for n in names},
    }
    (raw / "run.json").write_text(json.dumps(run))
    return raw


@pytest.fixture
def built(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Path]]:
    cell = make_cell()
    raw = make_raw(tmp_path, cell)
    paths = build_cell_tables(
        raw,
        CellSettings.from_mapping(cell),
        warmup_steps=1,
        paths=cell_table_paths(tmp_path / "trace"),
    )
    return cell, paths


def test_output_files(built: tuple[dict[str, Any], dict[str, Path]], tmp_path: Path) -> None:
    _, paths = built
    out = tmp_path / "trace"
    assert paths == {
        "ops": out / "ops.parquet",
        "steps": out / "steps.parquet",
        "counters": out / "counters.parquet",
        "train": out / "train.parquet",
        "moe": out / "moe.parquet",
        "sockets": out / "sockets.parquet",
        "host": out / "host.parquet",
        "wire_flows": out / "wire_flows.parquet",
        "nccl_ops": out / "nccl_ops.parquet",
        "cell": out / "cell.json",
    }
    assert all(p.is_file() for p in paths.values())
    # No per-rank train/moe files in this raw dir: the tables exist, empty but with the params.
    assert pd.read_parquet(paths["moe"]).empty


@pytest.mark.parametrize("table", ["ops", "steps", "counters"])
def test_params_repeated_on_every_row(
    built: tuple[dict[str, Any], dict[str, Path]], table: str
) -> None:
    cell, paths = built
    frame = pd.read_parquet(paths[table])
    assert len(frame) > 0
    for axis in SWEEP_AXES:
        assert (frame[axis] == cell[axis]).all(), axis
    assert (frame["cell"] == cell_id(cell)).all()
    assert frame["cell"].iloc[0] == (
        "strategy~ddp/model~gpt-tiny/nodes~2/ranks_per_node~1/bw~50mbit/"
        "delay~0ms/jitter~0ms/loss~0pct/cc~cubic/steps~3/repeat~1"
    )
    # Integer axes stay integers (aggregation groups on them).
    assert pd.api.types.is_integer_dtype(frame["nodes"])
    assert pd.api.types.is_integer_dtype(frame["repeat"])


def test_ops_table(built: tuple[dict[str, Any], dict[str, Path]]) -> None:
    _, paths = built
    ops = pd.read_parquet(paths["ops"])
    assert len(ops) == 6  # 2 ranks x 3 ops
    assert ops["rank"].tolist() == [0, 0, 0, 1, 1, 1]
    assert ops["step"].tolist() == [0, 1, 2, 0, 1, 2]  # sorted by time within a rank
    assert ops["node"].tolist() == [0, 0, 0, 1, 1, 1]
    expected_cols = ["rank", "node", "local_rank"] + [f.name for f in dataclasses.fields(OpRecord)]
    assert list(ops.columns[: len(expected_cols)]) == expected_cols
    assert list(ops.columns[len(expected_cols) :]) == [*SWEEP_AXES, "cell"]
    assert ops.groupby("rank")["bytes"].sum().tolist() == [3 * b for b in GRAD_BYTES]
    assert (ops["t_end_ns"] - ops["t_issue_ns"] == 5 * MS).all()


def test_steps_table(built: tuple[dict[str, Any], dict[str, Path]]) -> None:
    _, paths = built
    steps = pd.read_parquet(paths["steps"])
    assert len(steps) == 6
    assert steps["rank"].tolist() == [0, 0, 0, 1, 1, 1]
    assert steps["step"].tolist() == [0, 1, 2, 0, 1, 2]
    assert (steps["phase"] == "step").all()


def test_counters_table(built: tuple[dict[str, Any], dict[str, Path]]) -> None:
    _, paths = built
    counters = pd.read_parquet(paths["counters"])
    assert list(counters.columns) == [
        "node",
        "iface",
        "t_ns",
        "tx_bytes",
        "rx_bytes",
        "tx_packets",
        "rx_packets",
        "resolution_ns",
        *SWEEP_AXES,
        "cell",
    ]
    # run.json says nothing of the sampler's rate here: resolution unknown (0).
    assert set(counters["resolution_ns"]) == {0}
    assert counters["node"].tolist() == [0] * 5 + [1] * 5
    for node, rows in counters.groupby("node"):
        base = 1_000_000 * (node + 1)
        assert rows["t_ns"].tolist() == [T0 + k * MS for k in range(5)]  # sorted by time
        assert rows["rx_bytes"].tolist() == [base + 10 * k for k in range(5)]
        assert rows["tx_bytes"].tolist() == [base + 20 * k for k in range(5)]
        assert rows["tx_packets"].tolist() == [base // 1000 + 2 * k for k in range(5)]
    assert set(counters["iface"]) == {"exp0"}


def test_counters_node_index_comes_from_run_json(tmp_path: Path) -> None:
    # Directory names that do not encode (or sort like) the node index.
    cell = make_cell()
    raw = make_raw(tmp_path, cell, names=("alpha", "beta"), indices=(1, 0))
    paths = build_cell_tables(
        raw, CellSettings.from_mapping(cell), warmup_steps=0, paths=cell_table_paths(tmp_path / "t")
    )
    counters = pd.read_parquet(paths["counters"])
    # alpha is node 1 (its counters start at 2_000_000), beta node 0 (1_000_000).
    first = counters.groupby("node")["rx_bytes"].min().to_dict()
    assert first == {0: 1_000_000, 1: 2_000_000}


def test_cell_json(built: tuple[dict[str, Any], dict[str, Path]]) -> None:
    cell, paths = built
    meta = json.loads(paths["cell"].read_text())
    assert meta["cell"] == cell_id(cell)
    assert meta["params"] == cell
    assert list(meta["params"]) == list(SWEEP_AXES)
    assert meta["world_size"] == 2
    assert meta["backend"] == "gloo"
    assert meta["bw_bps"] == 50_000_000
    assert meta["grad_bytes"] == GRAD_BYTES[0]
    assert meta["grad_bytes_per_rank"] == GRAD_BYTES
    assert meta["warmup_steps"] == 1
    assert meta["t0_ns"] == T0
    assert meta["t1_ns"] == T0 + 400 * MS
    assert meta["qdisc_before"]["node0"]["exp0"]["sent_bytes"] == 0
    assert meta["qdisc_after"]["node1"]["exp0"]["sent_bytes"] == 123
    assert meta["torch"] == "2.13.0+cpu"


@pytest.mark.parametrize(("bw", "bps"), [("none", None), ("1gbit", 10**9), ("500kbit", 500_000)])
def test_cell_json_rate(tmp_path: Path, bw: str, bps: int | None) -> None:
    cell = make_cell(bw=bw, delay="10ms", loss="0.5pct")
    raw = make_raw(tmp_path, cell)
    paths = build_cell_tables(
        raw, CellSettings.from_mapping(cell), warmup_steps=2, paths=cell_table_paths(tmp_path / "t")
    )
    meta = json.loads(paths["cell"].read_text())
    assert meta["bw_bps"] == bps
    assert meta["warmup_steps"] == 2
    assert meta["params"]["delay"] == "10ms"


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        ("ops_rank*.parquet", "no ops_rank*.parquet files under"),
        ("steps_rank*.parquet", "no steps_rank*.parquet files under"),
        ("counters.parquet", "nor counters.parquet under"),
    ],
)
def test_missing_raw_files(tmp_path: Path, pattern: str, fragment: str) -> None:
    cell = make_cell()
    raw = make_raw(tmp_path, cell)
    for path in raw.glob(f"*/{pattern}"):
        path.unlink()
    with pytest.raises(FileNotFoundError) as info:
        build_cell_tables(
            raw,
            CellSettings.from_mapping(cell),
            warmup_steps=1,
            paths=cell_table_paths(tmp_path / "t"),
        )
    assert fragment in str(info.value)
    assert str(raw) in str(info.value)


def test_missing_run_json(tmp_path: Path) -> None:
    cell = make_cell()
    raw = make_raw(tmp_path, cell)
    (raw / "run.json").unlink()
    with pytest.raises(FileNotFoundError, match="run.json"):
        build_cell_tables(
            raw,
            CellSettings.from_mapping(cell),
            warmup_steps=1,
            paths=cell_table_paths(tmp_path / "t"),
        )


def test_wire_accounting_replaces_sampler_and_capture(tmp_path: Path) -> None:
    """With wire.parquet on every node (the BPF source), the counters and the node-pair flows
    come from it: rx from the node's own ingress, tx from what the peer received from it."""
    cell = make_cell()
    raw = make_raw(tmp_path, cell)
    run = json.loads((raw / "run.json").read_text())
    addrs = {0: "198.19.0.1", 1: "198.19.0.2"}
    for node in run["nodes"]:
        node["exp_addr"] = addrs[node["index"]]
    run["wire"] = {"source": "bpf", "bin_ns": 100_000, "reason": None, "requested": "bpf"}
    (raw / "run.json").write_text(json.dumps(run))
    for name, index in (("node0", 0), ("node1", 1)):
        d = raw / name
        (d / "counters.parquet").unlink()
        other = addrs[1 - index]
        # Each node receives 1500 B per bin from the other in bins 10..14 after T0.
        bins = pd.DataFrame(
            {
                "t_ns": [T0 + b * 100_000 for b in range(10, 15)],
                "hook": "ingress",
                "peer": other,
                "bytes": 1500 * (index + 1),
                "packets": 1,
                "skbs": 1,
            }
        )
        bins.to_parquet(d / "wire.parquet", index=False)
        meta = {
            "bin_ns": 100_000,
            "t_start_ns": T0,
            "t_end_ns": T0 + 400 * MS,
            "overruns": {"ingress": 0, "egress": 0},
            "totals": {"ingress": {"bytes": 7500, "packets": 5}, "egress": {"bytes": 0}},
            "counters_start": {"rx_bytes": 0, "tx_bytes": 0},
            "counters_end": {"rx_bytes": 7500, "tx_bytes": 0},
        }
        (d / "wire.json").write_text(json.dumps(meta))
    paths = build_cell_tables(
        raw, CellSettings.from_mapping(cell), warmup_steps=1, paths=cell_table_paths(tmp_path / "t")
    )
    counters = pd.read_parquet(paths["counters"])
    assert set(counters["resolution_ns"]) == {100_000}
    last = counters.sort_values("t_ns").groupby("node").last()
    assert last.loc[0, "rx_bytes"] == 5 * 1500 * 1 and last.loc[0, "tx_bytes"] == 5 * 1500 * 2
    assert last.loc[1, "rx_bytes"] == 5 * 1500 * 2 and last.loc[1, "tx_bytes"] == 5 * 1500 * 1
    flows = pd.read_parquet(paths["wire_flows"])
    by_pair = flows.groupby(["src_node", "dst_node"])["bytes"].sum().to_dict()
    assert by_pair == {(1, 0): 7500, (0, 1): 15000}
    meta = json.loads(paths["cell"].read_text())
    assert meta["wire"]["source"] == "bpf"
    assert (
        meta["wire"]["nodes"]["0"]["bpf"]["rx_bytes"]
        == meta["wire"]["nodes"]["0"]["iface"]["rx_bytes"]
    )
