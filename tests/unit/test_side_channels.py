"""Packet headers, socket statistics, clock offsets and NCCL logs in the per-cell tables."""

from __future__ import annotations

import gzip
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_traces import T0, make_cell, make_raw

from commscope.cell.parse import build_cell_tables, cell_table_paths, to_orchestrator_clock
from commscope.cell.pcap import read_pcap, wire_flows
from commscope.cluster.clock import offset_at
from commscope.node.sockstats import COLUMNS, TCP_INFO_FIELDS, socket_rows
from commscope.spec.settings import CellSettings

NCCL_LOG = Path(__file__).parents[1] / "data/external/nccl/nccl_init_coll_2ranks.log"
ADDR = {"198.19.0.1": 0, "198.19.0.2": 1}


def _frame(src: str, dst: str, ethertype: int = 0x0800, payload: int = 0) -> bytes:
    eth = b"\x02" * 6 + b"\x04" * 6 + struct.pack(">H", ethertype)
    ip = struct.pack(">BBHHHBBH", 0x45, 0, 20 + payload, 0, 0, 64, 6, 0)
    ip += bytes(map(int, src.split("."))) + bytes(map(int, dst.split(".")))
    return eth + ip


def write_pcap(path: Path, packets: list[tuple[int, bytes, int]], nano: bool = True) -> None:
    """A classic little-endian pcap: (time ns, captured frame head, original length)."""
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out = struct.pack("<IHHiIII", magic, 2, 4, 0, 0, 96, 1)
    for t_ns, head, orig in packets:
        sec, frac = divmod(t_ns, 1_000_000_000)
        frac = frac if nano else frac // 1000
        out += struct.pack("<IIII", sec, frac, len(head), orig) + head
    path.write_bytes(out)


