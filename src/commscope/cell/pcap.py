"""Packet headers captured on the wire → the node x node bytes matrix over time.

Every node runs ``tcpdump -i <exp iface> -s 96 --time-stamp-precision=nano -w capture.pcap``
during the run (``run.pcap``). A classic pcap file is a 24-byte global header and, per packet, a
16-byte record header (seconds, sub-second, captured length, original length) followed by the
first bytes of the frame; we need only the record header and the Ethernet + IPv4 addresses, so a
few lines of ``struct`` read it (no packet library needed). The original length is the frame as
the interface handled it, Ethernet header included, which is what /proc/net/dev counts; with
GSO/TSO on veth one record can be a 64 KB super-packet, exactly as the counters see it.

Each node counts only the packets it *sent* (source address = its own experiment address), so
every packet is counted once over the cluster, on the sender, like the tx counters.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pandas as pd

from commscope.contracts import WIRE_FLOW_COLUMNS

_MAGIC = {
    b"\xd4\xc3\xb2\xa1": ("<", 1_000),  # little-endian, microsecond timestamps
    b"\xa1\xb2\xc3\xd4": (">", 1_000),
    b"\x4d\x3c\xb2\xa1": ("<", 1),  # little-endian, nanosecond timestamps
    b"\xa1\xb2\x3c\x4d": (">", 1),
}
_LINKTYPE_ETHERNET = 1
_ETH_P_IP = 0x0800
_ETH_P_8021Q = 0x8100
PACKET_COLUMNS = ["t_ns", "src", "dst", "length"]


def read_pcap(path: Path) -> pd.DataFrame:
    """IPv4 packets of a classic pcap file (or its gzip): time (ns), source and destination
    address, and frame length as sent (bytes, Ethernet header included). Non-IPv4 frames (ARP,
    ...) are skipped; a capture cut short (tcpdump killed mid-write) keeps its complete
    records."""
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":  # gzip: the runner compresses captures before fetching them
        data = gzip.decompress(data)
    if len(data) < 24:
        return pd.DataFrame(columns=PACKET_COLUMNS)
    try:
        endian, ns_per_tick = _MAGIC[data[:4]]
    except KeyError:
        raise ValueError(f"{path}: not a pcap file (magic {data[:4].hex()})") from None
    (linktype,) = struct.unpack_from(endian + "I", data, 20)
    if linktype & 0x0FFFFFFF != _LINKTYPE_ETHERNET:
        raise ValueError(f"{path}: link type {linktype}, expected Ethernet (1)")
    record = struct.Struct(endian + "IIII")
    times, srcs, dsts, lengths = [], [], [], []
    off = 24
    end = len(data)
    while off + 16 <= end:
        sec, frac, incl, orig = record.unpack_from(data, off)
        frame = off + 16
        off = frame + incl
        if off > end:
            break  # truncated last record
        ethertype_at = frame + 12
        if incl < 34:
            continue
        (ethertype,) = struct.unpack_from(">H", data, ethertype_at)
        ip = frame + 14
        if ethertype == _ETH_P_8021Q and incl >= 38:
            (ethertype,) = struct.unpack_from(">H", data, ethertype_at + 4)
            ip += 4
        if ethertype != _ETH_P_IP or ip + 20 > off:
            continue
        times.append(sec * 1_000_000_000 + frac * ns_per_tick)
        srcs.append(data[ip + 12 : ip + 16])
        dsts.append(data[ip + 16 : ip + 20])
        lengths.append(orig)
    return pd.DataFrame(
        {
            "t_ns": np.array(times, dtype=np.int64),
            "src": [".".join(map(str, a)) for a in srcs],
            "dst": [".".join(map(str, a)) for a in dsts],
            "length": np.array(lengths, dtype=np.int64),
        },
        columns=PACKET_COLUMNS,
    )


def wire_flows(
    packets: dict[int, pd.DataFrame], addr_to_node: dict[str, int], bin_ns: int = 1_000_000
) -> pd.DataFrame:
    """Bytes and packets per (time bin, source node, destination node), from each node's own
    capture (``packets[node]``, as :func:`read_pcap` returns) counting what the node sent to
    another node of the cluster. ``t_ns`` is the start of the bin."""
    frames = []
    for node, pk in packets.items():
        mine = pk[(pk["src"].map(addr_to_node) == node) & pk["dst"].isin(addr_to_node.keys())]
        if mine.empty:
            continue
        frames.append(
            pd.DataFrame(
                {
                    "t_ns": mine["t_ns"].to_numpy() // bin_ns * bin_ns,
                    "src_node": node,
                    "dst_node": mine["dst"].map(addr_to_node).astype(np.int64).to_numpy(),
                    "bytes": mine["length"].to_numpy(),
                    "packets": 1,
                }
            )
        )
    if not frames:
        return pd.DataFrame(
            {c: pd.Series(dtype=np.int64) for c in WIRE_FLOW_COLUMNS}, columns=WIRE_FLOW_COLUMNS
        )
    flows = pd.concat(frames, ignore_index=True)
    out = flows.groupby(["t_ns", "src_node", "dst_node"], as_index=False)[["bytes", "packets"]]
    return out.sum().astype(np.int64)[WIRE_FLOW_COLUMNS]
