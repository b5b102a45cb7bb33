"""The fidelity monitor's table from synthetic host samples: shares over the measured window,
bounds, and the cell's verdict."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from commscope.contracts import HOST_SAMPLE_COLUMNS
from commscope.metrics import fidelity as f

S = 1_000_000_000


def _samples(
    node: int,
    seconds: int,
    *,
    wait_per_s: float,
    steal_per_s: float = 0.0,
    host: int = 77,
    idle_per_s: float = 0.02,
) -> pd.DataFrame:
    """Two CPUs sampled every 0.5 s; per second the ranks run 1.5 CPU-seconds and wait
    ``wait_per_s`` CPU-seconds, the host is idle ``idle_per_s`` CPU-seconds and steal takes
    ``steal_per_s``; the delayer runs 10 ms and waits 1 ms."""
    rows = []
    for i in range(2 * seconds + 1):
        t = i / 2
        steal = steal_per_s * t
        idle = idle_per_s * t
        total = 2.0 * t
        rows.append(
            (
                10 * S + int(t * S), host, 2,
                int((total - idle - steal) * S), int(idle * S), int(steal * S), int(total * S),
                int(wait_per_s * t * 1e6),
                int(1.5 * t * S), int(wait_per_s * t * S), 8,
                int(0.01 * t * S), int(0.001 * t * S), 1,
            )
        )  # fmt: skip
    frame = pd.DataFrame(rows, columns=HOST_SAMPLE_COLUMNS)
    frame.insert(0, "node", node)
    # As the parse stage writes it: the cell's parameters follow as constant columns.
    return frame.assign(strategy="ddp", model="tiny", bw="none", cell="c")


def test_shares_are_differences_over_the_window() -> None:
    host = _samples(0, 10, wait_per_s=0.1, idle_per_s=0.2)
    table = f.fidelity_table(host, (12 * S, 18 * S))
    (row,) = table.to_dict("records")
    assert row["window_s"] == 6.0  # samples at exactly 12 s and 18 s bracket the window
    assert math.isclose(row["ranks_cpus"], 1.5)
    assert math.isclose(row["runnable_ranks"], 1.6)
    assert math.isclose(row["ranks_wait_share"], 0.1 / 1.6)
    assert math.isclose(row["host_busy_share"], 0.9)
    assert math.isclose(row["host_idle_min"], 0.1)
    assert math.isclose(row["cpu_pressure_share"], 0.1)
    assert math.isclose(row["delayer_wait_share"], 0.001 / 0.011)
    # Waits on a host with CPU to spare (10 % idle) are wake-up latency, not contention ...
    assert row["host_limited"] is False and row["limited_by"] == ""
    # ... on a saturated host (1 % idle) the delayer's 9 % wait is over its 5 % bound.
    (busy,) = f.fidelity_table(_samples(0, 10, wait_per_s=0.1), (12 * S, 18 * S)).to_dict("records")
    assert busy["host_busy_share"] >= f.HOST_BUSY_BOUND
    assert busy["host_limited"] is True and busy["limited_by"] == "delayer"


def test_a_node_over_the_rank_bound_makes_the_cell_host_limited() -> None:
    host = pd.concat([_samples(0, 10, wait_per_s=0.05), _samples(1, 10, wait_per_s=0.5)])
    table = f.fidelity_table(host, (11 * S, 19 * S))
    assert list(table["node"]) == [0, 1]
    assert table.loc[1, "ranks_wait_share"] > f.RANK_WAIT_BOUND
    verdict = f.cell_verdict(table)
    assert verdict["host_limited"] and "ranks" in str(verdict["limited_by"])
    # 1.55 + 2.0 runnable rank threads on one 2-CPU host: oversubscribed ...
    assert verdict["oversubscribed"] is True
    assert math.isclose(verdict["runnable_rank_threads"], 3.55) and verdict["host_cpus"] == 2
    # ... but not when each node has two CPUs of its own (another boot id).
    apart = pd.concat([_samples(0, 10, wait_per_s=0.05), _samples(1, 10, wait_per_s=0.5, host=78)])
    assert f.cell_verdict(f.fidelity_table(apart, (11 * S, 19 * S)))["oversubscribed"] is False


def test_steal_counts_against_the_cell() -> None:
    host = _samples(0, 10, wait_per_s=0.0, steal_per_s=0.3)
    (row,) = f.fidelity_table(host, (11 * S, 19 * S)).to_dict("records")
    assert math.isclose(row["steal_share"], 0.15)
    assert "steal" in row["limited_by"]


def test_no_samples_or_no_window_give_an_empty_table_and_an_unmonitored_cell() -> None:
    assert f.fidelity_table(pd.DataFrame(), (0, 1)).empty
    assert f.fidelity_table(_samples(0, 2, wait_per_s=0.0), None).empty
    verdict = f.cell_verdict(pd.DataFrame(columns=f.FIDELITY_COLUMNS))
    assert list(verdict) == f.FIDELITY_SUMMARY_COLUMNS
    assert verdict["monitored"] is False and verdict["host_limited"] is False


# --- the shaper check: synthetic wire bins of one port ---------------------------------------

BIN_NS = 100_000
RATE = 50e6  # 50 Mbit/s: a 1,514-byte frame every 242 us
FRAME = 1514
BURST = 6250.0  # what shaping sizes for 50 Mbit/s: rate x 1 ms


def _tbf_departures(arrivals: np.ndarray, stalls: list[tuple[float, float]] = ()) -> np.ndarray:
    """When a token bucket (RATE, BURST) lets out frames that arrive at ``arrivals`` (s), frame
    by frame as tbf does; during a stall (start, end) it cannot run and dequeues at its end,
    with the tokens gathered meanwhile (at most the bucket)."""
    rate = RATE / 8
    out, tokens, t_tokens, last = [], BURST, 0.0, 0.0
    for a in arrivals:
        t = max(a, last)
        tokens = min(BURST, tokens + (t - t_tokens) * rate)
        t_tokens = t
        if tokens < FRAME:
            t += (FRAME - tokens) / rate
            tokens, t_tokens = FRAME, t
        for start, end in stalls:
            if start <= t < end:
                tokens, t_tokens, t = min(BURST, tokens + (end - t) * rate), end, end
        tokens -= FRAME
        out.append(t)
        last = t
    return np.array(out)


def _bins(times_s: np.ndarray, n_bins: int) -> np.ndarray:
    k = (times_s * 1e9 // BIN_NS).astype(int)
    return np.bincount(k[k < n_bins], minlength=n_bins).astype(float) * FRAME


def _port(delivered_s: np.ndarray, offered_s: np.ndarray, n_bins: int = 15_000) -> dict:
    return f.port_fidelity(
        _bins(offered_s, n_bins),
        _bins(delivered_s, n_bins),
        rate_bps=RATE,
        bin_ns=BIN_NS,
        burst_bytes=BURST,
        frame_bytes=FRAME,
    )


# A bulk transfer: 4,000 frames offered in 10 bursts of 400 at 0, 100, ... 900 ms (~1 s at
# the cap: the port stays backlogged), and a pause, then 100 frames in one burst at 1.3 s.
OFFERED = np.concatenate([np.repeat(np.arange(10) * 0.1, 400), np.full(100, 1.3)])


def test_ideal_output_is_the_token_bucket() -> None:
    rng = np.random.default_rng(3)
    offered = rng.choice([0, 0, 0, 1514, 3000, 9000], size=2000).astype(float)
    rate, burst = 625.0, 6250.0
    expected, queue, tokens = [], 0.0, burst
    for x in offered:  # bin by bin: the queue drains as far as the bucket and a bin's tokens go
        queue += x
        sent = min(queue, tokens + rate)
        queue, tokens = queue - sent, min(burst, tokens + rate - sent)
        expected.append(sent)
    assert np.allclose(f.ideal_output(offered, rate, burst), np.cumsum(expected))


def test_a_faithful_tbf_dequeues_at_its_cap_without_gaps() -> None:
    port = _port(_tbf_departures(OFFERED), OFFERED)
    assert port["backlogged_s"] > 0.9
    assert abs(port["achieved_over_cap"] - 1) < 0.01
    assert port["gap_share"] == 0 and port["over_share"] == 0
    assert not f.shaper_limited(port)


def test_a_starved_shaper_leaves_gaps_and_falls_short_of_its_cap() -> None:
    # Asleep 2 ms of every 5: its bucket gives back 1 ms at each wake-up, the rest is lost.
    stalls = [(t, t + 0.002) for t in np.arange(0.001, 1.2, 0.005)]
    port = _port(_tbf_departures(OFFERED, stalls), OFFERED)
    assert port["achieved_over_cap"] < f.ACHIEVED_LOW_BOUND
    assert port["gap_share"] > f.GAP_BOUND
    assert f.shaper_limited(port)


def test_a_receiver_that_catches_up_delivers_beyond_the_bucket() -> None:
    # The shaper is faithful, but its frames reach the receiver in clumps: what left in the
    # first 2 ms of every 5 arrives at once at 2 ms (one bin in 50).
    sent = _tbf_departures(OFFERED)
    phase = sent % 0.005
    arrived = np.where(phase < 0.002, sent - phase + 0.002, sent)
    port = _port(arrived, OFFERED)
    assert port["over_share"] > f.OVER_BOUND
    assert port["gap_share"] > f.GAP_BOUND
    assert f.shaper_limited(port)


def test_a_port_hardly_backlogged_is_not_judged() -> None:
    few = np.full(20, 0.5)  # 30 kB: 5 ms at the cap
    port = _port(_tbf_departures(few), few)
    assert port["backlogged_s"] < f.MIN_BACKLOGGED_S
    assert math.isnan(port["achieved_over_cap"]) and not f.shaper_limited(port)


def _wire(delivered_s: np.ndarray, node: int, peer: int, t0: int) -> tuple[pd.DataFrame, ...]:
    """One sender's egress bins and its receiver's ingress bins (``wire_flows``) as the
    metrics read them, from ``t0`` (ns)."""
    n_bins = 15_000
    offered = _bins(OFFERED, n_bins)
    delivered = _bins(delivered_s, n_bins)
    t = t0 + np.arange(n_bins) * BIN_NS
    egress = pd.DataFrame({"node": node, "t_ns": t, "bytes": offered})
    flows = pd.DataFrame({"src_node": node, "dst_node": peer, "t_ns": t, "bytes": delivered})
    return egress[egress["bytes"] > 0], flows[flows["bytes"] > 0]


def test_the_shaper_check_joins_the_fidelity_table_and_the_verdict() -> None:
    t0 = 10 * S
    stalls = [(t, t + 0.002) for t in np.arange(0.001, 1.2, 0.005)]
    good = _wire(_tbf_departures(OFFERED), node=0, peer=1, t0=t0)
    bad = _wire(_tbf_departures(OFFERED, stalls), node=1, peer=0, t0=t0)
    offered = pd.concat([good[0], bad[0]])
    delivered = pd.concat([good[1], bad[1]])
    window = (t0, t0 + int(1.4 * S))
    kwargs = {"bin_ns": BIN_NS, "burst_bytes": BURST, "frame_bytes": FRAME}
    shaper = f.shaper_table(offered, delivered, window, rate_bps=RATE, **kwargs)
    assert list(shaper["node"]) == [0, 1] and list(shaper.columns) == ["node", *f.SHAPER_COLUMNS]
    # Node 0 has host samples within its bounds, node 1 none: its port alone makes the cell
    # host-limited.
    host = _samples(0, 3, wait_per_s=0.0, idle_per_s=0.5).assign(t_ns=lambda d: d["t_ns"] - S)
    table = f.fidelity_table(host, window, shaper)
    assert list(table.columns) == f.FIDELITY_COLUMNS
    assert list(table["limited_by"]) == ["", "shaper"]
    assert table["host_id"].isna().tolist() == [False, True]
    verdict = f.cell_verdict(table)
    assert list(verdict) == f.FIDELITY_SUMMARY_COLUMNS
    assert verdict["monitored"] and verdict["host_limited"] and verdict["limited_by"] == "shaper"
    assert verdict["shaper_checked"] and verdict["achieved_over_cap"] < f.ACHIEVED_LOW_BOUND
    assert verdict["shaper_gap_share"] > f.GAP_BOUND


def test_an_unshaped_cell_is_not_judged_on_its_shaper() -> None:
    t0 = 10 * S
    offered, delivered = _wire(OFFERED, node=0, peer=1, t0=t0)  # delivered as offered: no cap
    window = (t0, t0 + int(1.4 * S))
    kwargs = {"bin_ns": BIN_NS, "burst_bytes": BURST, "frame_bytes": FRAME}
    assert f.shaper_table(offered, delivered, window, rate_bps=None, **kwargs).empty
    host = _samples(0, 3, wait_per_s=0.0, idle_per_s=0.5)
    table = f.fidelity_table(host, (11 * S, 12 * S), None)
    verdict = f.cell_verdict(table)
    assert table["achieved_over_cap"].isna().all()
    assert verdict["shaper_checked"] is False and math.isnan(verdict["achieved_over_cap"])
    assert verdict["host_limited"] is False


# --- the delayer's lateness: its record in cell.json (link_engine) ----------------------------


def _delayer(p99_us: float, *, delay_us: int = 5000, jitter_us: int = 0, released: int = 100):
    """A node's link-engine record as the NFQUEUE delayer writes it (fields the check reads)."""
    late = {"mean": p99_us / 10, "p50": 13.0, "p99": p99_us, "max": 2 * p99_us}
    return {
        "delayer": {"delay_us": delay_us, "jitter_us": jitter_us, "released": released,
                    "packets": released, "late_us": late}
    }  # fmt: skip