def test_read_pcap_takes_times_addresses_and_original_lengths(tmp_path: Path) -> None:
    t = 1_700_000_000_123_456_789
    write_pcap(
        tmp_path / "a.pcap",
        [
            (t, _frame("198.19.0.1", "198.19.0.2"), 65_000),  # a GSO super-packet
            (t + 5, _frame("198.19.0.2", "198.19.0.1"), 66),  # an ACK
            (t + 9, b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + b"\x00" * 28, 42),  # ARP: skipped
        ],
    )
    pk = read_pcap(tmp_path / "a.pcap")
    assert pk.t_ns.tolist() == [t, t + 5]
    assert pk.src.tolist() == ["198.19.0.1", "198.19.0.2"]
    assert pk.dst.tolist() == ["198.19.0.2", "198.19.0.1"]
    assert pk.length.tolist() == [65_000, 66]
    # Microsecond files keep microseconds; a truncated last record is dropped, not misread.
    write_pcap(tmp_path / "u.pcap", [(t, _frame("198.19.0.1", "198.19.0.2"), 100)], nano=False)
    data = (tmp_path / "u.pcap").read_bytes()
    (tmp_path / "u.pcap").write_bytes(data + data[24:40])
    pk = read_pcap(tmp_path / "u.pcap")
    assert pk.t_ns.tolist() == [t // 1000 * 1000]
    # As the runner fetches it: gzip-compressed.
    (tmp_path / "a.pcap.gz").write_bytes(gzip.compress((tmp_path / "a.pcap").read_bytes()))
    assert read_pcap(tmp_path / "a.pcap.gz").length.tolist() == [65_000, 66]


def test_read_pcap_rejects_other_files(tmp_path: Path) -> None:
    (tmp_path / "x.pcap").write_bytes(b"not a capture file at all....")
    with pytest.raises(ValueError, match="not a pcap file"):
        read_pcap(tmp_path / "x.pcap")


def test_wire_flows_counts_each_packet_once_on_its_sender() -> None:
    ms = 1_000_000
    node0 = pd.DataFrame(
        {
            "t_ns": [0, 10, 2 * ms + 1, 5],
            "src": ["198.19.0.1", "198.19.0.1", "198.19.0.1", "198.19.0.2"],
            "dst": ["198.19.0.2", "198.19.0.2", "198.19.0.2", "198.19.0.1"],
            "length": [1000, 500, 66, 66],
        }
    )
    node1 = pd.DataFrame(
        {"t_ns": [7], "src": ["198.19.0.2"], "dst": ["10.0.0.9"], "length": [99]}  # off-cluster
    )
    flows = wire_flows({0: node0, 1: node1}, ADDR)
    assert flows.to_dict("records") == [
        {"t_ns": 0, "src_node": 0, "dst_node": 1, "bytes": 1500, "packets": 2},
        {"t_ns": 2 * ms, "src_node": 0, "dst_node": 1, "bytes": 66, "packets": 1},
    ]
    empty = wire_flows({}, ADDR)
    assert empty.empty and list(empty.columns) == [
        "t_ns",
        "src_node",
        "dst_node",
        "bytes",
        "packets",
    ]


class _DiagAnswer(dict):
    """What pyroute2's DiagSocket returns: a mapping with attributes."""

    def __init__(self, info: dict, **fields: object) -> None:
        super().__init__(fields)
        self.info = info

    def get_attr(self, name: str) -> dict | None:
        return self.info if name == "INET_DIAG_INFO" else None


def test_socket_rows_keep_only_the_experiment_address() -> None:
    info = {f: i for i, f in enumerate(TCP_INFO_FIELDS.values())}
    answers = [
        _DiagAnswer(
            info, idiag_src="198.19.0.1", idiag_sport=5, idiag_dst="198.19.0.2", idiag_dport=6
        ),
        _DiagAnswer(
            info, idiag_src="198.18.0.1", idiag_sport=22, idiag_dst="198.18.0.9", idiag_dport=7
        ),
    ]
    rows = socket_rows(answers, "198.19.0.1", 42)
    assert len(rows) == 1
    row = dict(zip(COLUMNS, rows[0], strict=True))
    assert row["t_ns"] == 42 and row["dst"] == "198.19.0.2" and row["dport"] == 6
    assert row["rtt_us"] == info["tcpi_rtt"] and row["total_retrans"] == info["tcpi_total_retrans"]


def test_socket_columns_are_the_connection_then_the_tcp_info_fields() -> None:
    # COLUMNS comes from the contract, TCP_INFO_FIELDS says where each is read: they must agree.
    assert ["t_ns", "src", "sport", "dst", "dport", *TCP_INFO_FIELDS] == COLUMNS


def test_offset_interpolates_between_start_and_end() -> None:
    start = {"offset_ns": 1000, "uncertainty_ns": 10, "t_local_ns": 0}
    end = {"offset_ns": 3000, "uncertainty_ns": 10, "t_local_ns": 100}
    assert offset_at(start, end, 50) == 2000
    assert offset_at(start, None, 50) == 1000
    np.testing.assert_array_equal(offset_at(start, end, np.array([0, 100])), [1000, 3000])


def test_to_orchestrator_clock_shifts_only_when_applied_and_keeps_ns_exact() -> None:
    t = T0 + 123_456_789  # epoch ns: float64 would round these to 256 ns
    frame = pd.DataFrame(
        {
            "node": [0, 1, 1],
            "t_issue_ns": [t, t, t],
            "t_end_ns": pd.array([t + 1, None, t + 7], dtype="Int64"),
        }
    )
    sample = {"offset_ns": 5_000_003, "uncertainty_ns": 100, "t_local_ns": T0}
    clock = {
        "applied": True,
        "by_index": {0: {"start": {**sample, "offset_ns": 0}}, 1: {"start": sample}},
    }
    out = to_orchestrator_clock(frame, ("t_issue_ns", "t_end_ns"), clock)
    assert out.t_issue_ns.tolist() == [t, t - 5_000_003, t - 5_000_003]
    assert out.t_end_ns.tolist() == [t + 1, pd.NA, t + 7 - 5_000_003]
    unchanged = to_orchestrator_clock(frame, ("t_issue_ns",), {**clock, "applied": False})
    assert unchanged.t_issue_ns.tolist() == [t, t, t]


def test_build_cell_tables_applies_clock_and_reads_pcap_sockets_and_nccl(tmp_path: Path) -> None:
    cell = make_cell()
    raw = make_raw(tmp_path, cell)
    run = json.loads((raw / "run.json").read_text())
    for n in run["nodes"]:
        n["exp_addr"] = f"198.19.0.{n['index'] + 1}"
    offset = 2_000_000  # node1's clock runs 2 ms ahead
    zero = {"offset_ns": 0, "uncertainty_ns": 50_000, "t_local_ns": T0}
    ahead = {**zero, "offset_ns": offset}
    run["clock"] = {
        "applied": True,
        "nodes": {"node0": {"start": zero, "end": zero}, "node1": {"start": ahead, "end": ahead}},
    }
    (raw / "run.json").write_text(json.dumps(run))
    write_pcap(
        raw / "node1" / "x.pcap", [(T0 + offset + 10, _frame("198.19.0.2", "198.19.0.1"), 1514)]
    )
    shutil.copy(NCCL_LOG, raw / "node0" / "nccl.node-a.1201.log")
    paths = build_cell_tables(
        raw,
        CellSettings.from_mapping(cell),
        warmup_steps=1,
        paths=cell_table_paths(tmp_path / "trace"),
    )

    ops_raw = pd.read_parquet(raw / "node1" / "ops_rank1.parquet")
    ops = pd.read_parquet(paths["ops"])
    shifted = sorted(ops_raw.t_issue_ns - offset)
    assert sorted(ops[ops["rank"] == 1].t_issue_ns) == shifted
    flows = pd.read_parquet(paths["wire_flows"])
    assert flows[["t_ns", "src_node", "dst_node", "bytes"]].values.tolist() == [[T0, 1, 0, 1514]]
    assert pd.read_parquet(paths["sockets"]).empty  # no socket stats recorded in this raw dir
    nccl = pd.read_parquet(paths["nccl_ops"])
    assert {"allreduce", "allgather", "reduce_scatter", "broadcast"} <= set(nccl.op)
    assert (nccl.source == "nccl_log").all()
    assert json.loads(paths["cell"].read_text())["clock"]["applied"] is True
