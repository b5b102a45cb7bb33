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
    ``node``, on one clock), following the module's rules, sorted by node, time and direction
    (``rx`` before ``tx``)."""
    return _directed_frame(*_directed(bins, addr_to_node))


def _peer_nodes(peers: pd.Series, addr_to_node: Mapping[str, int]) -> np.ndarray:
    """``peers.map(addr_to_node)`` as float64 (NaN for no cell peer), looked up once per
    distinct address rather than per bin (a long run has 10**7 bins and a handful of peers)."""
    codes, uniques = pd.factorize(peers, use_na_sentinel=True)
    lookup = np.array([addr_to_node.get(u, np.nan) for u in uniques] + [np.nan], dtype=float)
    return lookup[codes]  # code -1 (a null peer) takes the appended NaN


def _directed(
    bins: pd.DataFrame, addr_to_node: Mapping[str, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`directed_bins` as sorted arrays: node, t_ns, direction (0 rx, 1 tx), bytes,
    packets, one entry per (node, t_ns, direction), sums over the bins that share it."""
    peer_node = _peer_nodes(bins["peer"], addr_to_node)
    known = ~np.isnan(peer_node)
    ingress = (bins["hook"] == "ingress").to_numpy(dtype=bool)
    egress = (bins["hook"] == "egress").to_numpy(dtype=bool)
    rx, tx_seen, tx_unseen = ingress, ingress & known, egress & ~known
    node = bins["node"].to_numpy()
    parts = (rx, tx_seen, tx_unseen)
    nodes = np.concatenate([node[rx], peer_node[tx_seen].astype(np.int64), node[tx_unseen]])
    sums = {
        col: np.concatenate([bins[col].to_numpy()[rows] for rows in parts])
        for col in ("t_ns", "bytes", "packets")
    }
    direction = np.repeat(np.array([0, 1, 1], dtype=np.int8), [int(r.sum()) for r in parts])
    order = _lexsort(nodes, sums["t_ns"], direction)
    keys = (nodes[order], sums["t_ns"][order], direction[order])
    starts = _run_starts(*keys)
    return (
        keys[0][starts],
        keys[1][starts],
        keys[2][starts],
        _run_sums(sums["bytes"][order], starts),
        _run_sums(sums["packets"][order], starts),
    )


