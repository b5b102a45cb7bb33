"""The BPF wire accounting's bins (raw/<node>/wire.parquet) → the cell's ``counters`` and
``wire_flows`` tables.

What crossed a link is counted where it arrived: on the receiver's ingress, after the sender's
shaper (the egress hook runs before the root qdisc and sees what the sender *offered*). So

- node n's ``rx`` is its own ingress, every peer;
- node n's ``tx`` is what every other node of the cell received from n (their ingress bins
  whose peer is n's address), plus n's egress to no cell peer (nothing else would see those
  bytes: ARP, broadcasts, other hosts);
- the node-pair flows are the ingress bins by peer.

Counters are cumulative samples, as the /proc sampler's, but sparse and exact: a sample at the
end of every non-empty bin and at the start of a non-empty bin that follows an empty one, so
the cumulative step function is exact at every bin edge and flat across idle stretches (linear
interpolation between two samples is exact). Bin edges are snapped to multiples of the bin width
after the clock mapping (a shift of at most half a bin), so throughput bins that are multiples
of it align with the kernel's bins. ``resolution_ns`` says the bin width.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from commscope.contracts import WIRE_FLOW_COLUMNS

COUNTER_COLUMNS = [
    "node",
    "iface",
    "t_ns",
    "tx_bytes",
    "rx_bytes",
    "tx_packets",
    "rx_packets",
    "resolution_ns",
]
# Node-pair flows are kept at this bin width (the cross-validation windows them, nothing finer).
FLOW_BIN_NS = 1_000_000


def snap(t_ns: pd.Series | np.ndarray, bin_ns: int) -> np.ndarray:
    """Times rounded to the nearest multiple of ``bin_ns`` (int64, exact)."""
    t = np.asarray(t_ns, dtype=np.int64)
    return (t + bin_ns // 2) // bin_ns * bin_ns


def directed_bins(bins: pd.DataFrame, addr_to_node: Mapping[str, int]) -> pd.DataFrame:
    """Per node, bin and direction, the bytes and packets that crossed its link: rows
    (node, t_ns, direction, bytes, packets) from ``bins`` (every node's wire.parquet rows with
    ``node``, on one clock), following the module's rules."""
    peer_node = bins["peer"].map(addr_to_node)
    ingress = bins["hook"] == "ingress"
    rx = bins[ingress].assign(direction="rx")
    tx_seen = bins[ingress & peer_node.notna()].assign(
        direction="tx", node=peer_node[ingress & peer_node.notna()].astype(np.int64)
    )
    tx_unseen = bins[(bins["hook"] == "egress") & peer_node.isna()].assign(direction="tx")
    cols = ["node", "t_ns", "direction", "bytes", "packets"]
    out = pd.concat([rx[cols], tx_seen[cols], tx_unseen[cols]], ignore_index=True)
    return out.groupby(["node", "t_ns", "direction"], as_index=False)[["bytes", "packets"]].sum()


def counters_from_bins(
    bins: pd.DataFrame,
    bin_ns: int,
    addr_to_node: Mapping[str, int],
    ifaces: Mapping[int, str],
    spans: Mapping[int, tuple[int, int]],
) -> pd.DataFrame:
    """The ``counters`` table (COUNTER_COLUMNS) of a cell from its wire bins.

    ``bins`` are every node's wire.parquet rows with a ``node`` column, on the orchestrator's
    clock; ``spans[node]`` the accounting's (start, end) on the same clock, so the series covers
    the whole time it was attached (a first sample of 0 at the start, the total at the end)."""
    directed = directed_bins(bins, addr_to_node) if not bins.empty else None
    frames = []
    for node, iface in sorted(ifaces.items()):
        start, end = spans[node]
        if directed is not None:
            mine = directed[directed["node"] == node]
            wide = mine.pivot_table(
                index="t_ns", columns="direction", values=["bytes", "packets"], aggfunc="sum"
            ).fillna(0)
        else:
            wide = pd.DataFrame()
        t_bin = snap(wide.index.to_numpy(), bin_ns) if len(wide) else np.empty(0, np.int64)
        per_bin = {}
        for col, (what, direction) in {
            "tx_bytes": ("bytes", "tx"),
            "rx_bytes": ("bytes", "rx"),
            "tx_packets": ("packets", "tx"),
            "rx_packets": ("packets", "rx"),
        }.items():
            have = (what, direction) in wide.columns
            per_bin[col] = wide[(what, direction)].to_numpy(np.int64) if have else 0 * t_bin
        frames.append(_sparse_cumulative(node, iface, t_bin, per_bin, bin_ns, start, end))
    return pd.concat(frames, ignore_index=True)[COUNTER_COLUMNS]


