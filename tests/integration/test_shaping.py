"""tc shaping on the emulated cluster: caps measured with iperf3, cleanup. Delay, jitter and loss:
test_linkmodel.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from commscope.cluster import shaping
from commscope.cluster.hosts import Cluster, Host
from commscope.cluster.shaping import (
    ShapingError,
    apply_shape,
    qdisc_snapshot,
    qdisc_stats,
    remove_shape,
    shaped,
)
from commscope.spec.link import LinkShape

from .iperf import iperf3

pytestmark = pytest.mark.integration

DEFAULT = "exp0: default\nifb0: default"
# Bytes on the wire per full-sized TCP segment vs payload in it. With a 1500-byte MTU and TCP
# timestamps (Linux default) the MSS is 1448; the frame tbf accounts for is 1448 + 32 (TCP) +
# 20 (IPv4) + 14 (Ethernet) = 1514 bytes (tc ignores FCS, preamble and inter-frame gap).
MSS, FRAME = 1448, 1514
# A filter someone else (the wire accounting) keeps at prio 1 of clsact: u32 that never matches
# (no IPv4 header starts with 0x00000001), so it lets every packet on to the next filter as the
# accounting's BPF program does (TC_ACT_UNSPEC). This kernel has no gact/matchall to do better.
OTHER_FILTER = "protocol all u32 match u32 0x00000001 0xffffffff at 0"


# ─────────────────────────────────────────────────────────────── measurement helpers


def _ns_pid(cluster: Cluster, index: int) -> int:
    """A process inside node ``index``'s namespace (its sshd): /proc/PID/net/dev is that
    namespace's view, readable from here in microseconds, without forking `ip netns exec`."""
    return int((Path(cluster.state_dir) / f"node{index}" / "sshd.pid").read_text())


def _tx_bytes(pid: int, dev: str) -> int:
    for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines():
        name, _, fields = line.partition(":")
        if name.strip() == dev:
            return int(fields.split()[8])  # receive has 8 columns, then transmit bytes
    raise KeyError(f"{dev} not in /proc/{pid}/net/dev")


@contextmanager
def _sample_tx(pid: int, dev: str, period_s: float = 0.05) -> Iterator[list[tuple[float, int]]]:
    """Sample (monotonic time, tx_bytes) of ``dev`` in a thread while the block runs."""
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            samples.append((time.monotonic(), _tx_bytes(pid, dev)))
            time.sleep(period_s)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()
        samples.append((time.monotonic(), _tx_bytes(pid, dev)))


def _steady_rate_bps(samples: list[tuple[float, int]], trim_s: float = 0.3) -> float:
    """Rate over the busy part of the run, minus ``trim_s`` at each end (TCP start, the tail)."""
    busy = [b for a, b in zip(samples, samples[1:], strict=False) if b[1] - a[1] > 1500]
    assert len(busy) > 10, f"no sustained traffic seen in {len(samples)} samples"
    start, end = busy[0][0] + trim_s, busy[-1][0] - trim_s
    window = [s for s in samples if start <= s[0] <= end]
    (t0, b0), (t1, b1) = window[0], window[-1]
    return (b1 - b0) * 8 / (t1 - t0)


def _tbf_bytes(host: Host, dev: str) -> int:
    return next(q["bytes"] for q in qdisc_stats(host) if q["dev"] == dev and q["kind"] == "tbf")


# ─────────────────────────────────────────────────────────────── rate caps