def _lexsort(node: np.ndarray, t_ns: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """``np.lexsort((direction, t_ns, node))``: the order by node, then time, then direction.
    Packed into one integer key where the span allows (always, for a run shorter than days:
    45 bits of ns), and sorted stably: the bins come in runs already in time order, which a
    stable sort merges rather than sorts (3x lexsort's speed)."""
    if len(node) == 0:
        return np.empty(0, dtype=np.int64)
    t_rel = t_ns - t_ns.min()
    n_rel = node - node.min()
    if int(t_rel.max()) < 1 << 45 and int(n_rel.max()) < 1 << 16:
        return np.argsort((n_rel << 46) | (t_rel << 1) | direction, kind="stable")
    return np.lexsort((direction, t_ns, node))


def _run_starts(*sorted_keys: np.ndarray) -> np.ndarray:
    """Where each run of equal key tuples starts in arrays sorted by them."""
    n = len(sorted_keys[0])
    if n == 0:
        return np.empty(0, dtype=np.int64)
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for key in sorted_keys:
        change[1:] |= key[1:] != key[:-1]
    return np.flatnonzero(change)


def _run_index(n: int, starts: np.ndarray) -> np.ndarray:
    """For each of ``n`` sorted entries, the number of its run (runs start at ``starts``)."""
    mark = np.zeros(n, dtype=np.int64)
    mark[starts] = 1
    return np.cumsum(mark) - 1


def _run_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sum of each run of ``values`` starting at ``starts`` (integers: exact, in any order)."""
    return np.add.reduceat(values, starts) if len(starts) else values[:0]


def _directed_frame(
    node: np.ndarray,
    t_ns: np.ndarray,
    direction: np.ndarray,
    nbytes: np.ndarray,
    packets: np.ndarray,
) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "node": node,
            "t_ns": t_ns,
            "direction": pd.array(np.where(direction == 0, "rx", "tx"), dtype="str"),
            "bytes": nbytes,
            "packets": packets,
        }
    )


def counters_from_bins(
    bins: pd.DataFrame,
    bin_ns: int,
    addr_to_node: Mapping[str, int],
    ifaces: Mapping[int, str],
    spans: Mapping[int, tuple[int, int]],
    rate_bps: int | None | Mapping[int, int | None] = None,
) -> pd.DataFrame:
    """The ``counters`` table (COUNTER_COLUMNS) of a cell from its wire bins.

    ``rate_bps`` is the cell's link cap, if any (or each node's, by node index, where a
    topology gives some nodes links of their own): each node's bytes are then placed on its
    link as a link of that rate serialises them (:func:`serialized`) instead of at the instant
    their bin closed.

    ``bins`` are every node's wire.parquet rows with a ``node`` column, on the orchestrator's
    clock; ``spans[node]`` the accounting's (start, end) on the same clock, so the series covers
    the whole time it was attached (a first sample of 0 at the start, the total at the end)."""
    empty = np.empty(0, dtype=np.int64)
    if bins.empty:
        node = t_ns = direction = nbytes = packets = empty
    else:
        node, t_ns, direction, nbytes, packets = _directed(bins, addr_to_node)
    frames = []
    for n, iface in sorted(ifaces.items()):
        start, end = spans[n]
        # This node's rows, one per (bin, direction) in time order: the bins it has and, per
        # direction, what they held (0 where that direction had nothing).
        lo, hi = np.searchsorted(node, n, side="left"), np.searchsorted(node, n, side="right")
        t, d = t_ns[lo:hi], direction[lo:hi]
        first = _run_starts(t)
        at = _run_index(len(t), first)
        t_bin = snap(t[first], bin_ns)
        per_bin = {}
        for col, values, want in (
            ("tx_bytes", nbytes, 1),
            ("rx_bytes", nbytes, 0),
            ("tx_packets", packets, 1),
            ("rx_packets", packets, 0),
        ):
            column = np.zeros(len(first), dtype=np.int64)
            mine = d == want
            column[at[mine]] = values[lo:hi][mine]
            per_bin[col] = column
        rate = rate_bps.get(n) if isinstance(rate_bps, Mapping) else rate_bps
        frames.append(_sparse_cumulative(n, iface, t_bin, per_bin, bin_ns, start, end, rate))
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
    starts = _run_starts(t_bin)
    uniq, inverse = t_bin[starts], _run_index(len(t_bin), starts)
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
    times = _sorted_unique(np.concatenate([[lo, hi], *(k for k, _ in curves.values())]))
    data = {}
    for col, (knots, values) in curves.items():
        if len(knots) == 0:
            data[col] = np.zeros(len(times), dtype=np.int64)
            continue
        # Piecewise linear between its own knots, so exact at every one of them; a busy bin's
        # start equals the previous one's end when both are busy (the same value twice).
        k, first = _unique_first(knots[::-1])
        v = values[::-1][first]
        data[col] = np.rint(np.interp(times, k, v, left=0, right=v[-1])).astype(np.int64)
    frame = pd.DataFrame({"t_ns": times, **data})
    frame.insert(0, "iface", iface)
    frame.insert(0, "node", node)
    frame["resolution_ns"] = np.int64(bin_ns)
    return frame


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` by a sort (numpy's hashing is the slower way for 10**7 ints); a
    stable one, which merges the sorted runs the curves' knots come in (6x quicksort's speed)."""
    ordered = np.sort(values, kind="stable")
    return ordered[_run_starts(ordered)]


def _unique_first(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_index=True)``: the sorted distinct values and where each
    first occurs, by a stable sort."""
    order = np.argsort(values, kind="stable")
    starts = _run_starts(values[order])
    return values[order][starts], order[starts]


def flows_from_bins(
    bins: pd.DataFrame, addr_to_node: Mapping[str, int], bin_ns: int
) -> pd.DataFrame:
    """The node-pair ``wire_flows`` table (WIRE_FLOW_COLUMNS) from the receivers' ingress bins:
    ``t_ns`` the start of a ``bin_ns`` bin, bytes and packets from ``src_node`` received by
    ``dst_node``."""
    if bins.empty:
        return pd.DataFrame({c: pd.Series(dtype=np.int64) for c in WIRE_FLOW_COLUMNS})
    src = _peer_nodes(bins["peer"], addr_to_node)
    keep = (bins["hook"] == "ingress").to_numpy(dtype=bool) & ~np.isnan(src)
    t = bins["t_ns"].to_numpy(np.int64)[keep] // bin_ns * bin_ns
    src_node = src[keep].astype(np.int64)
    dst_node = bins["node"].to_numpy(np.int64)[keep]
    nbytes = bins["bytes"].to_numpy(np.int64)[keep]
    packets = bins["packets"].to_numpy(np.int64)[keep]
    other = src_node != dst_node
    t, src_node, dst_node = t[other], src_node[other], dst_node[other]
    nbytes, packets = nbytes[other], packets[other]
    order = np.lexsort((dst_node, src_node, t))
    keys = (t[order], src_node[order], dst_node[order])
    starts = _run_starts(*keys)
    out = pd.DataFrame(
        {
            "t_ns": keys[0][starts],
            "src_node": keys[1][starts],
            "dst_node": keys[2][starts],
            "bytes": _run_sums(nbytes[order], starts),
            "packets": _run_sums(packets[order], starts),
        }
    )
    return out.astype(np.int64)[WIRE_FLOW_COLUMNS]
