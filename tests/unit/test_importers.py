"""Importers (Kineto, PyTorch ET, Chakra, NCCL logs) on real traces from other projects.

The expected values were read off the raw files (tests/data/external/README.md lists them):
the HTA ResNet-50 DDP trace issues, per profiler step, two buffer broadcasts (53,120 float32,
53 int64) and five gradient buckets (2,049,000 / 7,875,584 / 6,563,840 / 6,637,568 /
2,431,040 float32) over process group "0" = ranks 0,1; the param ResNet ET and the Chakra
feeder trace record the same model, so they must give the same buckets.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import struct
import tarfile
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from commscope import metrics
from commscope.importers import (
    KNOWN_OPS,
    OPS_COLUMNS,
    OPS_DTYPES,
    SPLIT_COLUMN,
    load_chakra,
    load_execution_trace,
    load_kineto,
    load_nccl_log,
    load_trace,
    normalize_dtype,
    normalize_op,
    sniff_format,
)
from commscope.importers.chakra import read_chakra

DATA = Path(__file__).resolve().parents[1] / "data" / "external"
HTA_NCCL = DATA / "hta" / "nccl_parser_config__nccl_data.json.gz"
HTA_SAMPLED = [DATA / "hta" / f"trace_filter__sampled_rank-{r}.json.gz" for r in (0, 1)]
RESNET_ET = DATA / "param" / "resnet_2gpu_et.json.gz"
DLRM_KINETO = DATA / "param" / "dlrm_kineto__worker0_step_12.1694128201545.pt.trace.json.gz"
DLRM_ET = DATA / "param" / "dlrm_pytorch_et__dlrm_eg_0.json.gz"
NCCL_LOG = DATA / "nccl" / "nccl_init_coll_2ranks.log"

RESNET_BUCKETS = [2_049_000, 7_875_584, 6_563_840, 6_637_568, 2_431_040]  # float32 elements
RESNET_BROADCASTS = [("float32", 53_120, 212_480), ("int64", 53, 424)]
PHASES = {"fwd", "bwd", "optim", "fwd_bwd", "other"}


def assert_contract(ops: pd.DataFrame, source: str) -> None:
    """Same columns, order and dtypes as the capture's ops table."""
    assert list(ops.columns) == list(OPS_COLUMNS)
    assert {c: str(ops[c].dtype) for c in OPS_COLUMNS} == {
        c: str(pd.Series([], dtype=d).dtype) for c, d in OPS_DTYPES.items()
    }
    assert set(ops["source"]) == {source}
    assert set(ops["op"]) <= KNOWN_OPS
    assert set(ops["phase"]) <= PHASES


def _extract(tar_path: Path, member: str, dest: Path) -> Path:
    with tarfile.open(tar_path) as tar:
        data = tar.extractfile(member)
        assert data is not None
        out = dest / Path(member).name
        out.write_bytes(data.read())
    return out


@pytest.fixture(scope="module")
def hta() -> pd.DataFrame:
    return load_kineto(HTA_NCCL)


@pytest.fixture(scope="module")
def resnet_et() -> pd.DataFrame:
    return load_execution_trace(RESNET_ET)


