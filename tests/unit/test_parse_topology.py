"""The parse stage on a cell placed over a leaf-spine's racks with a node link of its own."""

from __future__ import annotations

from commscope.cell.parse import _cell_local_nodes, _own_rates, node_rates
from commscope.metrics.fidelity import delayer_lateness

# A 2-node cell spread over the racks: the cluster's node0 and node2 are its nodes 0 and 1;
# node2's link is overridden to 100 Mbit/s in a 200 Mbit/s cell.
RUN = {
    "shape": {"rate_bps": 200_000_000, "delay_ms": 5.0},
    "nodes": [{"name": "node0", "index": 0}, {"name": "node2", "index": 1}],
    "node_shapes": {"node2": {"rate_bps": 100_000_000, "delay_ms": 5.0}},
}


def test_each_node_gets_its_own_rate_by_its_cell_index() -> None:
    assert node_rates(RUN) == {0: 200_000_000, 1: 100_000_000}
    assert _own_rates(RUN, 200_000_000) == {"0": 200_000_000, "1": 100_000_000}
    # No override, or one at the cell's rate: nothing per node.
    assert _own_rates({**RUN, "node_shapes": None}, 200_000_000) is None
    same = {**RUN, "node_shapes": {"node2": {"rate_bps": 200_000_000}}}
    assert _own_rates(same, 200_000_000) is None


def test_the_link_record_is_keyed_by_the_cells_node_index() -> None:
    late = {"late_us": {"p99": 50.0}, "released": 10, "delay_us": 5000}
    engine = {"engine": "nfqueue", "nodes": {"node0": {"delayer": late}, "node2": {}}}
    local = _cell_local_nodes(engine, RUN["nodes"])
    assert local == {"engine": "nfqueue", "nodes": {"node0": {"delayer": late}, "node1": {}}}
    # The fidelity table then reads node 2's delayer as the cell's node 1, not as node 2.
    shifted = {**engine, "nodes": {"node2": {"delayer": late}}}
    assert set(delayer_lateness(_cell_local_nodes(shifted, RUN["nodes"]))) == {1}
    assert _cell_local_nodes(None, RUN["nodes"]) is None
