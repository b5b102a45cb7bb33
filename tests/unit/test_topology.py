"""The topology block: validation that names the key and the fix, and the fabric's plan."""

from __future__ import annotations

import pytest

from commscope.spec.link import LinkShape
from commscope.spec.settings import ClusterSettings
from commscope.spec.topology import Topology

LEAF_SPINE = {"kind": "leaf-spine", "racks": 2, "nodes_per_rack": 2, "spines": 2}
ADDRS = ["198.19.0.2", "198.19.0.3", "198.19.0.4", "198.19.0.5"]


def test_no_block_is_the_flat_network_of_old_configs() -> None:
    topo = ClusterSettings.from_mapping({}).topology
    assert topo == Topology() and not topo.leaf_spine
    assert topo.capacity is None and topo.routers() == [] and topo.fabric_links() == []
    assert topo.rack_of(7) == 0
    assert topo.describe() == "one switch (flat)"


def test_a_leaf_spine_plans_racks_links_and_routes() -> None:
    topo = Topology.from_mapping({**LEAF_SPINE, "uplink_bw": "500mbit"})
    assert [topo.rack_of(i) for i in range(4)] == [0, 0, 1, 1]
    assert topo.routers() == ["leaf0", "leaf1", "spine0", "spine1"]
    links = {link.name: link for link in topo.fabric_links()}
    assert len(links) == 4 + 2 * 2  # a link per node, an uplink per leaf and spine
    assert links["node3"].a == ("node3", "exp0") and links["node3"].b == ("leaf1", "n3")
    assert links["leaf0-spine1"].a == ("leaf0", "u1") and links["leaf0-spine1"].b == (
        "spine1",
        "d0",
    )
    routes = topo.routes(ADDRS)
    # A leaf reaches its own nodes directly, the other rack's over every spine (ECMP).
    assert routes["leaf0"] == [
        ("198.19.0.2/32", ["n0"]),
        ("198.19.0.3/32", ["n1"]),
        ("198.19.0.4/32", ["u0", "u1"]),
        ("198.19.0.5/32", ["u0", "u1"]),
    ]
    assert routes["spine1"] == [
        ("198.19.0.2/32", ["d0"]),
        ("198.19.0.3/32", ["d0"]),
        ("198.19.0.4/32", ["d1"]),
        ("198.19.0.5/32", ["d1"]),
    ]
    assert topo.uplink_rate_bps(None) == 500_000_000


def test_placement_packs_a_rack_first_or_spreads_over_the_racks() -> None:
    packed = Topology.from_mapping({**LEAF_SPINE, "racks": 3})
    assert packed.place(4) == [0, 1, 2, 3]  # racks 0, 0, 1, 1
    spread = Topology.from_mapping({**LEAF_SPINE, "racks": 3, "placement": "spread"})
    assert spread.place(4) == [0, 2, 4, 1]  # racks 0, 1, 2, 0
    assert [spread.rack_of(i) for i in spread.place(2)] == [0, 1]
    assert Topology().place(3) == [0, 1, 2]
    assert "placement spread" in spread.describe()


def test_the_path_of_a_pair_and_the_links_loads() -> None:
    topo = Topology.from_mapping(LEAF_SPINE)
    assert topo.path(0, 1) == [("node0", "up", 1.0), ("node1", "down", 1.0)]
    assert topo.path(1, 2) == [
        ("node1", "up", 1.0),
        ("leaf0-spine0", "up", 0.5),
        ("leaf1-spine0", "down", 0.5),
        ("leaf0-spine1", "up", 0.5),
        ("leaf1-spine1", "down", 0.5),
        ("node2", "down", 1.0),
    ]
    assert Topology().path(0, 1) == [] and topo.path(2, 2) == []
    # 100 MB node0 -> node2 and 20 MB node1 -> node3 cross the spines; 7 MB stay in rack 0.
    loads = topo.link_loads({(0, 2): 100e6, (1, 3): 20e6, (0, 1): 7e6})
    assert loads[("node0", "up")] == (107e6, 107e6)
    assert loads[("node1", "down")] == (7e6, 7e6)
    # Expected: half of rack 0's 120 MB over each spine; worst: all of it over one.
    assert loads[("leaf0-spine0", "up")] == (60e6, 120e6)
    assert loads[("leaf1-spine1", "down")] == (60e6, 120e6)
    assert ("leaf1-spine0", "up") not in loads  # nothing leaves rack 1


