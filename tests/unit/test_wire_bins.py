"""The BPF accounting's bins turned into cumulative counters and node-pair flows
(commscope.cell.wire): exact at every bin edge, flat across idle stretches, tx counted where it
was received."""

from __future__ import annotations

import numpy as np
import pandas as pd

from commscope.cell.wire import counters_from_bins, directed_bins, flows_from_bins, serialized, snap

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