@pytest.fixture(scope="module")
def chakra_et(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("chakra")
    return _extract(DATA / "chakra" / "feeder_tests_trace.tar.gz", "tests/data/chakra.0.et", tmp)


# --------------------------------------------------------------------------------------------
# The table contract
# --------------------------------------------------------------------------------------------


def test_columns_are_the_captures() -> None:
    from commscope.workload.capture import OpRecord

    fields = [f.name for f in dataclasses.fields(OpRecord)]
    assert ("rank", "node", "local_rank", *fields) == OPS_COLUMNS


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("allreduce", "allreduce"),
        ("nccl:all_reduce", "allreduce"),
        ("AllReduce", "allreduce"),
        ("allreduce_coalesced", "allreduce"),
        ("_allgather_base", "allgather"),
        ("nccl:_all_gather_base", "allgather"),
        ("allgather_into_tensor_coalesced", "allgather"),
        ("_reduce_scatter_base", "reduce_scatter"),
        ("ReduceScatter", "reduce_scatter"),
        ("all_to_allv", "alltoall"),
        ("alltoall_base", "alltoall"),
        ("recvAnySource", "recv"),
        ("Broadcast", "broadcast"),
        ("reduce", "reduce"),
        ("wait", None),
        ("coalesced", None),
        ("", None),
    ],
)
def test_normalize_op(name: str, op: str | None) -> None:
    assert normalize_op(name) == op


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("Float", "float32"),
        ("Long", "int64"),
        ("Byte", "uint8"),
        ("BFloat16", "bfloat16"),
        ("long int", "int64"),
        ("signed char", "int8"),
        ("unsigned char", "uint8"),
        ("c10::Half", "float16"),
        ("Tensor(c10::BFloat16)", "bfloat16"),
        ("GenericList[Tensor(float)]", "float32"),
        ("Float8_e4m3fn", "float8_e4m3fn"),
        (None, ""),
    ],
)
def test_normalize_dtype(name: str | None, dtype: str) -> None:
    assert normalize_dtype(name) == dtype


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        (HTA_NCCL, "kineto"),
        (HTA_SAMPLED[0], "kineto"),
        (RESNET_ET, "pytorch_et"),
        (DLRM_ET, "pytorch_et"),
        (NCCL_LOG, "nccl_log"),
    ],
)
def test_sniff_format(path: Path, kind: str) -> None:
    assert sniff_format(path) == kind


def test_load_trace_dispatches(chakra_et: Path) -> None:
    assert sniff_format(chakra_et) == "chakra"
    assert len(load_trace(chakra_et)) == 7
    assert len(load_trace(NCCL_LOG)) == 14
    assert len(load_trace(DLRM_KINETO)) == 8


# --------------------------------------------------------------------------------------------
# Kineto
# --------------------------------------------------------------------------------------------


def test_kineto_hta_ddp_per_step(hta: pd.DataFrame) -> None:
    assert_contract(hta, "kineto")
    assert len(hta) == 21  # the six c10d "wait" entries are not transfers
    assert set(hta["rank"]) == {0}  # distributedInfo.rank
    assert sorted(hta["step"].unique()) == [4, 5, 6]
    for _, step in hta.groupby("step"):
        assert step["op"].tolist() == ["broadcast", "broadcast", *["allreduce"] * 5]
        bcast = step[step["op"] == "broadcast"]
        assert list(zip(bcast["dtype"], bcast["numel"], bcast["bytes"], strict=True)) == (
            RESNET_BROADCASTS
        )
        ar = step[step["op"] == "allreduce"]
        assert ar["numel"].tolist() == RESNET_BUCKETS
        assert ar["bytes"].tolist() == [4 * n for n in RESNET_BUCKETS]
        assert (ar["bytes_out"] == ar["bytes"]).all()
        # DDP syncs buffers in its forward, reduces gradients from autograd hooks.
        assert set(bcast["phase"]) == {"fwd"} and set(ar["phase"]) == {"bwd"}
    assert set(hta["group"]) == {"0"}
    assert set(hta["group_ranks"]) == {"0,1"}
    assert set(hta["group_size"]) == {2}
    assert hta["seq"].tolist() == list(range(21))  # no "Seq" arg in this PyTorch version
    assert hta["t_end_ns"].notna().all()
    assert (hta["t_end_ns"] > hta["t_issue_ns"]).all()


def test_kineto_times_are_exact_epoch_ns(hta: pd.DataFrame) -> None:
    # First broadcast: record_param_comms ts 4458676423264.031 µs + baseTimeNanoseconds
    # 1711964646000000000; its kernel runs 4458676423385.774 µs for 30.975 µs.
    first = hta.iloc[0]
    assert first["t_issue_ns"] == 1_711_964_646_000_000_000 + 4_458_676_423_264_031
    assert first["t_end_ns"] == 1_711_964_646_000_000_000 + 4_458_676_423_416_749


