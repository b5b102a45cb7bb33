"""The NFQUEUE delayer (commscope.node.delayer) between two throwaway namespaces: it builds, adds
its delay to a round trip, releases everything it holds on SIGTERM, never reorders under jitter,
and refuses bad arguments and a taken queue."""

from __future__ import annotations

import json
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
from contextlib import contextmanager
from pathlib import Path

import pytest

from commscope.node import delayer
from commscope.node.native import BuildError

pytestmark = pytest.mark.integration

# Names start with csd (this test's own), addresses from a block no cluster of the suite uses.
NS_A, NS_B = "csdta", "csdtb"
IF_A, IF_B = "csdta0", "csdtb0"
ADDR_A, ADDR_B = "10.231.7.1", "10.231.7.2"
PORT = 9917
QUEUE = 7
# SCHED_FIFO priority of the round-trip probes: below the delayer's 10, above everything else.
PROBE_PRIORITY = 5


def _ns(ns: str) -> list[str]:
    return ["ip", "netns", "exec", ns]


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("iptables") is None:
        pytest.skip("needs iptables (Debian package iptables) for the NFQUEUE rule")
    if not delayer.HEADER.exists():
        pytest.skip(f"needs {delayer.HEADER}: install the Debian package libnetfilter-queue-dev")
    return delayer.binary(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def pair(program: Path) -> Iterator[None]:
    """Namespaces NS_A and NS_B joined by a veth pair; deleted (with their rules) at the end."""
    for ns in (NS_A, NS_B):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # left by a crash
    try:
        for ns in (NS_A, NS_B):
            _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", IF_A, "netns", NS_A, "type", "veth", "peer", IF_B, "netns", NS_B)
        for ns, dev, addr in ((NS_A, IF_A, ADDR_A), (NS_B, IF_B, ADDR_B)):
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        yield
    finally:
        for ns in (NS_A, NS_B):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@contextmanager
def _delaying(
    program: Path, tmp: Path, delay_us: int, jitter_us: int = 0, queue: int = QUEUE
) -> Iterator[list[dict]]:
    """The delayer on NS_B's ingress for the block, started and stopped in the order the lead's
    shaping uses (rule after "ready", rule gone before SIGTERM); yields a list that receives
    its stats after the block."""
    stats_path, pidfile = tmp / f"stats{queue}.json", tmp / f"pid{queue}"
    cmd = delayer.command(program, queue, delay_us, jitter_us, 7, pidfile, stats_path)
    proc = subprocess.Popen([*_ns(NS_B), *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    rule = delayer.rule(IF_B, queue)
    out: list[dict] = []
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        line = proc.stdout.readline().decode() if ready else ""
        assert delayer.is_ready(line, queue), (line, proc.stderr.read1().decode())
        assert int(pidfile.read_text()) == proc.pid  # ip netns exec execs the program
        _run(*_ns(NS_B), "iptables", "-t", "mangle", "-A", *rule)
        yield out
    finally:
        subprocess.run([*_ns(NS_B), "iptables", "-t", "mangle", "-D", *rule], capture_output=True)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err.decode()
    out.append(delayer.read_stats(stats_path.read_text()))


# Echo server; it answers until it gets b"quit" or 20 s pass.
ECHO = textwrap.dedent(f"""
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("{ADDR_B}", {PORT}))
    s.settimeout(20)
    print("listening", flush=True)
    while (msg := s.recvfrom(64))[0] != b"quit":
        s.sendto(*msg)
""")

# Round trips to the echo server, each timed from just before the send to the kernel's receive
# stamp of the reply (SO_TIMESTAMPNS): the reply is not delayed, so this stamp comes after the
# delay, and the client's own wake-up is not counted. Prints the RTTs in ms as JSON.
PROBE = textwrap.dedent(f"""
    import json, socket, struct, sys, time
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, 35, 1)  # SO_TIMESTAMPNS
    s.settimeout(2)
    s.connect(("{ADDR_B}", {PORT}))
    rtts = []
    for i in range(int(sys.argv[1])):
        t0 = time.time_ns()
        s.send(i.to_bytes(4, "big"))
        _, anc, _, _ = s.recvmsg(64, 64)
        sec, ns = struct.unpack("qq", anc[0][2][:16])
        rtts.append((sec * 10**9 + ns - t0) / 1e6)
        time.sleep(0.01)
    s.send(b"quit")
    print(json.dumps(rtts))
""")

# Counts UDP datagrams carrying 4-byte sequence numbers until `n` came or 3 s pass without one;
# prints them in arrival order as JSON.
SINK = textwrap.dedent(f"""
    import json, socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE: hold a whole burst
    s.bind(("{ADDR_B}", {PORT}))
    s.settimeout(3)
    print("listening", flush=True)
    seen = []
    try:
        while len(seen) < int(sys.argv[1]):
            seen.append(int.from_bytes(s.recv(64)[:4], "big"))
    except TimeoutError:
        pass
    print(json.dumps(seen))
""")

# Sends `n` sequence-numbered datagrams back to back (no pacing: a dense burst).
BURST = textwrap.dedent(f"""
    import socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("{ADDR_B}", {PORT}))
    for i in range(int(sys.argv[1])):
        s.send(i.to_bytes(4, "big") + bytes(60))
""")


@contextmanager
def _listening(code: str, *args: str, rt: bool = False) -> Iterator[subprocess.Popen]:
    """A Python snippet running in NS_B once it printed "listening"; killed if still running.
    ``rt``: at real-time priority (below the delayer's), so other load on the machine cannot
    keep it from answering."""
    prio = ["chrt", "-f", str(PROBE_PRIORITY)] if rt else []
    proc = subprocess.Popen(
        [*_ns(NS_B), *prio, sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "listening"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _rtts(n: int) -> list[float]:
    with _listening(ECHO, rt=True) as server:
        out = subprocess.run(
            [*_ns(NS_A), "chrt", "-f", str(PROBE_PRIORITY), sys.executable, "-c", PROBE, str(n)],
            capture_output=True,
            text=True,
            check=True,
        )
        server.wait(timeout=10)
    return json.loads(out.stdout)


def test_build_is_cached_and_the_cli_prints_the_path(program: Path, tmp_path: Path) -> None:
    assert os.access(program, os.X_OK)
    assert delayer.binary(program.parent) == program  # the same source: no rebuild
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    cli = [sys.executable, "-m", "commscope.node.delayer", "build"]
    for _ in range(2):  # first builds, then the fast path
        res = subprocess.run(cli, capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stderr
        built = Path(res.stdout.strip())
        assert built.parent == tmp_path / "commscope" and os.access(built, os.X_OK)


def test_build_errors_name_the_package_to_install(tmp_path: Path) -> None:
    header = "delayer.c:40:10: fatal error: libnetfilter_queue/libnetfilter_queue.h: No such file"
    link = "/usr/bin/ld: cannot find -lnetfilter_queue: No such file or directory"
    for output in (header, link):
        message = delayer._explain(BuildError("cc failed", "build", output))
        assert "libnetfilter-queue-dev" in message
    no_cc = delayer._explain(BuildError("no C compiler (cc, gcc) on PATH", "compiler"))
    assert "gcc" in no_cc
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "CC": "csd-no-such-compiler"}
    res = subprocess.run(
        [sys.executable, "-m", "commscope.node.delayer", "build"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 1 and "install a C compiler" in res.stderr and not res.stdout


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--queue", "1", "--delay-us", "5", "--pidfile", "p"],  # no --stats
        ["--queue", "70000", "--delay-us", "5", "--pidfile", "p", "--stats", "s"],
        ["--queue", "1", "--delay-us", "-5", "--pidfile", "p", "--stats", "s"],
        ["--queue", "1", "--delay-us", "5ms", "--pidfile", "p", "--stats", "s"],
        ["--queue", "1", "--delay-us", "5", "--maxlen", "0", "--pidfile", "p", "--stats", "s"],
        ["--queue", "1", "--delay-us", "5", "--pidfile", "p", "--stats", "s", "extra"],
        ["--queue", "1", "--delay", "5", "--pidfile", "p", "--stats", "s"],  # a mere prefix
    ],
)
def test_bad_arguments_exit_2_with_usage(program: Path, tmp_path: Path, args: list[str]) -> None:
    # (a timeout: a bad argument taken for a good one would bind a queue and wait for SIGTERM)
    res = subprocess.run(
        [str(program), *args], capture_output=True, text=True, cwd=tmp_path, timeout=10
    )
    assert res.returncode == 2 and "usage:" in res.stderr
    assert not list(tmp_path.iterdir())  # wrote nothing


def test_a_taken_queue_exits_1_naming_it(program: Path, pair: None, tmp_path: Path) -> None:
    with _delaying(program, tmp_path, 1000):
        second = delayer.command(program, QUEUE, 1000, 0, 1, tmp_path / "p2", tmp_path / "s2")
        res = subprocess.run([*_ns(NS_B), *second], capture_output=True, text=True, timeout=10)
        assert res.returncode == 1 and f"NFQUEUE {QUEUE}" in res.stderr
        assert not (tmp_path / "p2").exists()


def test_one_direction_delay_adds_d_to_the_round_trip(
    program: Path, pair: None, tmp_path: Path
) -> None:
    base = _rtts(150)
    with _delaying(program, tmp_path, 5000) as stats:
        delayed = _rtts(150)
    added = statistics.mean(delayed) - statistics.mean(base)
    assert abs(added - 5.0) <= 0.2, (added, statistics.mean(base), stats)
    st = stats[0]
    # every probe (and the quit) was held and released on time, none let through undelayed
    assert st["released"] == st["packets"] >= 151 and st["flushed"] == 0
    assert st["overflow"] == st["missed"] == st["enobufs"] == 0
    assert st["late_us"]["p50"] < 1000 and st["kernel_stamped"] == st["packets"]


def test_sigterm_with_packets_held_loses_none(program: Path, pair: None, tmp_path: Path) -> None:
    n = 500
    with _listening(SINK, str(n)) as sink:
        with _delaying(program, tmp_path, 200_000) as stats:
            subprocess.run([*_ns(NS_A), sys.executable, "-c", BURST, str(n)], check=True)
            time.sleep(0.05)  # well inside the 200 ms: all of the burst is still held
        out, _ = sink.communicate(timeout=10)
    assert json.loads(out) == list(range(n))  # all arrived, in order
    st = stats[0]
    assert st["packets"] == n and st["flushed"] == n and st["released"] == 0
    assert st["held_max"] == n and st["exit_signal"] == signal.SIGTERM


def test_jitter_clamps_instead_of_reordering(program: Path, pair: None, tmp_path: Path) -> None:
    n = 3000
    with (
        _listening(SINK, str(n)) as sink,
        _delaying(program, tmp_path, 5000, jitter_us=4000) as stats,
    ):
        subprocess.run([*_ns(NS_A), sys.executable, "-c", BURST, str(n)], check=True)
        out, _ = sink.communicate(timeout=10)
    assert json.loads(out) == list(range(n))
    st = stats[0]
    # Jitter of +-4 ms on packets microseconds apart would reorder most of them: the FIFO
    # clamp pushed those due times instead.
    assert st["packets"] == st["released"] == n and st["clamped"] > n // 4
    assert st["jitter_us"] == 4000 and st["missed"] == st["overflow"] == 0