@pytest.mark.parametrize("reverse", [False, True], ids=["node0-sends", "node0-receives"])
@pytest.mark.parametrize("bw", ["50mbit", "200mbit"])
def test_iperf3_reaches_the_cap(
    netns_cluster: Cluster, hosts: list[Host], bw: str, reverse: bool, record_property
) -> None:
    """Only node0 is shaped, so each direction tests one side of the shaping by itself:
    node0 sending exercises its egress tbf on exp0, node0 receiving (iperf3 -R) its ingress
    (exp0 clsact → mirred → ifb0 → tbf).

    What "reaches the cap" means. tbf charges each packet its L2 length without FCS; for a GSO
    super-packet it charges every segment's headers (qdisc_pkt_len), i.e. what the wire would
    carry. So:
    * the L2 rate through the shaper must be within 5% of the cap;
    * iperf3 reports TCP goodput, at most cap x MSS/FRAME = cap x 1448/1514 (95.6%): header
      overhead, not a shaping error, so goodput is checked against that bound;
    * the interface byte counter: veth (and ifb) count skb->len. The cluster's veths carry MTU
      frames (TSO/GSO off), so tx_bytes is the L2 byte count; with offloads on, a GSO
      super-packet's skb holds its headers only ONCE and tx_bytes undercounts L2 by up to ~4.4%.
      We take the steady-state rate from tx_bytes samples (exact timing, no fork) and scale it
      by tbf's own byte count over the same run divided by tx_bytes over the run (the per-run
      header correction: 1 with frames).
    The counter is exp0's tx_bytes on node0 when node0 sends (it counts what left the tbf),
    ifb0's tx_bytes when node0 receives (what left the ingress tbf, i.e. what was delivered;
    exp0's rx side would also count packets the ingress tbf then drops).
    """
    shape = LinkShape.parse(bw)
    cap = shape.rate_bps
    assert cap is not None
    node0, node1 = hosts
    dev = "ifb0" if reverse else "exp0"
    pid = _ns_pid(netns_cluster, 0)
    with shaped([node0], shape):
        tbf0, tx0 = _tbf_bytes(node0, dev), _tx_bytes(pid, dev)
        with _sample_tx(pid, dev) as samples:
            result = iperf3(node0, node1, reverse)
        tbf1, tx1 = _tbf_bytes(node0, dev), _tx_bytes(pid, dev)

    goodput = result["end"]["sum_received"]["bits_per_second"]
    header_correction = (tbf1 - tbf0) / (tx1 - tx0)
    counter_rate = _steady_rate_bps(samples)
    l2_rate = counter_rate * header_correction
    for key, value in {
        "cap_mbit": cap / 1e6,
        "goodput_mbit": goodput / 1e6,
        "counter_mbit": counter_rate / 1e6,
        "l2_mbit": l2_rate / 1e6,
        "header_correction": header_correction,
    }.items():
        record_property(key, round(value, 4))
    print(
        f"{bw} {'reverse' if reverse else 'forward'}: goodput {goodput / 1e6:.2f} Mbit/s, "
        f"{dev} tx_bytes {counter_rate / 1e6:.2f}, L2 {l2_rate / 1e6:.2f} "
        f"(x{header_correction:.4f}), retransmits {result['end']['sum_sent'].get('retransmits')}"
    )
    assert 1.0 <= header_correction < 1.06  # tbf never counts less than the device
    if not node0.spec.offload:  # frames: the device counts what tbf counts
        assert header_correction == pytest.approx(1.0, abs=1e-3)
    assert abs(l2_rate / cap - 1) < 0.05, f"L2 rate {l2_rate / 1e6:.1f} Mbit/s vs cap {bw}"
    goodput_bound = cap * MSS / FRAME
    assert 0.95 * goodput_bound <= goodput <= 1.02 * goodput_bound, (
        f"goodput {goodput / 1e6:.1f} Mbit/s vs {goodput_bound / 1e6:.1f} expected at {bw}"
    )
    assert qdisc_snapshot(node0) == DEFAULT


def _other_filters(host: Host) -> dict[str, list[int]]:
    """Priorities of the filters on exp0's clsact hooks, by hook (hooks without any left out)."""
    out = {}
    for hook in ("ingress", "egress"):
        prios = sorted(
            {
                f["pref"]
                for f in json.loads(host.run(f"tc -j filter show dev exp0 {hook}").stdout or "[]")
            }
        )
        if prios:
            out[hook] = prios
    return out