def test_parquet_round_trip(hta: pd.DataFrame, tmp_path: Path) -> None:
    ops = load_execution_trace(DLRM_ET)  # with the optional split_bytes column
    for frame in (hta, ops):
        frame.to_parquet(tmp_path / "ops.parquet", index=False)
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "ops.parquet"), frame)


def test_kineto_metrics_work(hta: pd.DataFrame) -> None:
    # Ring model, 2 ranks: rank 0 sends each bucket once (2(n-1)/n = 1); this trace does not
    # record broadcast roots, so a broadcast counts its expected share (n-1)/n = 1/2.
    matrix = metrics.comm_matrix(hta, warmup_steps=0)
    per_pair = matrix.groupby(["src_rank", "dst_rank"])["bytes"].sum()
    expected = 4 * sum(RESNET_BUCKETS) + (212_480 + 424) / 2
    assert per_pair.to_dict() == {(0, 1): pytest.approx(expected)}


def test_kineto_old_format_sampled_ranks() -> None:
    ops = load_kineto(HTA_SAMPLED)
    assert_contract(ops, "kineto")
    assert ops.groupby("rank").size().to_dict() == {0: 10, 1: 10}
    rank0 = ops[ops["rank"] == 0]
    assert sorted(rank0["step"].unique()) == [551, 552]
    # Values of the nccl:* annotations' Input Dims and their c10d op's output dims.
    assert rank0[["op", "dtype", "numel", "bytes_out"]].values.tolist() == [
        ["alltoall", "int64", 384, 3072],
        ["alltoall", "uint8", 419_430_400, 382_132_224],
        ["allreduce", "float32", 19_618_307, 78_473_228],
        ["allreduce", "float32", 26_955_536, 107_822_144],
        ["allgather", "int8", 16_777_216, 1_073_741_824],
        ["alltoall", "uint8", 419_430_400, 382_132_224],
        ["alltoall", "int32", 2_846_720, 10_485_760],
        ["allreduce", "float32", 26_258_430, 105_033_720],
        ["allreduce", "float32", 5_716_654, 22_866_616],
        ["allgather", "int8", 16_777_216, 1_073_741_824],
    ]
    # No group is recorded; a gather's output over its input still gives the group size.
    assert set(rank0.loc[rank0["op"] == "allgather", "group_size"]) == {64}
    assert set(rank0.loc[rank0["op"] != "allgather", "group_size"]) == {-1}
    assert set(rank0["group_ranks"]) == {""}
    assert set(rank0.loc[rank0["op"] == "allgather", "phase"]) == {"optim"}


def test_kineto_and_et_of_the_same_dlrm_rank_agree() -> None:
    kineto = load_kineto(DLRM_KINETO)
    et = load_execution_trace(DLRM_ET)
    assert_contract(kineto, "kineto")
    assert_contract(et, "pytorch_et")
    expected = [
        ("alltoall", "float32", 6144),
        ("alltoall", "int64", 24),
        ("alltoall", "int32", 384),
        ("alltoall", "int32", 3392),
        ("allreduce", "float32", 394_241),
        ("alltoall", "float32", 6144),
        ("allreduce", "float32", 112),
        ("allreduce", "float32", 226_960),
    ]
    for ops in (kineto, et):
        assert list(zip(ops["op"], ops["dtype"], ops["numel"], strict=True)) == expected
        assert set(ops["rank"]) == {0}
    assert kineto["bytes"].tolist() == et["bytes"].tolist()
    assert set(kineto["step"]) == {10}  # ProfilerStep#10
    # all_to_allv: the output is the sum of the recv splits (8 x 96 int32).
    assert kineto["bytes_out"].iloc[3] == et["bytes_out"].iloc[3] == 3072