def test_a_delayer_late_past_its_bound_makes_the_node_host_limited() -> None:
    # As the default study's DDP cell at 1 Gbit/s + 5 ms recorded it: node1's p99 11 ms late.
    record = {"engine": "nfqueue", "nodes": {"node0": _delayer(313.0), "node1": _delayer(10977.0)}}
    late = f.delayer_lateness(record)
    assert sorted(late) == [0, 1]
    assert math.isclose(late[0]["delay_late_share"], 313 / 5000)
    host = pd.concat([_samples(n, 3, wait_per_s=0.0, idle_per_s=0.5) for n in (0, 1)])
    table = f.fidelity_table(host, (11 * S, 12 * S), None, late)
    assert list(table.columns) == f.FIDELITY_COLUMNS
    assert list(table["limited_by"]) == ["", "delay"]
    assert list(table["delay_late_us_p99"]) == [313.0, 10977.0]
    verdict = f.cell_verdict(table)
    assert verdict["host_limited"] and verdict["limited_by"] == "delay"
    assert math.isclose(verdict["delay_late_share"], 10977 / 5000)


def test_a_punctual_delayer_or_none_leaves_the_cell_faithful() -> None:
    host = _samples(0, 3, wait_per_s=0.0, idle_per_s=0.5)
    # 1.5 ms late at the p99 of a 20 ms delay: 7.5 %, inside the bound.
    table = f.fidelity_table(host, (11 * S, 12 * S), None, f.delayer_lateness(
        {"nodes": {"node0": _delayer(1500.0, delay_us=20_000)}}
    ))  # fmt: skip
    verdict = f.cell_verdict(table)
    assert verdict["host_limited"] is False
    assert math.isclose(verdict["delay_late_share"], 0.075)
    # No measurement: a delayer that released nothing, a link without delay or jitter, netem
    # (no delayer record), no record at all.
    assert f.delayer_lateness({"nodes": {"node0": _delayer(9e9, released=0)}}) == {}
    assert f.delayer_lateness({"nodes": {"node0": _delayer(9e9, delay_us=0)}}) == {}
    assert f.delayer_lateness({"engine": "netem", "nodes": {"node0": {"loss": {}}}}) == {}
    assert f.delayer_lateness(None) == {}
    # Jitter alone: lateness is held against the jitter.
    (jittered,) = f.delayer_lateness(
        {"nodes": {"node2": _delayer(300.0, delay_us=0, jitter_us=1000)}}
    ).items()
    assert jittered[0] == 2 and math.isclose(jittered[1]["delay_late_share"], 0.3)
    no_host = f.cell_verdict(f.fidelity_table(pd.DataFrame(), None))
    assert math.isnan(no_host["delay_late_share"])