def test_a_prio1_filter_survives_shaping_and_both_directions_stay_capped(
    hosts: list[Host],
) -> None:
    """The lifecycle of a cell with the wire accounting: shape (clsact + redirect at prio 2),
    someone attaches filters at prio 1 on both hooks, a re-apply of the shape (`replace` on
    clsact) keeps them, both directions still reach the cap, the filters are detached, and
    unshaping returns the qdiscs to their state before."""
    node0, node1 = hosts
    shape = LinkShape.parse("50mbit")
    bound = shape.rate_bps * MSS / FRAME  # type: ignore[operator]
    with shaped([node0], shape):
        for hook in ("ingress", "egress"):
            node0.run(f"tc filter add dev exp0 {hook} prio 1 {OTHER_FILTER}")
        apply_shape(node0, shape)  # idempotent re-apply, as a retried cell would
        assert _other_filters(node0) == {"ingress": [1, 2], "egress": [1]}
        goodput = {
            direction: iperf3(node0, node1, reverse=direction == "receive")["end"]["sum_received"][
                "bits_per_second"
            ]
            for direction in ("send", "receive")
        }
        print({k: round(v / 1e6, 2) for k, v in goodput.items()})
        assert all(0.95 * bound <= v <= 1.02 * bound for v in goodput.values()), goodput
        assert _other_filters(node0) == {"ingress": [1, 2], "egress": [1]}
        for hook in ("ingress", "egress"):
            node0.run(f"tc filter del dev exp0 {hook} prio 1")
    assert qdisc_snapshot(node0) == DEFAULT
    assert _other_filters(node0) == {}


def test_unshaping_removes_clsact_with_whatever_is_still_on_it(hosts: list[Host]) -> None:
    """An accounting that never detached (a killed run) does not leave clsact behind."""
    host = hosts[1]
    apply_shape(host, LinkShape.parse("50mbit"))
    host.run(f"tc filter add dev exp0 ingress prio 1 {OTHER_FILTER}")
    remove_shape(host)
    assert qdisc_snapshot(host) == DEFAULT
    assert _other_filters(host) == {}


# ─────────────────────────────────────────────────────────────── always unshaped


def test_unshaped_after_exception_inside(hosts: list[Host]) -> None:
    with pytest.raises(RuntimeError, match="boom"), shaped(hosts, LinkShape.parse("10mbit")):
        assert all("tbf" in qdisc_snapshot(h) for h in hosts)
        raise RuntimeError("boom")
    assert [qdisc_snapshot(h) for h in hosts] == [DEFAULT, DEFAULT]


def test_unshaped_when_apply_fails_halfway(
    hosts: list[Host], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shaping.shape_commands

    def broken(iface: str, ifb: str, shape: LinkShape, **links: object) -> list[str]:
        cmds = real(iface, ifb, shape, **links)  # type: ignore[arg-type]
        # Fail after the egress cap and the ingress redirect are in place.
        return [*cmds[:-1], f"tc qdisc replace dev {ifb} root handle 1: nosuchqdisc"]

    monkeypatch.setattr(shaping, "shape_commands", broken)
    with pytest.raises(ShapingError, match="nosuchqdisc"), shaped(hosts, LinkShape.parse("10mbit")):
        pytest.fail("the block must not run when shaping failed")
    assert [qdisc_snapshot(h) for h in hosts] == [DEFAULT, DEFAULT]


def test_reapply_and_remove_are_idempotent(hosts: list[Host]) -> None:
    host = hosts[1]
    try:
        apply_shape(host, LinkShape.parse("100mbit"))
        first = qdisc_snapshot(host)
        apply_shape(host, LinkShape.parse("100mbit"))  # replace, not stack
        assert qdisc_snapshot(host) == first
        apply_shape(host, LinkShape.parse("20mbit"))  # a new cell changes the cap in place
        assert '"rate": 2500000' in qdisc_snapshot(host)
        filters = host.run("tc filter show dev exp0 ingress").stdout
        assert filters.count("mirred") == 1
    finally:
        remove_shape(host)
        remove_shape(host)
    assert qdisc_snapshot(host) == DEFAULT


def test_shaped_detects_a_dirty_cluster(hosts: list[Host], monkeypatch: pytest.MonkeyPatch) -> None:
    """If unshaping silently left something, shaped() must say so, not carry on."""

    def removes_nothing(host: Host, cc: str | None = None, check: bool = False) -> dict:
        return {"leftovers": [], **({"after": shaping.link_state(host)} if check else {})}

    monkeypatch.setattr(shaping, "remove_shape", removes_nothing)
    try:
        dirty = pytest.raises(ShapingError, match="not back to their pre-shaping state")
        with dirty, shaped(hosts[:1], LinkShape.parse("10mbit")):
            pass
    finally:
        monkeypatch.undo()
        remove_shape(hosts[0])
    assert qdisc_snapshot(hosts[0]) == DEFAULT