def test_kineto_newer_args(tmp_path: Path) -> None:
    """Rank/Seq/Src-Dst/split args of PyTorch ≥ 2.4 on a hand-written trace."""

    def rpc(ts: float, **args: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1,
                "ts": ts, "dur": 5, "args": args}  # fmt: skip

    group = {"Process Group Name": "5", "Process Group Ranks": "[1, 3]", "Group size": 2}
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1,
         "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "user_annotation", "name": "## forward ##", "pid": 1, "tid": 1,
         "ts": 1, "dur": 500},
        rpc(10.5, **{"Collective name": "broadcast", "In msg nelems": 100,
                     "Out msg nelems": 100, "dtype": "BFloat16", "Rank": 1, "Seq": 41}, **group),
        {"ph": "X", "cat": "user_annotation", "name": "nccl:broadcast", "pid": 1, "tid": 1,
         "ts": 11, "dur": 3},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 12, "dur": 1, "args": {"correlation": 900}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_Broadcast_RING_LL", "pid": 0,
         "tid": 7, "ts": 20, "dur": 30.25, "args": {"correlation": 900}},
        rpc(100, **{"Collective name": "send", "In msg nelems": 64, "Out msg nelems": 64,
                    "dtype": "Float", "Rank": 1, "Dst Rank": 3}, **group),
        rpc(200, **{"Collective name": "all_to_allv", "In msg nelems": 8, "Out msg nelems": 8,
                    "dtype": "Float", "In split size": "[1, 3]"}, **group),
        rpc(300, **{"Collective name": "wait", "In msg nelems": 0, "dtype": "Byte"}),
        {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 1,
         "tid": 1, "ts": 600, "dur": 300},
        rpc(700, **{"Collective name": "recv", "In msg nelems": 64, "Out msg nelems": 64,
                    "dtype": "Float", "Rank": 0}, **group),
        rpc(2000, **{"Collective name": "allreduce", "In msg nelems": 10, "dtype": "Float",
                     "Group size": 4, "Process Group Ranks": "[0, 2, ...]",
                     "Global rank start": 0, "Global rank stride": 2,
                     "Process Group Name": "7"}),
    ]  # fmt: skip
    doc = {
        "distributedInfo": {"rank": 3, "world_size": 8},
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "traceEvents": events,
    }
    path = tmp_path / "trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    ops = load_kineto(path)
    assert_contract(ops, "kineto")
    t0 = 1_700_000_000_000_000_000
    assert ops["op"].tolist() == ["broadcast", "send", "alltoall", "recv", "allreduce"]
    assert ops["step"].tolist() == [7, 7, 7, 7, -1]
    assert ops["phase"].tolist() == ["fwd", "fwd", "fwd", "optim", "other"]
    assert ops["root"].tolist() == [3, -1, -1, -1, -1]  # "Rank" 1 of group [1, 3]
    assert ops["peer"].tolist() == [-1, 3, -1, 1, -1]
    assert ops["seq"].tolist() == [41, 0, 42, 0, 0]
    assert ops["bytes"].tolist() == [200, 256, 32, 256, 40]
    assert ops[SPLIT_COLUMN].isna().tolist() == [True, True, False, True, True]
    assert ops[SPLIT_COLUMN].iloc[2] == "8,24"  # 8 floats in rows split 1:3
    assert ops["group_ranks"].tolist() == ["1,3"] * 4 + ["0,2,4,6"]
    assert ops["t_issue_ns"].iloc[0] == t0 + 10_500
    assert ops["t_end_ns"].iloc[0] == t0 + 50_250
    assert ops["t_end_ns"].iloc[1:].isna().all()


# --------------------------------------------------------------------------------------------
# PyTorch execution traces
# --------------------------------------------------------------------------------------------


