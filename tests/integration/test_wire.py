"""The in-kernel wire accounting (commscope.node.wire) on the emulated cluster: byte-exact
against the interface counters, unshaped and behind a cap, never in the shaper's way, and
leaving nothing attached."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from commscope.cluster.hosts import Cluster, Host
from commscope.cluster.shaping import qdisc_stats, shaped
from commscope.experiment.readiness import check_nodes
from commscope.node.wire import build_object, ring_slots
from commscope.spec.link import LinkShape
from commscope.spec.settings import RunSettings

pytestmark = pytest.mark.integration

BIN_NS = 100_000
IPERF_PORT = 5213


@pytest.fixture(scope="module")
def wire_object(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_object(BIN_NS, ring_slots(BIN_NS), 3, tmp_path_factory.mktemp("bpf"))


def _ns(cluster: Cluster, i: int) -> list[str]:
    return ["ip", "netns", "exec", str(cluster.nodes[i].netns)]


@contextmanager
def _accounting(cluster: Cluster, i: int, obj: Path, out: Path) -> Iterator[Path]:
    """The accounting running on node ``i`` for the block; yields the meta file it writes."""
    node = cluster.nodes[i]
    peers = ",".join(n.exp_addr for n in cluster.nodes)
    meta, log = out / f"wire{i}.json", out / f"wire{i}.log"
    cmd = [*_ns(cluster, i), sys.executable, "-m", "commscope.node.wire", "run"]
    cmd += ["--iface", node.exp_iface, "--obj", str(obj), "--bin-ns", str(BIN_NS)]
    cmd += ["--slots", str(ring_slots(BIN_NS)), "--peers", peers, "--max-seconds", "60"]
    cmd += ["--out", str(out / f"wire{i}.parquet"), "--meta", str(meta)]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stderr=fh)
    try:
        for _ in range(200):
            if "attached" in log.read_text() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert "attached" in log.read_text(), log.read_text()
        yield meta
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()


def _filters(cluster: Cluster, i: int, hook: str) -> list[dict]:
    dev = cluster.nodes[i].exp_iface
    out = subprocess.run(
        [*_ns(cluster, i), "tc", "-j", "filter", "show", "dev", dev, hook],
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out) if out.strip() else []


def _iperf3(cluster: Cluster, seconds: float) -> None:
    server = subprocess.Popen(
        [
            *_ns(cluster, 1),
            "iperf3",
            "-s",
            "-1",
            "-p",
            str(IPERF_PORT),
            "-B",
            cluster.nodes[1].exp_addr,
        ],  # fmt: skip
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        subprocess.run(
            [
                *_ns(cluster, 0),
                "iperf3",
                "-c",
                cluster.nodes[1].exp_addr,
                "-p",
                str(IPERF_PORT),
                "-t",
                str(seconds),
            ],  # fmt: skip
            check=True,
            capture_output=True,
        )
    finally:
        server.wait(timeout=10)


@pytest.mark.parametrize("bw", ["none", "100mbit"])
def test_bpf_totals_equal_the_interface_counters_to_the_byte(
    netns_cluster: Cluster, hosts: list[Host], wire_object: Path, tmp_path: Path, bw: str
) -> None:
    shape = LinkShape.parse(bw)
    with shaped(hosts, shape):
        with (
            _accounting(netns_cluster, 0, wire_object, tmp_path) as meta0,
            _accounting(netns_cluster, 1, wire_object, tmp_path) as meta1,
        ):
            time.sleep(0.3)  # quiet edges: nothing in flight when the counters are read
            _iperf3(netns_cluster, 2)
            time.sleep(0.5)
        ifb_sent = sum(q["bytes"] for q in qdisc_stats(hosts[1]) if q["dev"] == "ifb0")
    for i, path in enumerate((meta0, meta1)):
        meta = json.loads(path.read_text())
        delta = {
            k: meta["counters_end"][k] - meta["counters_start"][k] for k in meta["counters_end"]
        }
        totals = meta["totals"]
        print(f"node{i} {bw}: bpf {totals}, /proc/net/dev {delta}")
        # What arrived, after every shaper: equal to the byte and the frame, but for a packet
        # (an ARP probe) crossing in the instant between the attach or detach and the counters'
        # read, which the outer bracket holds.
        outer = meta["counters_outer"]
        for field in ("bytes", "packets"):
            wide = outer["after_detach"][f"rx_{field}"] - outer["before_attach"][f"rx_{field}"]
            assert delta[f"rx_{field}"] <= totals["ingress"][field] <= wide
        # What left: TCP's GSO packets counted as the frames they become. Egress is counted
        # before the tbf (which may drop what it cannot queue) and before the veth (which drops
        # a frame the peer's backlog has no room for, unshaped at Gbit/s on 2 cores).
        if shape.rate_bps is None:
            assert totals["egress"]["packets"] == delta["tx_packets"] + delta["tx_dropped"]
            if delta["tx_dropped"] == 0:
                assert totals["egress"]["bytes"] == delta["tx_bytes"]
        assert totals["egress"]["bytes"] >= delta["tx_bytes"]
        assert meta["overruns"] == {"ingress": 0, "egress": 0}
        # Detached: the prio-1 filters are gone from both hooks.
        assert not [f for f in _filters(netns_cluster, i, "ingress") if f.get("pref") == 1]
        assert not [f for f in _filters(netns_cluster, i, "egress") if f.get("pref") == 1]
    bins = pd.read_parquet(tmp_path / "wire1.parquet")
    received = bins[(bins["hook"] == "ingress") & (bins["peer"] == netns_cluster.nodes[0].exp_addr)]
    assert received["bytes"].sum() > 10_000_000  # the transfer, attributed to its sender
    if shape.rate_bps:
        # The accounting returns "no verdict": the shaper's redirect behind it still ran.
        assert ifb_sent > 0.9 * received["bytes"].sum()
        # And the link was capped: 10 ms bins of the busy second stay near the cap.
        t = received["t_ns"].to_numpy() // 10_000_000
        per10 = pd.Series(received["bytes"].to_numpy()).groupby(t).sum().to_numpy()
        busy = per10[1:-1] * 8 / 0.01
        assert np.median(busy) == pytest.approx(shape.rate_bps, rel=0.1)


def test_check_says_why_it_cannot_attach(netns_cluster: Cluster, tmp_path: Path) -> None:
    bogus = tmp_path / "not-an-object.o"
    bogus.write_bytes(b"\0" * 64)
    res = subprocess.run(
        [
            *_ns(netns_cluster, 0),
            sys.executable,
            "-m",
            "commscope.node.wire",
            "check",
            "--iface",
            netns_cluster.nodes[0].exp_iface,
            "--obj",
            str(bogus),
        ],  # fmt: skip
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1
    assert "tc filter replace" in res.stdout  # names the step that failed, with tc's answer
    assert not _filters(netns_cluster, 0, "egress")


def test_check_nodes_says_what_each_node_lacks(
    hosts: list[Host], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`commscope check --nodes`: every node of the netns cluster is ready; without clang on
    the orchestrator every node is told why the BPF source will fall back."""
    assert check_nodes(hosts, RunSettings()) == {h.name: [] for h in hosts}
    monkeypatch.setenv("BPF_CLANG", "/nonexistent/clang")
    found = check_nodes(hosts, RunSettings(wire_bin_us=50))  # a new object must be built
    for problems in found.values():
        assert len(problems) == 1 and "/nonexistent/clang not found" in problems[0]
    assert check_nodes(hosts, RunSettings(wire="counters")) == {h.name: [] for h in hosts}
