"""The NFQUEUE delayer's accuracy and capacity, measured: `python benchmarks/delayer.py` (as root).

Two throwaway namespaces (csdba, csdbb) joined by a veth pair carrying MTU frames (TSO/GSO off,
as the experiment links of a study), with a delayer on each namespace's ingress (an iptables
NFQUEUE rule in mangle PREROUTING, added after the delayer printed "ready", deleted before its
SIGTERM: the order the shaping code uses). Four parts, each printed as a table:

(a) delay: UDP round trips (ping -U semantics: timed in user space when the reply is read, by a
    client and an echo server at SCHED_FIFO priority 5, below the delayer's 10) with D in
    ``--delays`` on both directions: mean added RTT vs the configured 2D, mdev, and both
    delayers' release lateness from their stats files.
(b) jitter: D = 10 ms, J = 2 ms uniform on both directions: the RTT's standard deviation vs
    the uniform distribution's sqrt(2 J^2 / 3) = 1.63 ms (the sum of two independent U(-J, J)).
(c) capacity: a TCP transfer (iperf3, 5 s) through one delayer (D = 1 ms) vs none: goodput,
    packets per second through the delayer, its CPU share, lateness, spin, ENOBUFS, and the
    packets that went through undelayed (missed, overflow).
(ping) where iputils ping is installed, the same check with it: ping -U with both directions
    delayed, plain ping (kernel receive stamp) with one.
(d) TCP under a cap: tbf 50 Mbit/s on each side's egress + 20 ms delay on each side's ingress,
    iperf3 -t 10: goodput vs the ceiling 50 x 1448 / 1514 = 47.8 Mbit/s, retransmits.

``--json PATH`` also writes every number. Needs root, iptables, iperf3, ethtool and the
delayer's build dependencies (gcc, libnetfilter-queue-dev). docs/delayer.md has the results.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

from commscope.cluster.shaping import TBF_LATENCY_MS, tbf_burst_bytes
from commscope.node import delayer

NS = ("csdba", "csdbb")
IFACE = {"csdba": "csdba0", "csdbb": "csdbb0"}
ADDR = {"csdba": "10.231.8.1", "csdbb": "10.231.8.2"}
QUEUE = {"csdba": 11, "csdbb": 12}
ECHO_PORT, IPERF_PORT = 9918, 5218
PROBE_PRIORITY = 5  # SCHED_FIFO, below the delayer's 10
MSS, FRAME = 1448, 1514  # TCP payload and Ethernet frame of a 1500 B MTU with timestamps


def _ns(ns: str) -> list[str]:
    return ["ip", "netns", "exec", ns]


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


@contextmanager
def veth_pair() -> Iterator[None]:
    """csdba <-> csdbb over a veth pair with MTU frames; both namespaces deleted afterwards."""
    a, b = NS
    for ns in NS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # left by a crash
    try:
        for ns in NS:
            _run("ip", "netns", "add", ns)
        _run(
            "ip", "link", "add", IFACE[a], "netns", a, "type", "veth", "peer", IFACE[b], "netns", b
        )
        for ns in NS:
            _run("ip", "-n", ns, "addr", "add", f"{ADDR[ns]}/24", "dev", IFACE[ns])
            _run("ip", "-n", ns, "link", "set", IFACE[ns], "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run(*_ns(ns), "ethtool", "-K", IFACE[ns], "tso", "off", "gso", "off", "gro", "off")
        yield
    finally:
        for ns in NS:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@contextmanager
def delaying(
    program: Path, tmp: Path, ns: str, delay_us: int, jitter_us: int = 0, seed: int = 1
) -> Iterator[dict]:
    """A delayer on ``ns``'s ingress for the block. Yields a dict that holds, after the block,
    the delayer's stats and its CPU seconds (``cpu_s``)."""
    stats_path, pidfile = tmp / f"{ns}.stats.json", tmp / f"{ns}.pid"
    stats_path.unlink(missing_ok=True)
    cmd = delayer.command(program, QUEUE[ns], delay_us, jitter_us, seed, pidfile, stats_path)
    proc = subprocess.Popen([*_ns(ns), *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    rule = delayer.rule(IFACE[ns], QUEUE[ns])
    result: dict = {}
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        line = proc.stdout.readline().decode() if ready else ""
        if not delayer.is_ready(line, QUEUE[ns]):
            raise RuntimeError(f"delayer in {ns} did not start: {proc.stderr.read1().decode()}")
        _run(*_ns(ns), "iptables", "-t", "mangle", "-A", *rule)
        yield result
        result["cpu_s"] = _cpu_seconds(proc.pid)
    finally:
        subprocess.run([*_ns(ns), "iptables", "-t", "mangle", "-D", *rule], capture_output=True)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
    result.update(delayer.read_stats(stats_path.read_text()))


def steal_seconds() -> float:
    """CPU time the hypervisor gave to others while this VM wanted it (all CPUs, /proc/stat):
    delays the delayer cannot help, reported per part."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# Echo server in csdbb: answers until b"quit" (or 120 s).
ECHO = textwrap.dedent(f"""
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("{ADDR["csdbb"]}", {ECHO_PORT}))
    s.settimeout(120)
    print("listening", flush=True)
    while (msg := s.recvfrom(64))[0] != b"quit":
        s.sendto(*msg)
""")

# Round trips, printed in ms as JSON. Timed in user space from the send to the reply read (like
# ping -U), or with argv[3] == "kernel" to the kernel's receive stamp of the reply
# (SO_TIMESTAMPNS, like plain ping): that leaves out the client's wake-up, but it is taken before
# PREROUTING, so it misses a delay on the client's own ingress.
PROBE = textwrap.dedent(f"""
    import json, socket, struct, sys, time
    kernel = sys.argv[3] == "kernel"
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, 35, int(kernel))  # SO_TIMESTAMPNS
    s.settimeout(5)
    s.connect(("{ADDR["csdbb"]}", {ECHO_PORT}))
    rtts = []
    for i in range(int(sys.argv[1])):
        t0 = time.time_ns()
        s.send(i.to_bytes(4, "big"))
        _, anc, _, _ = s.recvmsg(64, 64)
        t1 = time.time_ns()
        if kernel:
            sec, ns = struct.unpack("qq", anc[0][2][:16])
            t1 = sec * 10**9 + ns
        rtts.append((t1 - t0) / 1e6)
        time.sleep(float(sys.argv[2]))
    s.send(b"quit")
    print(json.dumps(rtts))