def test_et_resnet_ddp(resnet_et: pd.DataFrame) -> None:
    ops = resnet_et
    assert_contract(ops, "pytorch_et")
    assert set(ops["rank"]) == {1}  # the allreduces' rank slot; README: rank 1 of 2
    assert (ops["op"] == "allreduce").sum() == 15
    assert (ops["op"] == "broadcast").sum() == 6
    assert sorted(ops["step"].unique()) == [4, 5, 6]
    for _, step in ops.groupby("step"):
        assert step.loc[step["op"] == "allreduce", "bytes"].tolist() == [
            4 * n for n in RESNET_BUCKETS
        ]
        bcast = step[step["op"] == "broadcast"]
        assert list(zip(bcast["dtype"], bcast["numel"], bcast["bytes"], strict=True)) == (
            RESNET_BROADCASTS
        )
    assert ops["seq"].tolist() == list(range(33, 54))  # c10d's own sequence numbers
    assert set(ops["group"]) == {"0"} and set(ops["group_ranks"]) == {"0,1"}
    assert set(ops.loc[ops["op"] == "broadcast", "root"]) == {0}
    assert set(ops.loc[ops["op"] == "broadcast", "phase"]) == {"fwd"}
    assert set(ops.loc[ops["op"] == "allreduce", "phase"]) == {"bwd"}
    assert (ops["t_issue_ns"] == -1).all() and ops["t_end_ns"].isna().all()


def test_et_matches_kineto_of_the_same_model(resnet_et: pd.DataFrame, hta: pd.DataFrame) -> None:
    cols = ["step", "phase", "op", "group", "group_ranks", "group_size", "dtype", "numel", "bytes"]
    assert resnet_et[cols].reset_index(drop=True).equals(hta[cols].reset_index(drop=True))


def test_et_chakra_schema_allgathers(tmp_path: Path) -> None:
    path = _extract(DATA / "chakra" / "1.0.2-chakra.0.0.4.tgz", "1.0.2-chakra.0.0.4.json", tmp_path)
    ops = load_execution_trace(path)
    assert_contract(ops, "pytorch_et")
    assert len(ops) == 10 and set(ops["op"]) == {"allgather"}
    assert set(ops["numel"]) == {1} and set(ops["dtype"]) == {"float32"}
    assert set(ops["bytes"]) == {4} and set(ops["bytes_out"]) == {8}  # 2 gathered floats
    # backend id 82149104 → pg "0" of "## process_group:init ##", size 2, all ranks.
    assert set(ops["group"]) == {"0"} and set(ops["group_ranks"]) == {"0,1"}
    assert ops["seq"].tolist() == list(range(12, 22))
    assert set(ops["rank"]) == {0}


def test_et_dlrm_splits_and_group() -> None:
    ops = load_execution_trace(DLRM_ET)
    # The 1.0.1 schema names the group by pointer only; an all_to_allv's split list tells its
    # size, which then holds for the group's other ops.
    assert ops["group"].nunique() == 1 and set(ops["group_size"]) == {8}
    a2a = ops[ops[SPLIT_COLUMN].notna()]
    assert a2a[SPLIT_COLUMN].tolist() == [
        ",".join(["3072"] * 8),
        ",".join(["192"] * 8),
        "384,896,1152,6656,2368,384,768,960",  # uneven: sums to 3392 int32 = 13568 B
        ",".join(["3072"] * 8),
    ]
    assert ops["seq"].tolist() == list(range(147, 155))


# --------------------------------------------------------------------------------------------
# Chakra
# --------------------------------------------------------------------------------------------


