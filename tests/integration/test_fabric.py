"""A leaf-spine fabric in namespaces, for real: 2 racks x 2 nodes, 2 spines, L4-hash ECMP.

Routing (hop counts), the ECMP split of many connections over the two spines, tbf caps on the
uplinks bounding cross-rack traffic and not same-rack traffic, and teardown of the routers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from commscope.bench.run import MICROBENCH_MODULE
from commscope.cluster import fabric
from commscope.cluster.hosts import Cluster, Host
from commscope.cluster.netns import provision_netns
from commscope.cluster.teardown import list_netns, teardown_netns
from commscope.contracts import RUN_FILE
from commscope.experiment.cell import run_cell
from commscope.spec.settings import CellSettings, RunSettings, Workload
from commscope.spec.topology import Topology

from .conftest import integration_skip_reason
from .iperf import goodput_bps, iperf3

pytestmark = pytest.mark.integration

NAME = "csfab"
MGMT, EXP = "198.18.230.0/24", "198.19.230.0/24"
TOPO = Topology.from_mapping(
    {"kind": "leaf-spine", "racks": 2, "nodes_per_rack": 2, "spines": 2, "ecmp_hash": "l4"}
)
PORT = 5231
STREAMS = 16  # connections: an all-on-one-spine hash split has probability 2 / 2^16
CAP_BPS = 50_000_000


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path]]:
    reason = integration_skip_reason()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("csfab-state")
    cluster = provision_netns(NAME, 4, state, MGMT, EXP, topology=TOPO)
    try:
        yield cluster, state
    finally:
        teardown_netns(NAME, state)


@pytest.fixture(scope="module")
def hosts(built: tuple[Cluster, Path]) -> Iterator[list[Host]]:
    cluster, _ = built
    hosts = cluster.hosts()
    try:
        yield hosts
    finally:
        for host in hosts:
            host.close()


def _iperf(client: Host, server: Host, streams: int, seconds: int = 2) -> float:
    """Goodput (bit/s) of ``streams`` parallel TCP connections client -> server."""
    return goodput_bps(iperf3(client, server, seconds=seconds, streams=streams, port=PORT))


def _ttl(client: Host, addr: str) -> int:
    out = client.run(f"ping -c1 -W2 {addr}").stdout
    return int(out.split("ttl=")[1].split()[0])


def test_the_cluster_records_its_fabric(built: tuple[Cluster, Path]) -> None:
    cluster, _ = built
    record = cluster.extra["fabric"]
    assert cluster.extra["topology"] == "leaf-spine:2x2:2:l4"
    assert "bridge_exp" not in cluster.extra
    assert set(record["routers"]) == {"leaf0", "leaf1", "spine0", "spine1"}
    assert set(record["links"]) == {"node0", "node1", "node2", "node3", "leaf0-spine0",
                                    "leaf0-spine1", "leaf1-spine0", "leaf1-spine1"}  # fmt: skip
    live = set(list_netns())
    assert {r["ns"] for r in record["routers"].values()} <= live


def test_packets_cross_one_leaf_in_a_rack_and_leaf_spine_leaf_across(hosts: list[Host]) -> None:
    # Replies start at TTL 64 and lose one per router on the way back.
    assert _ttl(hosts[0], hosts[1].spec.exp_addr) == 63
    assert _ttl(hosts[0], hosts[2].spec.exp_addr) == 61
    assert _ttl(hosts[3], hosts[0].spec.exp_addr) == 61


def test_ecmp_spreads_connections_over_both_spines(
    built: tuple[Cluster, Path], hosts: list[Host]
) -> None:
    record = built[0].extra["fabric"]
    uplinks = [f"leaf0-spine{s}" for s in (0, 1)]  # leaf0's sending side of each: "up"
    before = fabric.link_bytes(record)
    goodput = _iperf(hosts[0], hosts[2], STREAMS)
    after = fabric.link_bytes(record)
    sent = [after[link][0] - before[link][0] for link in uplinks]
    assert goodput > 0
    share = min(sent) / sum(sent)
    # Both spines carry data; with 16 connections an L4 hash rarely leaves one under 10 %.
    assert min(sent) > 0 and share > 0.05, sent


def test_uplink_caps_bound_cross_rack_traffic_only(
    built: tuple[Cluster, Path], hosts: list[Host]
) -> None:
    cluster, _ = built
    ports = fabric.uplink_ports(cluster.extra["fabric"])
    assert len(ports) == 8  # 4 links, capped both ways
    try:
        for port in ports:
            fabric.cap_port(port, CAP_BPS, 1500, False)
        across = _iperf(hosts[0], hosts[2], STREAMS, seconds=3)
        within = _iperf(hosts[0], hosts[1], 4, seconds=2)
    finally:
        removed = [fabric.uncap_port(port) for port in ports]
    assert all(removed)
    # Two 50 Mbit/s uplinks in parallel: goodput under their sum (tbf counts frames), and near
    # it when both spines carry connections (the probe of NETWORK.md measured 95.5 Mbit/s).
    assert 0.8 * 2 * CAP_BPS <= across <= 2 * CAP_BPS, across
    # Inside a rack nothing crosses an uplink.
    assert within > 3 * CAP_BPS, within


def test_a_cell_caps_the_uplinks_and_a_nodes_own_link_and_undoes_both(
    built: tuple[Cluster, Path], tmp_path: Path
) -> None:
    """A real cell (the collective microbenchmark on 2 nodes spread over the racks) with the
    uplinks at 50 Mbit/s and node 2's link overridden to 100 Mbit/s: run.json records where
    the nodes ran, the fabric's caps and queues, cross-rack bytes went through them, nothing
    stays shaped."""
    cluster, _ = built
    block = {
        **TOPO.to_mapping(),
        "placement": "spread",
        "uplink_bw": "50mbit",
        "links": {"node2": {"bw": "100mbit"}},
    }
    cluster.extra["topology_block"] = block
    spec = {"ops": ["allreduce"], "sizes": [1 << 20], "budget_s": 0.3, "min_iters": 2,
            "max_iters": 4}  # fmt: skip
    cell = CellSettings(nodes=2, ranks_per_node=1, bw="200mbit")
    run = RunSettings.from_mapping({"timeout_s": 120, "sample_hz": 100, "master_port": 29561})
    raw = run_cell(cluster, cell, Workload(MICROBENCH_MODULE, spec), run, tmp_path / "raw")
    meta = json.loads((raw / RUN_FILE).read_text())
    # Cell nodes 0 and 1 are the cluster's node0 (rack 0) and node2 (rack 1).
    assert meta["placement"] == {"node0": {"node": 0, "rack": 0}, "node2": {"node": 1, "rack": 1}}
    assert [n["index"] for n in meta["nodes"]] == [0, 1]
    assert set(meta["fabric"]["uplink_bps"].values()) == {50_000_000}
    assert meta["node_shapes"]["node2"]["rate_bps"] == 100_000_000
    assert "node0" not in meta["node_shapes"]  # the cell's own shape
    ports = meta["fabric"]["ports"]
    assert len(ports) == 8
    # node0 reaches node2 over the uplink its connections hash to.
    crossed = sum(ports[f"leaf0-spine{s}:lower"]["bytes"] for s in (0, 1))
    assert crossed > 1 << 20, ports
    # Every link's bytes each way: what node0 sent up its link left rack 0 over the uplinks
    # (nothing else in the cell), and arrived down node2's link; node1 and node3 idle.
    links = meta["fabric"]["links"]
    sent = links["node0"]["up"]
    over_spines = sum(links[f"leaf0-spine{s}"]["up"] for s in (0, 1))
    assert sent > 1 << 20
    assert abs(over_spines - sent) <= 0.02 * sent, links
    assert abs(links["node2"]["down"] - sent) <= 0.02 * sent, links
    assert links["node1"]["up"] < 10_000 and links["node3"]["up"] < 10_000, links
    for ends in cluster.extra["fabric"]["links"].values():
        for side in ("lower", "upper"):
            qdisc = fabric._root_qdisc(fabric.Port(*ends[side]))
            assert qdisc is None or qdisc["kind"] != "tbf", (ends[side], qdisc)


def test_teardown_removes_the_routers(built: tuple[Cluster, Path]) -> None:
    cluster, state = built
    routers = {r["ns"] for r in cluster.extra["fabric"]["routers"].values()}
    teardown_netns(NAME, state)
    left = set(list_netns())
    assert not routers & left
    assert not any(ns.startswith(f"cs-{NAME}-") for ns in left)
