"""The link model on the emulated cluster, on whichever engine this kernel gets (``auto``: netem
where the kernel has it, else nftables loss and the NFQUEUE delayer): the RTT added, the loss
rate, the jitter's spread and TCP under a cap with delay, measured for real; and that nothing is
left behind, also after failures. Accuracy targets are issue 11's; docs/linkmodel.md has the
numbers measured here."""

from __future__ import annotations

import math
import os
import re
import shlex
import statistics
import subprocess

import pytest
from scipy.stats import binom

from commscope.cluster import impair, shaping
from commscope.cluster.hosts import Host
from commscope.cluster.machine import kernel_has_netem
from commscope.cluster.shaping import (
    ShapingError,
    apply_shape,
    engine_for,
    host_has_netem,
    impairment_leftovers,
    qdisc_snapshot,
    remove_shape,
    shaped,
)
from commscope.spec.link import LinkShape

from .iperf import iperf3

pytestmark = pytest.mark.integration

DEFAULT = "exp0: default\nifb0: default"
MSS, FRAME = 1448, 1514
# The engine's own lateness (release after the due time, both directions) and ping's noise
# stay inside this bound on the mean RTT added (issue 11).
RTT_TOLERANCE_MS = 0.2
# A delayed reply wakes two sleeping processes per direction that the unshaped base RTT never
# waits for (the delayer's timer, ping's receive); each wake costs 0.02-0.1 ms on this VM even
# with no vCPU halted (awake_cpus). Only ever added: the engine never releases early.
WAKE_ALLOWANCE_MS = 0.15
# The kernel's loss draws are random: a rate check fails this often by chance alone.
BINOMIAL_ALPHA = 1e-4


def _ping(src: Host, dst: Host, count: int, interval: float = 0.02) -> tuple[float, list[float]]:
    """The mean RTT in ms of ``count`` pings src -> dst (ping's own summary, µs precision) and
    each reply's RTT (ping prints 3 significant digits: 0.1 ms resolution from 10 ms up).
    ``-U``: user-to-user time, since ping's kernel receive stamp is taken before prerouting and
    would hide a delay on src's own ingress. ping runs at real-time priority 5 (below the
    delayer's 10) so that load on the machine (a busy CI runner, training ranks) does not
    delay its own wake-ups: the test measures the link, not the scheduler."""
    out = src.run(
        f"chrt -f 5 ping -U -n -c {count} -i {interval} -W 2 {dst.spec.exp_addr}",
        warn=True,
        timeout=count * (interval + 1) + 30,
    ).stdout
    summary = re.search(r"= [\d.]+/([\d.]+)/[\d.]+/[\d.]+ ms", out)
    assert summary, out
    return float(summary.group(1)), [float(m) for m in re.findall(r"time=([\d.]+) ms", out)]