def test_chakra_feeder_trace(chakra_et: Path) -> None:
    meta, nodes = read_chakra(chakra_et)
    assert meta["schema"] == "1.0.1" and meta["pid"] == 114598
    assert len(nodes) == 3664
    comm_nodes = [n for n in nodes if n.type == 7]
    assert len(comm_nodes) == 21  # GPU kernels plus the CPU c10d launchers
    typed = [n for n in comm_nodes if "comm_type" in n.attrs]
    assert [n.attrs["comm_type"] for n in typed] == [5, 5, 0, 0, 0, 0, 0]
    assert [n.attrs["comm_size"] for n in typed] == [212_480, 424, *[4 * n for n in RESNET_BUCKETS]]

    ops = load_chakra(chakra_et)
    assert_contract(ops, "chakra")
    assert ops["op"].tolist() == ["broadcast", "broadcast", *["allreduce"] * 5]
    assert ops["bytes"].tolist() == [212_480, 424, *[4 * n for n in RESNET_BUCKETS]]
    assert ops["dtype"].tolist() == ["float32", "int64", *["float32"] * 5]
    assert set(ops["rank"]) == {0}  # chakra.<rank>.et
    assert ops["seq"].tolist() == list(range(7))
    assert (ops["t_issue_ns"] == -1).all() and ops["t_end_ns"].isna().all()


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes | int) -> bytes:
    key = _varint(number << 3 | wire)
    if wire == 0:
        assert isinstance(payload, int)
        return key + _varint(payload)
    if wire == 2:
        assert isinstance(payload, bytes)
        return key + _varint(len(payload)) + payload
    assert isinstance(payload, bytes)
    return key + payload


def _attr(name: str, number: int, wire: int, payload: bytes | int) -> bytes:
    return _field(1, 2, name.encode()) + _field(number, wire, payload)


def test_chakra_wire_decoding(tmp_path: Path) -> None:
    """A stream encoded by hand, field numbers as et_def.proto lays them out (not by the
    exporter), read through the vendored schema: node fields, attribute oneofs of every
    encoding (two's complement, zigzag, fixed 64, packed and repeated lists), metadata."""
    packed = b"".join(_varint(v) for v in (1, 0, 1))
    odd_attrs = (
        _field(10, 2, _attr("a", 9, 0, -5))  # int64, two's complement
        + _field(10, 2, _attr("b", 17, 0, 5))  # sint64, zigzag: -3
        + _field(10, 2, _attr("c", 3, 1, struct.pack("<d", 2.5)))  # double
        + _field(10, 2, _attr("d", 28, 2, _field(1, 2, packed)))  # bool_list, packed
        + _field(10, 2, _attr("e", 30, 2, _field(1, 2, b"x") + _field(1, 2, b"yz")))
    )

    io_info = (
        _field(1, 2, b"[[1, 2, 0, 256, 2, 'cuda:0']]")
        + _field(2, 2, b"[[256]]")
        + _field(3, 2, b"['Tensor(c10::BFloat16)']")
    )
    send = (
        _field(1, 0, 5)
        + _field(2, 2, b"ncclDevKernel_SendRecv")
        + _field(3, 0, 5)  # COMM_SEND_NODE
        + _field(4, 2, _varint(4))  # packed ctrl_deps
        + _field(6, 0, 1000)
        + _field(7, 0, 7)
        + _field(8, 2, io_info)
        + _field(10, 2, _attr("comm_size", 9, 0, 512))
        + _field(10, 2, _attr("comm_dst", 7, 0, 3))
        + _field(10, 2, _attr("pg_name", 29, 2, b"1"))
        + odd_attrs
    )
    launcher = _field(1, 0, 4) + _field(2, 2, b"c10d::send") + _field(3, 0, 7)
    meta = _field(1, 2, b"0.0.4") + _field(2, 2, _attr("schema", 29, 2, b"test"))
    stream = b"".join(_varint(len(m)) + m for m in (meta, launcher, send))
    path = tmp_path / "trace.3.et.gz"
    path.write_bytes(gzip.compress(stream))

    meta_out, nodes = read_chakra(path)
    assert meta_out == {"version": "0.0.4", "schema": "test"}
    assert [n.id for n in nodes] == [4, 5] and nodes[1].ctrl_deps == [4]
    odd = {k: nodes[1].attrs[k] for k in "abcde"}
    assert odd == {"a": -5, "b": -3, "c": 2.5, "d": [True, False, True], "e": ["x", "yz"]}
    ops = load_chakra(path)
    assert_contract(ops, "chakra")
    row = ops.iloc[0]
    assert len(ops) == 1  # the launcher has no comm attributes
    assert (row["rank"], row["op"], row["peer"], row["group"]) == (3, "send", 3, "1")
    assert (row["dtype"], row["numel"], row["bytes"]) == ("bfloat16", 256, 512)
    assert (row["t_issue_ns"], row["t_end_ns"]) == (1_000_000, 1_007_000)