def _sparse_cumulative(
    node: int,
    iface: str,
    t_bin: np.ndarray,
    per_bin: dict[str, np.ndarray],
    bin_ns: int,
    start: int,
    end: int,
) -> pd.DataFrame:
    """Cumulative samples at the edges of the non-empty bins (see the module doc)."""
    order = np.argsort(t_bin, kind="stable")
    t_bin = t_bin[order]
    # Bins that snap onto the same edge (never with one clock) are merged.
    uniq, inverse = np.unique(t_bin, return_inverse=True)
    per = {
        k: np.bincount(inverse, v[order], len(uniq)).astype(np.int64) for k, v in per_bin.items()
    }
    lo = min(int(snap(np.array([start]), bin_ns)[0]), int(uniq[0]) if len(uniq) else start)
    hi = max(int(snap(np.array([end]), bin_ns)[0]), int(uniq[-1]) + bin_ns if len(uniq) else end)
    cum = {k: np.cumsum(v) for k, v in per.items()}
    t = np.concatenate([[lo], uniq, uniq + bin_ns, [hi]])
    data = {
        k: np.concatenate([[0], cum[k] - per[k], cum[k], [cum[k][-1] if len(uniq) else 0]])
        for k in per
    }
    frame = pd.DataFrame({"t_ns": t, **data})
    # A bin's start equals the previous bin's end when both are busy: the same value twice.
    frame = frame.sort_values("t_ns", kind="stable").drop_duplicates("t_ns", keep="last")
    frame.insert(0, "iface", iface)
    frame.insert(0, "node", node)
    frame["resolution_ns"] = np.int64(bin_ns)
    return frame


def flows_from_bins(
    bins: pd.DataFrame, addr_to_node: Mapping[str, int], bin_ns: int = FLOW_BIN_NS
) -> pd.DataFrame:
    """The node-pair ``wire_flows`` table (WIRE_FLOW_COLUMNS) from the receivers' ingress bins:
    ``t_ns`` the start of a ``bin_ns`` bin, bytes and packets from ``src_node`` received by
    ``dst_node``."""
    if bins.empty:
        return pd.DataFrame({c: pd.Series(dtype=np.int64) for c in WIRE_FLOW_COLUMNS})
    src = bins["peer"].map(addr_to_node)
    keep = (bins["hook"] == "ingress") & src.notna()
    flows = pd.DataFrame(
        {
            "t_ns": bins.loc[keep, "t_ns"].to_numpy(np.int64) // bin_ns * bin_ns,
            "src_node": src[keep].astype(np.int64).to_numpy(),
            "dst_node": bins.loc[keep, "node"].astype(np.int64).to_numpy(),
            "bytes": bins.loc[keep, "bytes"].to_numpy(np.int64),
            "packets": bins.loc[keep, "packets"].to_numpy(np.int64),
        }
    )
    flows = flows[flows["src_node"] != flows["dst_node"]]
    out = flows.groupby(["t_ns", "src_node", "dst_node"], as_index=False)[["bytes", "packets"]]
    return out.sum().astype(np.int64)[WIRE_FLOW_COLUMNS]
