"""The BPF accounting's bins turned into cumulative counters and node-pair flows
(commscope.cell.wire): exact at every bin edge, flat across idle stretches, tx counted where it
was received."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from commscope.cell import wire
from commscope.cell.wire import counters_from_bins, directed_bins, flows_from_bins, serialized, snap
from commscope.contracts import WIRE_FLOW_COLUMNS

B = 100_000
ADDR = {"a0": 0, "a1": 1}


def _bins() -> pd.DataFrame:
    rows = []
    for b in (10, 11, 12, 20):  # node 0 sends 1000 B per bin to node 1, which acks with 66 B
        rows.append({"node": 1, "t_ns": b * B + 7, "hook": "ingress", "peer": "a0", "bytes": 1000})
        rows.append({"node": 0, "t_ns": b * B + 3, "hook": "egress", "peer": "a1", "bytes": 1400})
        rows.append({"node": 0, "t_ns": b * B + 3, "hook": "ingress", "peer": "a1", "bytes": 66})
    rows.append({"node": 0, "t_ns": 15 * B, "hook": "egress", "peer": "", "bytes": 42})  # ARP
    frame = pd.DataFrame(rows)
    frame["packets"] = 1
    frame["skbs"] = 1
    return frame


def _counters() -> pd.DataFrame:
    spans = {0: (0, 30 * B), 1: (0, 30 * B)}
    return counters_from_bins(_bins(), B, ADDR, {0: "e0", 1: "e1"}, spans)


def test_snap_rounds_to_the_nearest_edge() -> None:
    assert snap(np.array([0, 49_999, 50_000, 149_999, -1]), B).tolist() == [0, 0, B, B, 0]


def test_tx_is_what_the_receiver_got_not_what_the_sender_offered() -> None:
    d = directed_bins(_bins(), ADDR)
    tx0 = d[(d["node"] == 0) & (d["direction"] == "tx")]["bytes"].sum()
    # 4 x 1000 B received by node 1 (not the 1400 B the egress hook saw) + 42 B to no peer.
    assert tx0 == 4 * 1000 + 42


def test_cumulative_counters_are_exact_at_every_bin_edge() -> None:
    c = _counters()
    n0 = c[c["node"] == 0].set_index("t_ns")
    # Every edge of every bin: interpolating the samples gives the exact cumulative bytes.
    edges = np.arange(0, 30 * B + 1, B)
    cum = np.interp(edges, n0.index.to_numpy(), n0["tx_bytes"].to_numpy())
    per_bin = np.diff(cum)
    expect = np.zeros(30)
    expect[[10, 11, 12, 20]] = 1000
    expect[15] = 42
    assert per_bin.tolist() == expect.tolist()
    assert set(c["resolution_ns"]) == {B}


def test_idle_stretches_have_no_samples_and_stay_flat() -> None:
    c = _counters()
    n1 = c[c["node"] == 1]
    # Span start, the busy bins' edges (10..13, 20..21) and the span end; nothing in between.
    assert n1["t_ns"].tolist() == [0, 10 * B, 11 * B, 12 * B, 13 * B, 20 * B, 21 * B, 30 * B]
    assert n1["rx_bytes"].tolist() == [0, 0, 1000, 2000, 3000, 3000, 4000, 4000]


def test_a_node_without_traffic_still_has_its_span() -> None:
    bins = _bins()
    spans = {0: (0, 30 * B), 1: (0, 30 * B), 2: (5 * B, 25 * B)}
    c = counters_from_bins(bins, B, ADDR, {0: "e0", 1: "e1", 2: "e2"}, spans)
    n2 = c[c["node"] == 2]
    assert n2["t_ns"].tolist() == [5 * B, 25 * B]
    assert n2[["tx_bytes", "rx_bytes"]].to_numpy().sum() == 0


def test_flows_come_from_the_receivers_ingress_in_1ms_bins() -> None:
    flows = flows_from_bins(_bins(), ADDR, 1_000_000)
    got = {(r.t_ns, r.src_node, r.dst_node): r.bytes for r in flows.itertuples()}
    assert got == {(1_000_000, 0, 1): 3000, (1_000_000, 1, 0): 198, (2_000_000, 0, 1): 1000,
                   (2_000_000, 1, 0): 66}  # fmt: skip


def test_a_busy_capped_link_is_flat_at_the_cap_once_serialised() -> None:
    # 50 Mbit/s: a 1514-byte frame every 242.24 us, counted in the 100 us bin it completes in.
    rate, frame = 50_000_000, 1514
    arrivals = np.arange(1, 200) * frame * 8e9 / rate
    t_end = (np.floor(arrivals / B).astype(np.int64) + 1) * B
    uniq, counts = np.unique(t_end, return_counts=True)
    starts, ends = serialized(uniq, counts * frame, rate)
    assert (starts[1:] >= ends[:-1]).all()  # one bin after the other on the wire
    assert (ends <= uniq).all()  # never later than counted
    # The intervals tile the busy period: rate x time = bytes, but for the last bin's closing,
    # which comes up to one bin after its last frame.
    busy = ends[-1] - starts[0]
    assert 0 <= busy * rate / 8e9 - counts.sum() * frame <= rate * B / 8e9


def test_a_burst_after_idle_is_spread_back_over_its_serialisation_time() -> None:
    rate = 50_000_000
    starts, ends = serialized(np.array([10 * B]), np.array([6250]), rate)
    assert ends.tolist() == [10 * B] and starts.tolist() == [10 * B - 1_000_000]


def test_capped_counters_spread_bins_at_the_rate_and_keep_totals() -> None:
    spans = {0: (0, 30 * B), 1: (0, 30 * B)}
    c = counters_from_bins(_bins(), B, ADDR, {0: "e0", 1: "e1"}, spans, rate_bps=40_000_000)
    n1 = c[c["node"] == 1]
    assert n1["rx_bytes"].iloc[-1] == 4000 and n1["rx_packets"].iloc[-1] == 4
    # 1000 B at 40 Mbit/s take 200 us: bins 10-12 (counted by 13 x B) were on the wire from
    # 7 x B, one after the other; linear in between.
    at = np.interp(np.array([7, 8, 9, 11, 12, 13]) * B, n1["t_ns"], n1["rx_bytes"])
    assert at.tolist() == [0, 500, 1000, 2000, 2500, 3000]


def test_each_node_is_serialised_at_its_own_rate_where_the_topology_gives_one() -> None:
    spans = {0: (0, 30 * B), 1: (0, 30 * B)}
    cell = counters_from_bins(_bins(), B, ADDR, {0: "e0", 1: "e1"}, spans, rate_bps=40_000_000)
    own = counters_from_bins(
        _bins(), B, ADDR, {0: "e0", 1: "e1"}, spans, rate_bps={0: 40_000_000, 1: 20_000_000}
    )
    # Node 0 at the cell's rate: the same series; node 1 at half of it: bins 10-12's 3000 B
    # took 1.2 ms up to 13 x B (from 1 x B), 250 B per bin width.
    assert (
        own[own["node"] == 0]
        .reset_index(drop=True)
        .equals(cell[cell["node"] == 0].reset_index(drop=True))
    )
    n1 = own[own["node"] == 1]
    assert n1["rx_bytes"].iloc[-1] == 4000
    at = np.interp(np.array([1, 7, 9, 13]) * B, n1["t_ns"], n1["rx_bytes"])
    assert at.tolist() == [0, 1500, 2000, 3000]


# --------------------------------------------------------------------------------------------
# Issue 12: the same tables as the pandas implementation before it (frozen below), on the
# analysis benchmark's bins of a long run (scaled down) and on irregular bins
# --------------------------------------------------------------------------------------------


def _ref_directed(bins: pd.DataFrame, addr_to_node: dict[str, int]) -> pd.DataFrame:
    peer_node = bins["peer"].map(addr_to_node)
    ingress = bins["hook"] == "ingress"
    seen = ingress & peer_node.notna()
    rx = bins[ingress].assign(direction="rx")
    tx_seen = bins[seen].assign(direction="tx", node=peer_node[seen].astype(np.int64))
    tx_unseen = bins[(bins["hook"] == "egress") & peer_node.isna()].assign(direction="tx")
    cols = ["node", "t_ns", "direction", "bytes", "packets"]
    out = pd.concat([rx[cols], tx_seen[cols], tx_unseen[cols]], ignore_index=True)
    return out.groupby(["node", "t_ns", "direction"], as_index=False)[["bytes", "packets"]].sum()


def _ref_counters(
    bins: pd.DataFrame,
    bin_ns: int,
    addr_to_node: dict[str, int],
    ifaces: dict[int, str],
    spans: dict[int, tuple[int, int]],
    rate_bps: int | None = None,
) -> pd.DataFrame:
    directed = _ref_directed(bins, addr_to_node) if not bins.empty else None
    frames = []
    for node, iface in sorted(ifaces.items()):
        start, end = spans[node]
        wide = pd.DataFrame()
        if directed is not None:
            mine = directed[directed["node"] == node]
            wide = mine.pivot_table(
                index="t_ns", columns="direction", values=["bytes", "packets"], aggfunc="sum"
            ).fillna(0)
        t_bin = snap(wide.index.to_numpy(), bin_ns) if len(wide) else np.empty(0, np.int64)
        per_bin = {}
        for col, key in {
            "tx_bytes": ("bytes", "tx"),
            "rx_bytes": ("bytes", "rx"),
            "tx_packets": ("packets", "tx"),
            "rx_packets": ("packets", "rx"),
        }.items():
            per_bin[col] = wide[key].to_numpy(np.int64) if key in wide.columns else 0 * t_bin
        frames.append(_ref_sparse(node, iface, t_bin, per_bin, bin_ns, start, end, rate_bps))
    return pd.concat(frames, ignore_index=True)[wire.COUNTER_COLUMNS]


def _ref_sparse(
    node: int,
    iface: str,
    t_bin: np.ndarray,
    per_bin: dict[str, np.ndarray],
    bin_ns: int,
    start: int,
    end: int,
    rate_bps: int | None,
) -> pd.DataFrame:
    order = np.argsort(t_bin, kind="stable")
    t_bin = t_bin[order]
    uniq, inverse = np.unique(t_bin, return_inverse=True)
    per = {
        k: np.bincount(inverse, v[order], len(uniq)).astype(np.int64) for k, v in per_bin.items()
    }
    lo = int(snap(np.array([start]), bin_ns)[0])
    hi = max(int(snap(np.array([end]), bin_ns)[0]), int(uniq[-1]) + bin_ns if len(uniq) else end)
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
        k, first = np.unique(knots[::-1], return_index=True)
        v = values[::-1][first]
        data[col] = np.rint(np.interp(times, k, v, left=0, right=v[-1])).astype(np.int64)
    frame = pd.DataFrame({"t_ns": times, **data})
    frame.insert(0, "iface", iface)
    frame.insert(0, "node", node)
    frame["resolution_ns"] = np.int64(bin_ns)
    return frame


def _ref_flows(bins: pd.DataFrame, addr_to_node: dict[str, int], bin_ns: int) -> pd.DataFrame:
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


def _irregular_bins() -> tuple[pd.DataFrame, dict[str, int]]:
    """Every kind of row: ingress from peers and from no peer, egress to peers (ignored) and
    to no peer, a null peer, bins of one node out of order, two rows of one bin and hook."""
    rng = np.random.default_rng(7)
    addr = {"10.0.0.1": 0, "10.0.0.2": 1, "10.0.0.3": 2}
    n = 5_000
    peers = np.array([*addr, "", "10.9.9.9"], dtype=object)[rng.integers(0, 5, n)]
    peers[rng.integers(0, n, 20)] = None
    bins = pd.DataFrame(
        {
            "t_ns": rng.integers(0, 4_000, n) * B + rng.integers(0, 90, n),
            "hook": np.array(["ingress", "egress"])[rng.integers(0, 2, n)],
            "peer": pd.array(peers, dtype="str"),
            "bytes": rng.integers(66, 64_000, n),
            "packets": rng.integers(1, 40, n),
            "skbs": 1,
            "node": rng.integers(0, 3, n),
        }
    )
    return bins, addr


def _bench_bins() -> tuple[pd.DataFrame, dict[str, int]]:
    """The raw bins of benchmarks/analysis.py's synthetic cell, at a small size."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "analysis.py"
    spec = importlib.util.spec_from_file_location("commscope_benchmark_analysis_bins", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    return bench.synthetic_raw_bins(bench.CellShape.of(1_500, 12_000, 3))


@pytest.mark.parametrize("make", [_irregular_bins, _bench_bins])
@pytest.mark.parametrize("rate", [None, 40_000_000])
def test_bins_give_the_tables_the_previous_implementation_gave(
    make: Callable[[], tuple[pd.DataFrame, dict[str, int]]], rate: int | None
) -> None:
    bins, addr = make()
    nodes = sorted(set(addr.values()) | {3})  # node 3: no traffic at all
    lo, hi = int(bins["t_ns"].min()) - 7 * B, int(bins["t_ns"].max()) + 3 * B
    spans = {n: (lo, hi) for n in nodes}
    ifaces = {n: f"e{n}" for n in nodes}
    pd.testing.assert_frame_equal(directed_bins(bins, addr), _ref_directed(bins, addr))
    pd.testing.assert_frame_equal(
        counters_from_bins(bins, B, addr, ifaces, spans, rate),
        _ref_counters(bins, B, addr, ifaces, spans, rate),
    )
    for width in (B, 1_000_000):
        pd.testing.assert_frame_equal(
            flows_from_bins(bins, addr, width), _ref_flows(bins, addr, width)
        )
    empty = bins.iloc[0:0]
    pd.testing.assert_frame_equal(
        counters_from_bins(empty, B, addr, ifaces, spans, rate),
        _ref_counters(empty, B, addr, ifaces, spans, rate),
    )