""")


def rtts(count: int, interval_s: float = 0.01, kernel: bool = False) -> list[float]:
    """``count`` UDP round trips csdba -> csdbb -> csdba in ms, ``interval_s`` apart; ``kernel``:
    timed to the reply's kernel receive stamp instead of its read."""
    prio = ["chrt", "-f", str(PROBE_PRIORITY)]
    server = subprocess.Popen(
        [*_ns("csdbb"), *prio, sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout.readline().strip() == "listening"
        stamp = "kernel" if kernel else "user"
        out = _run(
            *_ns("csdba"), *prio, sys.executable, "-c", PROBE, str(count), str(interval_s), stamp
        )
        server.wait(timeout=10)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return json.loads(out)


def mdev(values: list[float]) -> float:
    """ping's mdev: the population standard deviation."""
    return statistics.pstdev(values)


def iperf3(seconds: int, extra: tuple[str, ...] = ()) -> dict:
    """iperf3 csdba -> csdbb (TCP); its JSON result's end section."""
    server = subprocess.Popen(
        [*_ns("csdbb"), "iperf3", "-s", "-1", "-p", str(IPERF_PORT), "-B", ADDR["csdbb"]],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        client = [*_ns("csdba"), "iperf3", "-c", ADDR["csdbb"], "-p", str(IPERF_PORT)]
        out = _run(*client, "-t", str(seconds), "-J", *extra)
        server.wait(timeout=15)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return json.loads(out)["end"]


def part_a(
    program: Path, tmp: Path, delays_ms: list[float], count: int, one_way: bool = False
) -> list[dict]:
    """Added RTT per D: both directions delayed and timed in user space, or (``one_way``) only
    csdbb's ingress delayed and timed to the reply's kernel stamp (what the delayer adds, without
    the client's wake-up)."""
    rows = []
    where = NS[1:] if one_way else NS
    base = rtts(count, kernel=one_way)
    rows.append(
        {
            "D_ms": 0,
            "configured_ms": 0.0,
            "mean_ms": statistics.mean(base),
            "added_ms": 0.0,
            "median_ms": statistics.median(base),
            "median_added_ms": 0.0,
            "mdev_ms": mdev(base),
            "late_mean_us": None,
            "late_p99_us": None,
        }
    )
    for d_ms in delays_ms:
        with ExitStack() as stack:
            stats = [
                stack.enter_context(delaying(program, tmp, ns, round(d_ms * 1000))) for ns in where
            ]
            got = rtts(count if d_ms <= 10 else max(20, count // 2), kernel=one_way)
        lates = [s["late_us"] for s in stats]
        rows.append(
            {
                "D_ms": d_ms,
                "configured_ms": len(where) * d_ms,
                "mean_ms": statistics.mean(got),
                "added_ms": statistics.mean(got) - rows[0]["mean_ms"],
                "median_ms": statistics.median(got),
                "median_added_ms": statistics.median(got) - rows[0]["median_ms"],
                "mdev_ms": mdev(got),
                "late_mean_us": statistics.mean(late["mean"] for late in lates),
                "late_p99_us": max(late["p99"] for late in lates),
                "kernel_stamped": all(s["kernel_stamped"] == s["packets"] for s in stats),
            }
        )
    return rows


def ping(count: int = 100, user: bool = True) -> dict:
    """iputils ping csdba -> csdbb, 10 ms apart: its min/avg/max/mdev in ms. ``user``: -U."""
    flags = ["-U"] if user else []
    out = _run(*_ns("csdba"), "ping", *flags, "-q", "-c", str(count), "-i", "0.01", ADDR["csdbb"])
    summary = out.strip().splitlines()[-1].split("=")[1].split()[0]
    return dict(zip(("min", "avg", "max", "mdev"), map(float, summary.split("/")), strict=True))


def part_ping(program: Path, tmp: Path, delays_ms: list[float]) -> list[dict]:
    """The cross-check with iputils ping where it is installed: -U with both directions
    delayed, and plain ping (kernel receive stamp) with only csdbb's ingress delayed."""
    rows = [{"D_ms": 0, "both_U": ping(), "one_kernel": ping(user=False)}]
    for d_ms in delays_ms:
        with ExitStack() as stack:
            for ns in NS:
                stack.enter_context(delaying(program, tmp, ns, round(d_ms * 1000)))
            both = ping()
        with delaying(program, tmp, "csdbb", round(d_ms * 1000)):
            one = ping(user=False)
        rows.append({"D_ms": d_ms, "both_U": both, "one_kernel": one})
    return rows


def part_b(program: Path, tmp: Path, count: int) -> dict:
    d_us, j_us = 10_000, 2_000
    with ExitStack() as stack:
        stats = [
            stack.enter_context(delaying(program, tmp, ns, d_us, j_us, seed=i + 1))
            for i, ns in enumerate(NS)
        ]
        got = rtts(count)
    return {
        "D_ms": d_us / 1000,
        "J_ms": j_us / 1000,
        "mean_ms": statistics.mean(got),
        "std_ms": statistics.stdev(got),
        "expected_std_ms": math.sqrt(2 * (j_us / 1000) ** 2 / 3),
        "min_ms": min(got),
        "max_ms": max(got),
        "clamped": sum(s["clamped"] for s in stats),
    }


def part_c(program: Path, tmp: Path, seconds: int) -> list[dict]:
    rows = []
    end = iperf3(seconds)
    rows.append({"delay_ms": None, "goodput_mbit": end["sum_received"]["bits_per_second"] / 1e6})
    for d_us in (1000, 10_000):
        with delaying(program, tmp, "csdbb", d_us) as st:
            end = iperf3(seconds)
        rows.append(
            {
                "delay_ms": d_us / 1000,
                "goodput_mbit": end["sum_received"]["bits_per_second"] / 1e6,
                "retransmits": end["sum_sent"].get("retransmits"),
                "pps": st["packets"] / st["elapsed_s"],
                "pps_during_transfer": st["packets"] / seconds,
                "cpu_share": st["cpu_s"] / st["elapsed_s"],
                "spin_s": st["spin_s"],
                "late_us": st["late_us"],
                "held_max": st["held_max"],
                "enobufs": st["enobufs"],
                "missed": st["missed"],
                "overflow": st["overflow"],
                "packets": st["packets"],
            }
        )
    return rows


def busy_cores() -> float:
    """Non-idle CPU seconds of the whole machine so far (all cores, /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def part_d(program: Path, tmp: Path, seconds: int) -> dict:
    """TCP through tbf + delay on both sides; the machine's busy CPU during the transfer, with
    and without the delayers (the delayers' own CPU share also holds the receive path that
    their verdicts run, which softirq would do otherwise)."""
    rate = 50_000_000
    burst = tbf_burst_bytes(rate, 1500, offload=False)
    tbf = ["tbf", "rate", f"{rate}bit", "burst", str(burst), "latency", f"{TBF_LATENCY_MS}ms"]
    for ns in NS:
        _run("tc", "-n", ns, "qdisc", "replace", "dev", IFACE[ns], "root", *tbf)
    try:
        busy, t0 = busy_cores(), time.monotonic()
        plain = iperf3(seconds)
        busy_plain = (busy_cores() - busy) / (time.monotonic() - t0)
        with ExitStack() as stack:
            stats = [stack.enter_context(delaying(program, tmp, ns, 20_000)) for ns in NS]
            busy, t0 = busy_cores(), time.monotonic()
            end = iperf3(seconds)
            busy_delayed = (busy_cores() - busy) / (time.monotonic() - t0)
        cc = _run(*_ns("csdba"), "sysctl", "-n", "net.ipv4.tcp_congestion_control").strip()
    finally:
        for ns in NS:
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", IFACE[ns], "root"])
    return {
        "rate_mbit": rate / 1e6,
        "delay_ms_each_way": 20,
        "cc": cc,
        "goodput_mbit": end["sum_received"]["bits_per_second"] / 1e6,
        "goodput_no_delay_mbit": plain["sum_received"]["bits_per_second"] / 1e6,
        "ceiling_mbit": rate / 1e6 * MSS / FRAME,
        "retransmits": end["sum_sent"].get("retransmits"),
        "late_us": [s["late_us"] for s in stats],
        "missed": sum(s["missed"] for s in stats),
        "cpu_share": [s["cpu_s"] / s["elapsed_s"] for s in stats],
        "spin_s": [s["spin_s"] for s in stats],
        "busy_cores_no_delay": busy_plain,
        "busy_cores_delayed": busy_delayed,
    }


def _print_a(rows: list[dict]) -> None:
    print(
        f"{'D ms':>6} {'conf ms':>7} {'RTT ms':>8} {'added':>8} {'err us':>7} {'med err':>7}"
        f" {'mdev ms':>8}",
        end="",
    )
    print(f" {'late us':>8} {'p99 us':>7}")
    for r in rows:
        err = (r["added_ms"] - r["configured_ms"]) * 1000
        med_err = (r["median_added_ms"] - r["configured_ms"]) * 1000
        late = (
            "" if r["late_mean_us"] is None else f"{r['late_mean_us']:8.1f} {r['late_p99_us']:7.0f}"
        )
        print(
            f"{r['D_ms']:6g} {r['configured_ms']:7g} {r['mean_ms']:8.3f} {r['added_ms']:8.3f}"
            f" {err:7.0f} {med_err:7.0f} {r['mdev_ms']:8.3f} {late}"
        )


def _print_tables(result: dict) -> None:
    print("\n(a1) delay on csdbb's ingress only, RTT to the reply's kernel receive stamp")
    _print_a(result["a1"])
    print("\n(a) delay on both directions, UDP RTT timed in user space (ping -U)")
    _print_a(result["a"])
    if "ping" in result:
        base = result["ping"][0]
        print("\n(ping) iputils ping, 100 x 10 ms apart: added avg vs configured, mdev")
        print(f"{'D ms':>6} {'-U both ways':>13} {'err us':>7} {'mdev':>6}", end="")
        print(f" {'one way':>9} {'err us':>7} {'mdev':>6}")
        for r in result["ping"][1:]:
            both = r["both_U"]["avg"] - base["both_U"]["avg"]
            one = r["one_kernel"]["avg"] - base["one_kernel"]["avg"]
            print(
                f"{r['D_ms']:6g} {both:13.3f} {(both - 2 * r['D_ms']) * 1000:7.0f}"
                f" {r['both_U']['mdev']:6.3f} {one:9.3f} {(one - r['D_ms']) * 1000:7.0f}"
                f" {r['one_kernel']['mdev']:6.3f}"
            )
    b = result["b"]
    print(f"\n(b) jitter: D {b['D_ms']} ms +- {b['J_ms']} ms uniform, both directions")
    print(f"  RTT mean {b['mean_ms']:.3f} ms, std {b['std_ms']:.3f} ms", end="")
    print(
        f" (uniform expects {b['expected_std_ms']:.3f}), range {b['min_ms']:.2f}-{b['max_ms']:.2f}"
    )
    print(f"  FIFO clamps: {b['clamped']}")
    print("\n(c) capacity: iperf3 TCP through one delayer (MTU frames)")
    print(
        f"{'D ms':>6} {'Mbit/s':>8} {'kpps':>7} {'CPU':>6} {'spin s':>7} {'late mean':>9}", end=""
    )
    print(f" {'p50':>5} {'p99':>6} {'max us':>8} {'held':>6} {'missed':>6} {'enobufs':>7}")
    for r in result["c"]:
        if r["delay_ms"] is None:
            print(f"{'none':>6} {r['goodput_mbit']:8.0f}")
            continue
        late = r["late_us"]
        print(
            f"{r['delay_ms']:6g} {r['goodput_mbit']:8.0f} {r['pps_during_transfer'] / 1e3:7.0f}"
            f" {r['cpu_share']:6.0%} {r['spin_s']:7.3f} {late['mean']:9.1f} {late['p50']:5.0f}"
            f" {late['p99']:6.0f} {late['max']:8.0f} {r['held_max']:6d} {r['missed']:6d}"
            f" {r['enobufs']:7d}"
        )
    d = result["d"]
    print(
        f"\n(d) TCP ({d['cc']}) through tbf {d['rate_mbit']:g} Mbit/s + {d['delay_ms_each_way']} ms"
    )
    print(
        f"  each way: goodput {d['goodput_mbit']:.2f} Mbit/s (ceiling {d['ceiling_mbit']:.2f}),",
        end="",
    )
    print(f" retransmits {d['retransmits']}, missed {d['missed']}")
    print(
        f"  machine busy during the transfer: {d['busy_cores_delayed']:.2f} cores with the"
        f" delayers, {d['busy_cores_no_delay']:.2f} with tbf only"
        f" ({d['goodput_no_delay_mbit']:.2f} Mbit/s)"
    )
    for ns, late, cpu, spin in zip(NS, d["late_us"], d["cpu_share"], d["spin_s"], strict=True):
        print(f"  delayer in {ns}: CPU {cpu:.1%} (spinning {spin:.3f} s), late {late}")
    steal = ", ".join(f"{k} {v:.2f} s" for k, v in result["steal_s"].items())
    print(f"\nCPU time stolen by the hypervisor per part: {steal}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", default="1,5,10,20,50", help="D values of (a), ms")
    parser.add_argument("--count", type=int, default=200, help="round trips per D in (a)")
    parser.add_argument("--jitter-count", type=int, default=400, help="round trips in (b)")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces, iptables, SCHED_FIFO)")
    program = delayer.binary()
    result: dict = {"program": str(program)}
    with TemporaryDirectory(prefix="csd-bench-") as tmp, veth_pair():
        delays = [float(x) for x in args.delays.split(",")]
        parts = {
            "a1": lambda: part_a(program, Path(tmp), delays, args.count, one_way=True),
            "a": lambda: part_a(program, Path(tmp), delays, args.count),
            "b": lambda: part_b(program, Path(tmp), args.jitter_count),
            "c": lambda: part_c(program, Path(tmp), 5),
            "d": lambda: part_d(program, Path(tmp), 10),
        }
        if shutil.which("ping"):
            parts["ping"] = lambda: part_ping(program, Path(tmp), delays)
        result["steal_s"] = {}
        for name, part in parts.items():
            steal = steal_seconds()
            result[name] = part()
            result["steal_s"][name] = steal_seconds() - steal
    _print_tables(result)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