@pytest.fixture
def awake_cpus():
    """One SCHED_IDLE busy loop per CPU while the test runs, so no vCPU halts (HLT) between
    pings. A halted vCPU of this VM takes 0.05-0.2 ms to wake when a delayed reply must wake
    ping (or the delayer's timer fires), and the unshaped base RTT never pays it: there the
    reply is delivered inside ping's own send call. That wake is the host's cost, paid as well
    behind a real NIC's interrupt, not the link's; measured idle, it alone put the RTT added at
    2 x D + 0.28-0.30 ms (CI, 2026-11-27). SCHED_IDLE loops run only when nothing else can."""
    loops = [
        subprocess.Popen(["chrt", "--idle", "0", "sh", "-c", "while :; do :; done"])
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def _clean(hosts: list[Host]) -> None:
    for h in hosts:
        assert qdisc_snapshot(h) == DEFAULT
        assert impairment_leftovers(h) == []


def test_engine_matches_the_kernel(hosts: list[Host]) -> None:
    """auto picks netem exactly where the kernel has it; asking netem where it is missing is
    refused before any node is touched."""
    shape = LinkShape.parse("none", "5ms")
    expected = "netem" if kernel_has_netem() else "nfqueue"
    assert engine_for(hosts[0], shape) == expected
    assert engine_for(hosts[0], LinkShape.parse("50mbit")) is None
    assert host_has_netem(hosts[1]) is kernel_has_netem()
    if not kernel_has_netem():
        refused = pytest.raises(ValueError, match="run.link_engine=netem but this kernel has no")
        with refused, shaped(hosts, shape, engine="netem"):
            pytest.fail("the block must not run")
    _clean(hosts)
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "csprobe" not in namespaces  # the kernel probe cleaned up after itself


@pytest.mark.parametrize("delay_ms", [1, 5, 10, 20, 50])
def test_rtt_added_is_twice_the_delay(
    hosts: list[Host], delay_ms: int, record_property, awake_cpus: None
) -> None:
    """Both directions of the pair are delayed: ping -U RTT = base + 2 x delay (mean, -0.2 ms to
    +0.35 ms: the engine's lateness and the wakes a delayed reply costs)."""
    node0, node1 = hosts
    # 100 pings 20 ms apart: a rare multi-ms stall of this VM moves the mean by a few µs only.
    count = 100
    base, _ = _ping(node0, node1, count)
    with shaped(hosts, LinkShape.parse("none", f"{delay_ms}ms")) as link:
        mean, rtts = _ping(node0, node1, count)
    added = mean - base
    record_property("engine", link["engine"])
    record_property("rtt_added_ms", round(added, 4))
    print(
        f"{link['engine']}: delay {delay_ms} ms each way: RTT added {added:.3f} ms "
        f"(mdev {statistics.pstdev(rtts):.3f}, base {base:.3f}), {len(rtts)} pings"
    )
    assert len(rtts) == count
    assert -RTT_TOLERANCE_MS <= added - 2 * delay_ms <= RTT_TOLERANCE_MS + WAKE_ALLOWANCE_MS
    if link["engine"] == "nfqueue":
        for name in ("node0", "node1"):
            stats = link["nodes"][name]["delayer"]
            assert stats["packets"] >= count and stats["released"] == stats["packets"]
    _clean(hosts)


def test_tcp_connect_rtt(hosts: list[Host]) -> None:
    """A SYN / SYN-ACK (RST) exchange node0 -> node1 -> node0 crosses both delays too."""
    probe = (
        "import socket, sys, time\n"
        "best = 1e9\n"
        "for _ in range(5):\n"
        "    t = time.perf_counter()\n"
        "    try:\n"
        "        socket.create_connection((sys.argv[1], 9), timeout=2)\n"
        "    except ConnectionRefusedError:\n"
        "        best = min(best, time.perf_counter() - t)\n"
        "print(best * 1000)\n"
    )
    node0, node1 = hosts
    cmd = f"{node0.spec.python} -c {shlex.quote(probe)} {node1.spec.exp_addr}"
    base = float(node0.run(cmd).stdout)
    with shaped(hosts, LinkShape.parse("none", "20ms")):
        delayed = float(node0.run(cmd).stdout)
    print(f"TCP connect RTT {base:.2f} ms unshaped, {delayed:.2f} ms with 20 ms each way")
    # The best of five: the engine's lateness only adds; Python's own timing adds ~0.1 ms.
    assert 40 - RTT_TOLERANCE_MS <= delayed - base <= 40 + 1.0
    _clean(hosts)


def test_loss_rate_within_the_binomial_interval(hosts: list[Host], record_property) -> None:
    """5 % loss on each receiver: every echo crosses two losses, so (1 - 0.95^2) of the pings
    go unanswered, and each node's own drop counter holds p of what it saw. The draws are the
    kernel's (nft ``numgen random``, not seedable), so the rates are checked against binomial
    intervals at 1 - 1e-4: at 99 % the three checks of one run failed ~3 % of runs by chance
    alone (a CI run saw 231 lost echoes against 195 ± 34). What is exact is checked exactly:
    every lost echo is one packet a loss rule dropped, so no packet goes missing elsewhere."""
    node0, node1 = hosts
    p, count = 0.05, 2000
    with shaped(hosts, LinkShape.parse("none", loss="5%")) as link:
        out = node0.run(
            f"ping -n -q -c {count} -i 0.002 -W 1 {node1.spec.exp_addr}", warn=True, timeout=60
        ).stdout
    received = int(re.search(r"(\d+) received", out).group(1))  # type: ignore[union-attr]
    q = 1 - (1 - p) ** 2
    lost = count - received
    low, high = binom.interval(1 - BINOMIAL_ALPHA, count, q)
    print(f"{link['engine']}: {lost}/{count} echoes lost, expected in [{low:.0f}, {high:.0f}]")
    record_property("echo_loss", lost / count)
    assert low <= lost <= high
    if link["engine"] == "nfqueue":
        counters = [link["nodes"][name]["loss"] for name in ("node0", "node1")]
        for name, loss in zip(("node0", "node1"), counters, strict=True):
            n = loss["seen"]
            low_n, high_n = binom.interval(1 - BINOMIAL_ALPHA, n, p)
            print(f"{name}: dropped {loss['dropped']} of {n} (rate {loss['rate']:.4f})")
            assert low_n <= loss["dropped"] <= high_n
        # node1 saw the requests, node0 the replies; what else crossed the link (ARP is not
        # IP, so little) may have been dropped too, but no echo was lost without a drop.
        echoes_seen = count + received
        others = sum(c["seen"] for c in counters) - echoes_seen
        dropped = sum(c["dropped"] for c in counters)
        assert others >= 0
        assert lost <= dropped <= lost + others
    _clean(hosts)


def test_jitter_spread_matches_the_uniform_draw(hosts: list[Host], record_property) -> None:
    """10 ms ± 2 ms uniform on each side: an RTT is 20 ms plus the sum of two independent
    uniform draws in ±2 ms, a triangular distribution on ±4 ms: standard deviation
    2·sqrt(2/3) = 1.63 ms, interquartile range 2·4·(1 - sqrt(1/2)) = 2.34 ms. Pings 50 ms apart
    never queue behind each other, so FIFO clamping does not narrow the spread. The checks
    use quantiles: one stall of this VM (a 20 ms outlier was seen) would move the sd alone."""
    node0, node1 = hosts
    base, _ = _ping(node0, node1, 20)
    with shaped(hosts, LinkShape.parse("none", "10ms", "2ms")):
        _, rtts = _ping(node0, node1, 200, interval=0.05)
    added = [r - base for r in rtts]
    q = statistics.quantiles(added, n=100)  # q[i] is the (i+1)-th percentile
    iqr, expected_iqr = q[74] - q[24], 8 * (1 - math.sqrt(0.5))
    sd, expected_sd = statistics.pstdev(added), 2 * math.sqrt(2 / 3)
    print(
        f"jitter: median {q[49]:.3f} ms, IQR {iqr:.3f} (expected {expected_iqr:.3f}), "
        f"sd {sd:.3f} (expected {expected_sd:.3f}), p1..p99 {q[0]:.2f}..{q[98]:.2f}, "
        f"range {min(added):.2f}..{max(added):.2f}"
    )
    record_property("jitter_iqr_ms", round(iqr, 4))
    record_property("jitter_sd_ms", round(sd, 4))
    assert abs(q[49] - 20) <= 0.5
    # The IQR of 200 draws of this distribution stays within 30 % of its true value in all but
    # ~1 of 1,500 runs (simulated); the tails must reach past one side's ±2 ms (both sides
    # jittered: p1 16.6, p99 23.4 ms) and stay inside the ±4 ms bounds.
    assert 0.7 * expected_iqr <= iqr <= 1.3 * expected_iqr
    assert 16 - RTT_TOLERANCE_MS <= q[0] <= 17.5 and 22.5 <= q[98] <= 24 + 1.0
    _clean(hosts)


def test_tcp_under_cap_and_delay_reaches_the_ceiling(hosts: list[Host], record_property) -> None:
    """50 Mbit/s and 20 ms each way (RTT 40 ms, BDP 250 kB): one CUBIC flow reaches >= 95 % of
    the cap's goodput ceiling (cap x MSS / frame) once out of slow start."""
    node0, node1 = hosts
    shape = LinkShape.parse("50mbit", "20ms")
    with shaped(hosts, shape) as link:
        result = iperf3(node0, node1, seconds=8)
    # Goodput after slow start: the intervals past the first two seconds.
    intervals = [i["sum"] for i in result["intervals"] if i["sum"]["start"] >= 2]
    goodput = sum(i["bytes"] for i in intervals) * 8 / sum(i["seconds"] for i in intervals)
    ceiling = shape.rate_bps * MSS / FRAME  # type: ignore[operator]
    print(
        f"{link['engine']}: 50 Mbit/s + 20 ms: goodput {goodput / 1e6:.2f} Mbit/s of "
        f"{ceiling / 1e6:.2f} ({goodput / ceiling:.1%}), retransmits "
        f"{result['end']['sum_sent'].get('retransmits')}"
    )
    record_property("goodput_ratio", round(goodput / ceiling, 4))
    assert 0.95 * ceiling <= goodput <= 1.02 * ceiling
    _clean(hosts)


# ─────────────────────────────────────────────────────────────── nothing left behind


def _needs_nfqueue(hosts: list[Host]) -> None:
    if host_has_netem(hosts[0]):
        pytest.skip("this kernel has netem: the nfqueue engine's pieces are not used by auto")


def test_nothing_left_after_an_exception_inside(hosts: list[Host]) -> None:
    _needs_nfqueue(hosts)
    shape = LinkShape.parse("10mbit", "5ms", loss="1%")
    with pytest.raises(RuntimeError, match="boom"), shaped(hosts, shape):
        for h in hosts:
            left = impairment_leftovers(h)
            assert "nft table commscope_link" in left and "delayer process" in left
            assert any(line.startswith("iptables ") for line in left)
        raise RuntimeError("boom")
    _clean(hosts)


def test_nothing_left_when_the_delayer_cannot_start(
    hosts: list[Host], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second node's delayer is refused (its queue is taken by a stray delayer bound to
    it): that node's apply fails naming the step, and every node, the first one included, is
    returned to its state before the cell."""
    _needs_nfqueue(hosts)
    node1 = hosts[1]
    stray = impair.NodePaths(f"{node1.spec.workdir}/stray")
    stray_shape = LinkShape.parse("none", "1ms")
    node1.run(impair.apply_script("exp0", stray, stray_shape, node1.spec.python, "", 0))
    try:
        refused = pytest.raises(ShapingError, match="nfqueue engine: starting the delayer")
        with refused, shaped(hosts, LinkShape.parse("none", "5ms")):
            pytest.fail("the block must not run when shaping failed")
    finally:
        node1.run(impair.remove_script("exp0", stray, ""))
    _clean(hosts)


def test_a_crashed_cells_engine_is_cleared_by_the_next_cell(hosts: list[Host]) -> None:
    """A cell killed with its links impaired (apply, never remove) must not impair the next
    cell: shaped() finds the pieces, the next apply or unshape clears them."""
    _needs_nfqueue(hosts)
    node0 = hosts[0]
    apply_shape(node0, LinkShape.parse("none", "30ms", loss="2%"))
    assert impairment_leftovers(node0)
    with shaped(hosts, LinkShape.parse("50mbit")) as link:
        assert link["engine"] is None
        assert impairment_leftovers(node0) == []
        rtt, _ = _ping(node0, hosts[1], 5)
        assert rtt < 5, f"RTT {rtt:.1f} ms: the crashed cell's delay is still there"
    _clean(hosts)


def test_remove_is_idempotent_and_reports(hosts: list[Host]) -> None:
    _needs_nfqueue(hosts)
    node0 = hosts[0]
    apply_shape(node0, LinkShape.parse("none", "2ms", loss="1%"))
    _ping(node0, hosts[1], 10)
    first = remove_shape(node0)
    assert first["leftovers"] == [] and first["delayer"]["packets"] > 0
    assert first["loss"]["seen"] > 0
    second = remove_shape(node0)
    assert second == {"leftovers": []}
    _clean(hosts)


def test_dirty_engine_is_detected(hosts: list[Host], monkeypatch: pytest.MonkeyPatch) -> None:
    """If the engine's removal silently left a piece, shaped() must say so."""
    _needs_nfqueue(hosts)
    real = impair.remove_script

    def no_table_removal(iface: str, paths: impair.NodePaths, sudo: str, report: bool = True):
        return real(iface, paths, sudo, report).replace("nft delete table", "true nft")

    monkeypatch.setattr(shaping.impair, "remove_script", no_table_removal)
    try:
        dirty = pytest.raises(ShapingError, match="the link engine is still installed: nft table")
        with dirty, shaped(hosts[:1], LinkShape.parse("none", loss="1%")):
            pass
    finally:
        monkeypatch.undo()
        remove_shape(hosts[0])
    _clean(hosts)


def test_a_delayer_that_dies_fails_the_cell(hosts: list[Host]) -> None:
    """A delayer killed during the cell leaves the delay silently off (--queue-bypass): the
    cell must not pass as delayed."""
    _needs_nfqueue(hosts)
    node0 = hosts[0]
    paths = impair.NodePaths(node0.spec.workdir)
    died = pytest.raises(ShapingError, match="node0: the delayer left no statistics")
    with died, shaped(hosts, LinkShape.parse("none", "2ms")):
        node0.run(f"pkill -KILL -f {paths.pattern}")
    _clean(hosts)