# --------------------------------------------------------------------------------------------
# NCCL logs
# --------------------------------------------------------------------------------------------


def test_nccl_log_merged_two_ranks() -> None:
    ops = load_nccl_log(NCCL_LOG)
    assert_contract(ops, "nccl_log")
    assert len(ops) == 14
    assert ops.groupby("rank").size().to_dict() == {0: 7, 1: 7}
    assert ops.groupby("rank")["node"].first().to_dict() == {0: 0, 1: 1}  # node-a, node-b
    rank0 = ops[ops["rank"] == 0]
    assert rank0[["op", "dtype", "numel", "bytes", "bytes_out", "seq"]].values.tolist() == [
        ["broadcast", "float32", 53_120, 212_480, 212_480, 0],
        ["allreduce", "float32", 6_400_000, 25_600_000, 25_600_000, 1],
        ["allreduce", "float32", 1_049_600, 4_198_400, 4_198_400, 2],
        # count is per rank: AllGather's send count, ReduceScatter's receive count.
        ["allgather", "bfloat16", 1024, 2048, 4096, 3],
        ["reduce_scatter", "bfloat16", 1024, 2048, 1024, 4],
        ["send", "float16", 4096, 8192, 8192, 0],
        ["allreduce", "float32", 1, 4, 4, 5],
    ]
    # Groups are named by commId, the same on both ranks; members come from the init lines.
    world = "0x7c3a5e9d21b04f88"
    assert set(ops["group"]) == {world, "0x11aa22bb33cc44dd"}
    assert set(ops["group_ranks"]) == {"0,1"}
    assert rank0["root"].iloc[0] == 0
    recv = ops[ops["op"] == "recv"].iloc[0]
    assert (recv["rank"], recv["peer"], recv["bytes"]) == (1, 0, 8192)
    assert (ops["t_issue_ns"] == -1).all() and set(ops["step"]) == {-1}


def test_nccl_log_old_format_coll_only() -> None:
    """NCCL before opCount, COLL subsystem only: no init lines, rank given by the caller."""
    text = (
        "gpu07:5512:5512 [3] NCCL INFO AllReduce: sendbuff 0x7f00 recvbuff 0x7f00 count 1024"
        " datatype 7 op 0 root 0 comm 0x1234 [nranks=8] stream 0x99\n"
        "some other output\n"
        "gpu07:5512:5512 [3] NCCL INFO Broadcast: sendbuff 0x7f00 recvbuff 0x7f00 count 10"
        " datatype 4 op 0 root 2 comm 0x1234 [nranks=8] stream 0x99\n"
        "gpu07:5512:5512 [3] NCCL INFO AllGather: sendbuff 0x7f00 recvbuff 0x7f80 count 16"
        " datatype 9 op 0 root 0 comm 0x5678 [nranks=4] stream 0x99\n"
    )
    ops = load_nccl_log(text, rank=3)
    assert_contract(ops, "nccl_log")
    assert ops["op"].tolist() == ["allreduce", "broadcast", "allgather"]
    assert set(ops["rank"]) == {3}
    assert ops["bytes"].tolist() == [4096, 80, 32]
    assert ops["bytes_out"].tolist() == [4096, 80, 128]
    assert ops["group"].tolist() == ["0x1234", "0x1234", "0x5678"]
    # The 8-rank communicator is the largest seen: taken as the world, so its root is global.
    assert ops["group_ranks"].tolist() == [",".join(map(str, range(8)))] * 2 + [""]
    assert ops["root"].tolist() == [-1, 2, -1]
    assert ops["seq"].tolist() == [0, 1, 0]  # no opCount: numbered per communicator
    assert load_nccl_log(text)["rank"].eq(-1).all()  # no init lines, no rank given