def test_oversubscription_derives_the_uplink_rate_from_the_node_rate() -> None:
    topo = Topology.from_mapping({**LEAF_SPINE, "oversubscription": 2})
    # A rack: 2 nodes x 1 Gbit/s = 2 Gbit/s over 2 uplinks at 2:1 -> 500 Mbit/s each.
    assert topo.uplink_rate_bps(10**9) == 500_000_000
    assert Topology.from_mapping({**LEAF_SPINE, "oversubscription": 1}).uplink_rate_bps(10**9) == (
        10**9
    )
    with pytest.raises(ValueError, match="uncapped: give the cell a bw"):
        topo.uplink_rate_bps(None)
    assert "oversubscription 2:1" in topo.describe()


def test_a_cell_that_does_not_fit_the_racks_is_refused() -> None:
    topo = Topology.from_mapping(LEAF_SPINE)
    topo.check_fits(4)
    with pytest.raises(ValueError, match="2 racks x 2 nodes hold 4 nodes, .* needs 8: raise racks"):
        topo.check_fits(8, "cell x")
    Topology().check_fits(100)  # flat: any number


def test_per_link_overrides_are_checked() -> None:
    topo = Topology.from_mapping(
        {
            **LEAF_SPINE,
            "uplink_bw": "1gbit",
            "links": {"node3": {"bw": "250mbit", "loss": "1%"}, "leaf0-spine1": {"bw": "100mbit"}},
        }
    )
    assert "2 links overridden" in topo.describe()
    # A node's override replaces what it gives of the cell's shape, nothing else.
    cell = LinkShape.parse("1gbit", "5ms", "0ms", "0%", "bbr")
    assert topo.node_shape(3, cell) == LinkShape(250_000_000, 5.0, 0.0, 1.0, "bbr")
    assert topo.node_shape(0, cell) is cell
    # An uplink's override replaces the fabric's rate for that link only.
    rates = topo.uplink_rates(10**9)
    assert rates == {
        "leaf0-spine0": 10**9,
        "leaf0-spine1": 100_000_000,
        "leaf1-spine0": 10**9,
        "leaf1-spine1": 10**9,
    }
    # The block survives cluster.json.
    assert Topology.from_mapping(topo.to_mapping()) == topo


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("leaf-spine", "cluster.topology='leaf-spine': write a mapping"),
        ({"kind": "mesh"}, r"cluster.topology.kind='mesh': use one of flat, leaf-spine"),
        ({"kind": "flat", "racks": 2}, r"\['racks'\] apply to kind: leaf-spine only"),
        ({**LEAF_SPINE, "racks": 1}, "cluster.topology.racks=1: an integer from 2 to 8"),
        ({**LEAF_SPINE, "spines": True}, "cluster.topology.spines=True: an integer"),
        ({**LEAF_SPINE, "rack": 2}, r"cluster.topology: unknown keys \['rack'\]"),
        ({**LEAF_SPINE, "uplink_bw": "1gbps"}, "cluster.topology.uplink_bw: bw='1gbps'"),
        (
            {**LEAF_SPINE, "uplink_bw": "1gbit", "oversubscription": 2},
            "give uplink_bw or oversubscription, not both",
        ),
        ({**LEAF_SPINE, "oversubscription": 0}, "oversubscription=0: a ratio between 0.1"),
        ({**LEAF_SPINE, "ecmp_hash": "l7"}, "ecmp_hash='l7': use l3"),
        ({**LEAF_SPINE, "placement": "random"}, "placement='random': use pack"),
        ({**LEAF_SPINE, "links": ["node0"]}, "cluster.topology.links: write a mapping"),
        (
            {**LEAF_SPINE, "links": {"node4": {"bw": "1mbit"}}},
            "links.node4: no such link in 2 racks x 2 nodes and 2 spines",
        ),
        ({**LEAF_SPINE, "links": {"node0": {}}}, "links.node0: give its shape"),
        (
            {**LEAF_SPINE, "links": {"leaf1-spine0": {"bw": "1mbit", "delay": "1ms"}}},
            r"leaf1-spine0: \['delay'\] on a leaf-spine link are not emulated yet",
        ),
        ({**LEAF_SPINE, "links": {"node0": {"rate": "1mbit"}}}, r"unknown keys \['rate'\]"),
        (
            {**LEAF_SPINE, "links": {"node0": {"loss": "50%"}}},
            "links.node0: loss='50%' must be between 0% and 20%",
        ),
    ],
)
def test_a_bad_block_names_the_key_and_the_fix(block: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClusterSettings.from_mapping({"topology": block})
