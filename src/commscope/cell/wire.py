"""The BPF wire accounting's bins (raw/<node>/wire.parquet) → the cell's ``counters`` and
``wire_flows`` tables.

What crossed a link is counted where it arrived: on the receiver's ingress, after the sender's
shaper (the egress hook runs before the root qdisc and sees what the sender *offered*). So

- node n's ``rx`` is its own ingress, every peer;
- node n's ``tx`` is what every other node of the cell received from n (their ingress bins
  whose peer is n's address), plus n's egress to no cell peer (nothing else would see those
  bytes: ARP, broadcasts, other hosts);
- the node-pair flows are the ingress bins by peer, at the accounting's bin width.

Counters are cumulative samples, as the /proc sampler's, but sparse and exact: a sample at the
end of every non-empty bin and at the start of a non-empty bin that follows an empty one, so
the cumulative step function is exact at every bin edge and flat across idle stretches (linear
interpolation between two samples is exact). On a capped cell a bin's bytes are instead placed
over the time a link of the cap's rate takes to serialise them, ending when they were counted
and never overlapping the next bin's (:func:`serialized`): the emulated link hands over whole
frames when tbf lets them go (at 50 Mbit/s one 1,514-byte frame every 242 µs, so 100 µs bins of
the raw arrivals alternate between 0 and 1 frame), a real link of that rate carries their bits
one after another, and that is what the throughput at 100 µs shows. Totals are unchanged, and
no byte moves later than it was counted. Bin edges are snapped to multiples of the bin width
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


def snap(t_ns: pd.Series | np.ndarray, bin_ns: int) -> np.ndarray:
    """Times rounded to the nearest multiple of ``bin_ns`` (int64, exact)."""
    t = np.asarray(t_ns, dtype=np.int64)
    return (t + bin_ns // 2) // bin_ns * bin_ns


def snap_bins(bins: pd.DataFrame, bin_ns: int) -> pd.DataFrame:
    """``bins`` with ``t_ns`` snapped to multiples of ``bin_ns`` (see :func:`snap`)."""
    return bins.assign(t_ns=snap(bins["t_ns"].to_numpy(), bin_ns))


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
    rate_bps: int | None = None,
) -> pd.DataFrame:
    """The ``counters`` table (COUNTER_COLUMNS) of a cell from its wire bins.

    ``rate_bps`` is the cell's link cap, if any: each node's bytes are then placed on its link
    as a link of that rate serialises them (:func:`serialized`) instead of at the instant
    their bin closed.

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
        frames.append(_sparse_cumulative(node, iface, t_bin, per_bin, bin_ns, start, end, rate_bps))
    return pd.concat(frames, ignore_index=True)[COUNTER_COLUMNS]


def serialized(
    t_end: np.ndarray, nbytes: np.ndarray, rate_bps: int
) -> tuple[np.ndarray, np.ndarray]:
    """When each bin's bytes were on a link of ``rate_bps``: (start, end) per bin, in order.

    A bin's bytes were counted once their last frame had arrived, by ``t_end``; on a link that
    serialises at ``rate_bps`` they took 8 x bytes / rate to cross it, and the next bin's
    bytes could not start before they were done. Working back from the last bin:
    ``end_k = min(t_end_k, start_{k+1})``, ``start_k = end_k - duration_k``. In closed form with
    the suffix sums ``D_k`` of the durations: ``end_k + D_{k+1}`` is the reverse running minimum
    of ``t_end_k + D_{k+1}``, so no loop is needed."""
    dur = np.ceil(nbytes.astype(np.float64) * 8e9 / rate_bps).astype(np.int64)
    after = np.concatenate([np.cumsum(dur[::-1])[::-1][1:], [0]])  # D_{k+1}
    g = np.minimum.accumulate((t_end + after)[::-1])[::-1]
    ends = g - after
    return ends - dur, ends


def _sparse_cumulative(
    node: int,
    iface: str,
    t_bin: np.ndarray,
    per_bin: dict[str, np.ndarray],
    bin_ns: int,
    start: int,
    end: int,
    rate_bps: int | None = None,
) -> pd.DataFrame:
    """Cumulative samples at the edges of the non-empty bins (see the module doc); with
    ``rate_bps``, at the edges of the intervals the bins' bytes were serialised in
    (:func:`serialized`), per direction."""
    order = np.argsort(t_bin, kind="stable")
    t_bin = t_bin[order]
    # Bins that snap onto the same edge (never with one clock) are merged.
    uniq, inverse = np.unique(t_bin, return_inverse=True)
    per = {
        k: np.bincount(inverse, v[order], len(uniq)).astype(np.int64) for k, v in per_bin.items()
    }
    lo = int(snap(np.array([start]), bin_ns)[0])
    hi = max(int(snap(np.array([end]), bin_ns)[0]), int(uniq[-1]) + bin_ns if len(uniq) else end)
    # Per direction, the instants its cumulative function bends and its values there.
    curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for direction in ("tx", "rx"):
        nbytes = per[f"{direction}_bytes"]
        busy = nbytes > 0
        t_end = uniq[busy] + bin_ns
        if rate_bps:
            t_start, t_end = serialized(t_end, nbytes[busy], rate_bps)
        else:
            t_start = t_end - bin_ns
        knots = np.concatenate([t_start, t_end])
        for col in (f"{direction}_bytes", f"{direction}_packets"):
            cum = np.cumsum(per[col][busy])
            values = np.concatenate([cum - per[col][busy], cum])
            o = np.argsort(knots, kind="stable")
            curves[col] = (knots[o], values[o])
        if len(knots):
            lo = min(lo, int(knots.min()))
    times = np.unique(np.concatenate([[lo, hi], *(k for k, _ in curves.values())]))
    data = {}
    for col, (knots, values) in curves.items():
        if len(knots) == 0:
            data[col] = np.zeros(len(times), dtype=np.int64)
            continue
        # Piecewise linear between its own knots, so exact at every one of them; a busy bin's
        # start equals the previous one's end when both are busy (the same value twice).
        k, first = np.unique(knots[::-1], return_index=True)
        v = values[::-1][first]
        data[col] = np.rint(np.interp(times, k, v, left=0, right=v[-1])).astype(np.int64)
    frame = pd.DataFrame({"t_ns": times, **data})
    frame.insert(0, "iface", iface)
    frame.insert(0, "node", node)
    frame["resolution_ns"] = np.int64(bin_ns)
    return frame


def flows_from_bins(
    bins: pd.DataFrame, addr_to_node: Mapping[str, int], bin_ns: int
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
