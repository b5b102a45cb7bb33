"""Cross-validation: the wire against the recorded ops, per node and direction
(:func:`crosscheck`) and per node pair (:func:`matrix_check`), and its summary per strategy."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from commscope.cell.load import CellTraces
from commscope.collectives.matrix import Placement, positive_int
from commscope.collectives.traffic import (
    DEFAULT_BACKEND,
    HEADER_BYTES_PER_PACKET,
    op_sends,
    protocol_bytes,
)
from commscope.contracts import WIRE_FLOW_COLUMNS, table_file, with_params
from commscope.metrics._common import _op_sends, _shared
from commscope.metrics.counters import wire_counts
from commscope.metrics.sockets import retransmitted_bytes, retransmitted_pair_bytes
from commscope.metrics.window import check_window, ops_in_window

# Largest |unexplained remainder| accepted, as a fraction of the framework-implied bytes, and
# an absolute floor per node, direction and measured step for nodes that move little. Measured
# over the default study and justified in docs/crossvalidation.md.
CROSSCHECK_TOLERANCE = 0.02
CROSSCHECK_FLOOR_BYTES_PER_STEP = 4096

CROSSCHECK_COLUMNS = [
    "node",
    "direction",
    "backend",
    "window_start_ns",
    "window_end_ns",
    "measured_steps",
    "wire_bytes",
    "wire_packets",
    "framework_bytes",
    "ratio",
    "remainder_bytes",
    "remainder_bytes_per_step",
    "header_bytes",
    "protocol_bytes",
    "retrans_bytes",
    "edge_bytes",
    "unexplained_bytes",
    "unexplained_bytes_per_step",
    "unexplained_fraction",
    "tolerance_bytes",
    "passed",
]


def framework_node_bytes(
    ops: pd.DataFrame, backend: str = DEFAULT_BACKEND, ranks_per_node: Any = None
) -> pd.DataFrame:
    """Per node, the bytes its ranks send to and receive from ranks on *other* nodes under
    :func:`op_destinations` (what its experiment interface must carry as payload), and the
    protocol bytes of the messages that carry them: under gloo each message costs its sender
    two 48 B preambles (send-ready notice, data header) and its receiver one (recv-ready
    notice), see :func:`op_messages`; 0 for backends without a message model.

    ``ops`` is one cell's ops, already cut to the window of interest. Traffic between ranks of
    one node goes over loopback and is left out. A rank that cannot be placed counts as
    remote.

    Columns: node, framework_tx_bytes, framework_rx_bytes, protocol_tx_bytes,
    protocol_rx_bytes.
    """
    if ops.empty:
        return pd.DataFrame(columns=_NODE_BYTES_COLUMNS)
    place = Placement.from_ops(ops, ranks_per_node)
    return _node_bytes(_op_sends(ops, backend, with_messages=True), place)


_NODE_BYTES_COLUMNS = [
    "node",
    "framework_tx_bytes",
    "framework_rx_bytes",
    "protocol_tx_bytes",
    "protocol_rx_bytes",
]


def _node_bytes(sends: pd.DataFrame, place: Placement) -> pd.DataFrame:
    """:func:`framework_node_bytes` from the ops' transfers (``op_sends`` with messages)."""
    cols = _NODE_BYTES_COLUMNS
    src = sends["rank"].map(place.node)
    dst = sends["dst_rank"].map(place.node)
    remote = src != dst
    payload = sends["bytes"].where(remote, 0.0)
    messages = sends["messages"].where(remote, 0.0)
    sent, received = messages.groupby(src).sum(), messages.groupby(dst).sum()
    sums = {
        "framework_tx_bytes": payload.groupby(src).sum(),
        "framework_rx_bytes": payload.groupby(dst).sum(),
        "protocol_tx_bytes": protocol_bytes(sent, received),
        "protocol_rx_bytes": protocol_bytes(received, sent),
    }
    nodes = set(place.recorded.values())
    for series in sums.values():
        nodes |= {int(v) for v in series.index}
    nodes = sorted(n for n in nodes if n >= 0)
    out = pd.DataFrame({"node": nodes})
    for col, series in sums.items():
        out[col] = series.reindex(nodes, fill_value=0.0).to_numpy(dtype="float64")
    return out[cols]


def _tolerance_bytes(framework: np.ndarray, steps: int, tolerance: float) -> np.ndarray:
    return np.maximum(tolerance * framework, CROSSCHECK_FLOOR_BYTES_PER_STEP * max(steps, 1))


def _direction_check(
    merged: pd.DataFrame,
    direction: str,
    backend: str,
    window: tuple[int, int],
    n_steps: int,
    tolerance: float,
) -> pd.DataFrame:
    """One direction's rows of :func:`crosscheck` from the merged per-node wire, framework,
    protocol and retransmission bytes."""
    wire_b = merged[f"{direction}_bytes"].astype("float64").to_numpy()
    packets = merged[f"{direction}_packets"].astype("float64").to_numpy()
    fw = merged[f"framework_{direction}_bytes"].astype("float64").to_numpy()
    remainder = wire_b - fw
    headers = HEADER_BYTES_PER_PACKET * packets
    protocol = merged[f"protocol_{direction}_bytes"].astype("float64").to_numpy()
    resent = merged[f"retrans_{direction}_bytes"].astype("float64").to_numpy()
    unexplained = remainder - headers - protocol
    allowed = _tolerance_bytes(fw, n_steps, tolerance)
    edge = merged[f"{direction}_edge_bytes"].astype("float64").to_numpy()
    # A retransmission is wire bytes no op asked for when its original was counted too
    # (lost after the interface: an ingress cap, the receiver's backlog), and none when
    # the original was dropped before it (an egress qdisc): an excess up to it is explained.
    # Bytes the counters saw inside a sample interval straddling an edge can belong to
    # either side: that much either way is not a disagreement, only unresolved.
    within = (unexplained >= -allowed - edge) & (
        unexplained <= allowed + np.nan_to_num(resent) + edge
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(fw > 0, wire_b / fw, np.nan)
        fraction = np.where(fw > 0, unexplained / fw, np.nan)
    return pd.DataFrame(
        {
            "node": merged["node"].astype("int64").to_numpy(),
            "direction": direction,
            "backend": backend,
            "window_start_ns": window[0],
            "window_end_ns": window[1],
            "measured_steps": n_steps,
            "wire_bytes": wire_b,
            "wire_packets": packets,
            "framework_bytes": fw,
            "ratio": ratio,
            "remainder_bytes": remainder,
            "remainder_bytes_per_step": remainder / n_steps,
            "header_bytes": headers,
            "protocol_bytes": protocol,
            "retrans_bytes": resent,
            "edge_bytes": edge,
            "unexplained_bytes": unexplained,
            "unexplained_bytes_per_step": unexplained / n_steps,
            "unexplained_fraction": fraction,
            "tolerance_bytes": allowed,
            "passed": within,
        }
    )


def crosscheck(
    traces: CellTraces,
    tolerance: float = CROSSCHECK_TOLERANCE,
    backend: str | None = None,
) -> pd.DataFrame:
    """Wire bytes against the bytes the recorded ops imply, per node and direction.

    Over the training window (:func:`training_window`: first measured step's start to the
    last step's end), for each node and direction (``tx``, ``rx``):

    * ``wire_bytes``, ``wire_packets``: the interface counters' increase in the window;
    * ``framework_bytes``: payload the ops issued in the window imply for that node under the
      backend's algorithms (:func:`framework_node_bytes`); ``backend`` overrides cell.json's;
    * ``ratio`` = wire / framework; ``remainder_bytes`` = wire - framework (and per measured
      step);
    * ``header_bytes`` = :data:`HEADER_BYTES_PER_PACKET` x packets: every counted packet
      (a GSO super-packet or an ACK) carries one Ethernet+IPv4+TCP header set;
    * ``protocol_bytes``: the backend's per-message framing (gloo: 2 x 48 B preambles per
      message sent, 1 x 48 B per message received, :func:`framework_node_bytes`);
    * ``retrans_bytes``: TCP payload the node's connections to other nodes retransmitted in
      the window (tx) or that other nodes retransmitted to it (rx), from ``sockets.parquet``
      (:func:`retransmitted_bytes`); NaN for runs without socket statistics;
    * ``unexplained_bytes`` = remainder - headers - protocol (and per step),
      ``unexplained_fraction`` = unexplained / framework: what neither the ops nor the
      headers account for (store traffic, retransmissions, ops missing from the trace);
    * ``edge_bytes``: bytes the counters saw in the sample intervals straddling the window
      edges, which interpolation cannot place on either side (:func:`wire_counts`);
    * ``passed``: -``tolerance_bytes`` - edge_bytes <= unexplained <= ``tolerance_bytes`` +
      retrans_bytes + edge_bytes,
      ``tolerance_bytes`` = max(``tolerance`` x framework,
      :data:`CROSSCHECK_FLOOR_BYTES_PER_STEP` x measured steps). A retransmission adds its
      bytes to the counters only when the original was counted too (lost after the
      interface, e.g. at an ingress cap or in the receiver's backlog, or resent spuriously),
      so it explains an excess up to its size and never a shortfall.

    The window is :func:`check_window`'s: the training window with its edges moved to instants
    when no op crossing nodes is in flight (:func:`quiet_window`), ops counted by instance
    (:func:`ops_in_window`).

    A cell without counters or measured steps gives an empty table with these columns.

    Columns: cell params, node, direction, backend, window_start_ns, window_end_ns,
    measured_steps, wire_bytes, wire_packets, framework_bytes, ratio, remainder_bytes,
    remainder_bytes_per_step, header_bytes, protocol_bytes, retrans_bytes, edge_bytes,
    unexplained_bytes, unexplained_bytes_per_step, unexplained_fraction, tolerance_bytes, passed.
    """
    params = traces.params
    empty = pd.DataFrame(columns=[*params, *CROSSCHECK_COLUMNS])
    checked = check_window(traces)
    if checked is None or traces.counters.empty:
        return empty
    window, n_steps = checked
    backend = backend or traces.backend
    sends, place = window_transfers(traces, window, backend)
    framework = (
        _node_bytes(sends, place)
        if sends is not None
        else pd.DataFrame(columns=_NODE_BYTES_COLUMNS)
    )
    wire = wire_counts(traces.counters, window)
    merged = pd.merge(wire, framework, on="node", how="outer").sort_values("node")
    merged = merged.fillna({c: 0.0 for c in merged.columns if c not in ("node", "covered")})
    retrans = retransmitted_bytes(traces.sockets, window)
    merged = merged.merge(retrans, on="node", how="left")
    frames = [
        _direction_check(merged, direction, backend, window, n_steps, tolerance)
        for direction in ("tx", "rx")
    ]
    out = pd.concat(frames, ignore_index=True)
    return with_params(params, out[CROSSCHECK_COLUMNS])


MATRIX_CHECK_COLUMNS = [
    "src_node",
    "dst_node",
    "backend",
    "measured_steps",
    "framework_bytes",
    "wire_bytes",
    "wire_packets",
    "header_bytes",
    "protocol_bytes",
    "wire_payload_bytes",
    "ratio",
    "unexplained_bytes",
    "retrans_bytes",
    "tolerance_bytes",
    "passed",
]


def window_transfers(
    traces: CellTraces, window: tuple[int, int], backend: str
) -> tuple[pd.DataFrame | None, Placement]:
    """The transfers of the ops issued in ``window`` (:func:`ops_in_window`; ``op_sends``
    with messages, None when there is none) and where those ops' ranks run: what crosscheck
    and matrix_check model. Shared inside ``shared_results``, so the ops are cut and modelled
    once and the cut (a copy of nearly every op of a long run) is not kept."""

    def compute() -> tuple[pd.DataFrame | None, Placement]:
        ops = ops_in_window(traces.ops, window)
        place = Placement.from_ops(ops, traces.params.get("ranks_per_node"))
        if ops.empty:
            return None, place
        return op_sends(ops, backend=backend, with_messages=True), place

    key = ("window_transfers", int(window[0]), int(window[1]), backend)
    return _shared(key, (traces, traces.ops), compute)


def _pair_framework_bytes(
    sends: pd.DataFrame | None, place: Placement
) -> tuple[pd.Series, pd.Series]:
    """Per (src_node, dst_node): the payload bytes of the transfers ``sends`` (``op_sends``
    with messages; None for no ops), and the protocol bytes of the messages carrying them
    (both empty for no ops)."""
    framework = protocol = pd.Series(dtype="float64")
    if sends is not None:
        shared = sends  # read-only: assign, not set
        sends = shared.assign(
            src_node=shared["rank"].map(place.node), dst_node=shared["dst_rank"].map(place.node)
        )
        framework = sends.groupby(["src_node", "dst_node"])["bytes"].sum()
        messages = sends.groupby(["src_node", "dst_node"])["messages"].sum()
        # The receiver's recv-ready notice of a message travels the opposite way. Rebuild the
        # index rather than swaplevel(): that swaps the level names too, and aligning by name
        # would put the notices back on the data direction.
        reverse = pd.Series(
            messages.to_numpy(),
            index=pd.MultiIndex.from_arrays(
                [
                    messages.index.get_level_values("dst_node"),
                    messages.index.get_level_values("src_node"),
                ],
                names=["src_node", "dst_node"],
            ),
        )
        protocol = protocol_bytes(messages, reverse)
    return framework, protocol


def matrix_check(
    traces: CellTraces,
    wire_flows: pd.DataFrame,
    tolerance: float = CROSSCHECK_TOLERANCE,
    backend: str | None = None,
) -> pd.DataFrame:
    """The framework-derived node x node matrix against the one measured on the wire.

    ``wire_flows`` is ``trace/wire_flows.parquet`` (the receivers' BPF ingress by sender, one
    row per 100 µs bin and node pair, or the packet headers captured on the experiment
    interfaces in 1 ms bins: ``t_ns`` bin start on the counters' clock, ``src_node``,
    ``dst_node``, ``bytes`` = frame bytes (IP total length + 14 B Ethernet header),
    ``packets``). Over the training window (bins starting inside it), for every
    ordered pair of distinct nodes: ``framework_bytes`` the ops issued in the window send from
    src to dst under the backend's algorithms (:func:`op_destinations`), ``wire_bytes`` and
    ``wire_packets`` captured, ``header_bytes`` = :data:`HEADER_BYTES_PER_PACKET` x packets
    (ACKs for the reverse direction are headers only, so they drop out here),
    ``protocol_bytes`` the backend's message framing (as in :func:`crosscheck`; the window is
    :func:`check_window`'s),
    ``wire_payload_bytes`` = wire - headers, ``ratio`` = payload / framework,
    ``unexplained_bytes`` = payload - protocol - framework and ``passed`` against the same
    tolerance as :func:`crosscheck`. Without captured flows (capture off, an empty file) the
    table is empty with these columns.

    Columns: cell params, src_node, dst_node, backend, measured_steps, framework_bytes,
    wire_bytes, wire_packets, header_bytes, protocol_bytes, wire_payload_bytes, ratio,
    unexplained_bytes, tolerance_bytes, passed.
    """
    params = traces.params
    empty = pd.DataFrame(columns=[*params, *MATRIX_CHECK_COLUMNS])
    checked = check_window(traces)
    if wire_flows is None or wire_flows.empty or checked is None:
        return empty
    window, n_steps = checked
    backend = backend or traces.backend
    wire = _pair_sums(wire_flows, window).rename(
        columns={"bytes": "wire_bytes", "packets": "wire_packets"}
    )
    place = Placement.from_ops(traces.ops, params.get("ranks_per_node"))
    framework, protocol = _pair_framework_bytes(window_transfers(traces, window, backend)[0], place)
    nodes = set(range(positive_int(params.get("nodes")))) | set(place.recorded.values())
    nodes |= {int(v) for v in wire.index.get_level_values(0)}
    nodes |= {int(v) for v in wire.index.get_level_values(1)}
    pairs = [(a, b) for a in sorted(nodes) for b in sorted(nodes) if a != b and a >= 0 and b >= 0]
    grid = pd.MultiIndex.from_tuples(pairs, names=["src_node", "dst_node"])
    out = pd.DataFrame(index=grid)
    out["framework_bytes"] = framework.reindex(grid, fill_value=0.0).astype("float64")
    out["wire_bytes"] = wire["wire_bytes"].reindex(grid, fill_value=0).astype("float64")
    out["wire_packets"] = wire["wire_packets"].reindex(grid, fill_value=0).astype("float64")
    out = out.reset_index()
    out["backend"] = backend
    out["measured_steps"] = n_steps
    out["header_bytes"] = HEADER_BYTES_PER_PACKET * out["wire_packets"]
    out["protocol_bytes"] = protocol.reindex(grid, fill_value=0.0).astype("float64").to_numpy()
    out["wire_payload_bytes"] = out["wire_bytes"] - out["header_bytes"]
    fw = out["framework_bytes"]
    out["ratio"] = out["wire_payload_bytes"] / fw.where(fw > 0)
    out["unexplained_bytes"] = out["wire_payload_bytes"] - out["protocol_bytes"] - fw
    out["tolerance_bytes"] = _tolerance_bytes(fw.to_numpy(), n_steps, tolerance)
    # As in crosscheck: a retransmission on the pair may add wire bytes no op asked for (its
    # original counted too, lost after the receiver's ingress hook); an excess up to it is
    # explained.
    resent = retransmitted_pair_bytes(traces.sockets, window)
    out["retrans_bytes"] = resent.reindex(grid).to_numpy() if len(resent) else np.nan
    extra = np.nan_to_num(out["retrans_bytes"].to_numpy(dtype="float64"))
    unexplained = out["unexplained_bytes"]
    out["passed"] = (unexplained >= -out["tolerance_bytes"]) & (
        unexplained <= out["tolerance_bytes"] + extra
    )
    return with_params(params, out[MATRIX_CHECK_COLUMNS])


def _pair_sums(wire_flows: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """Bytes and packets of the ``wire_flows`` bins that start inside ``window``, summed per
    (src_node, dst_node): all :func:`matrix_check` reads of the flows."""
    in_window = wire_flows[(wire_flows["t_ns"] >= window[0]) & (wire_flows["t_ns"] < window[1])]
    return in_window.groupby(["src_node", "dst_node"])[["bytes", "packets"]].sum()


def summed_flows(batches: Iterable[pd.DataFrame], window: tuple[int, int]) -> pd.DataFrame:
    """A ``wire_flows`` table read in ``batches`` (any split of its rows), reduced to what
    :func:`matrix_check` reads over ``window``: one row per node pair, at the window's start,
    with the bytes and packets of its bins inside the window (integer sums, exact in any
    order), so ``matrix_check(traces, summed_flows(...))`` is ``matrix_check(traces, table)``
    for that window, while the table (10**7 rows of 100 µs bins in a long run) is never held
    whole. Empty when the table is; a table with no bin in the window gives a row outside it.
    """
    sums, outside = [], None
    for batch in batches:
        if not batch.empty:
            sums.append(_pair_sums(batch, window))
            outside = batch.iloc[:1].assign(t_ns=window[1]) if outside is None else outside
    if outside is None:
        return pd.DataFrame(columns=WIRE_FLOW_COLUMNS)
    total = pd.concat(sums).groupby(level=[0, 1]).sum() if sums else pd.DataFrame()
    if total.empty:
        return outside[WIRE_FLOW_COLUMNS].reset_index(drop=True)
    return total.reset_index().assign(t_ns=window[0])[WIRE_FLOW_COLUMNS]


CROSSCHECK_SUMMARY_COLUMNS = [
    "strategy",
    "backend",
    "cells",
    "cells_passed",
    "ratio_min",
    "ratio_median",
    "ratio_max",
    "unexplained_fraction_min",
    "unexplained_fraction_median",
    "unexplained_fraction_max",
]


def crosscheck_by_strategy(crosscheck_table: pd.DataFrame | Path) -> pd.DataFrame:
    """Per strategy: how many cells passed the cross-validation, and the spread of the wire /
    framework ratio and of the unexplained fraction over its cells.

    ``crosscheck_table`` is the aggregated :func:`crosscheck` table (or the aggregate
    directory / parquet file holding it). A cell passes when every node and direction does.
    Per cell the ratio and the unexplained fraction are taken over all its nodes' tx bytes
    (sum wire / sum framework; tx and rx carry the same bytes in a closed cluster); min,
    median and max are over the strategy's cells.

    Columns: strategy, backend, cells, cells_passed, ratio_min, ratio_median, ratio_max,
    unexplained_fraction_min, unexplained_fraction_median, unexplained_fraction_max.
    """
    table = crosscheck_table
    if not isinstance(table, pd.DataFrame):
        path = Path(table)
        table = pd.read_parquet(path / table_file("crosscheck") if path.is_dir() else path)
    if table.empty or "strategy" not in table.columns:
        return pd.DataFrame(columns=CROSSCHECK_SUMMARY_COLUMNS)
    tx = table[table["direction"] == "tx"]
    per_cell = (
        tx.groupby(["strategy", "backend", "cell"], dropna=False)
        .agg(
            wire=("wire_bytes", "sum"),
            framework=("framework_bytes", "sum"),
            unexplained=("unexplained_bytes", "sum"),
        )
        .reset_index()
    )
    passed = table.groupby("cell")["passed"].all()
    per_cell["passed"] = per_cell["cell"].map(passed).astype(bool)
    fw = per_cell["framework"].where(per_cell["framework"] > 0)
    per_cell["ratio"] = per_cell["wire"] / fw
    per_cell["fraction"] = per_cell["unexplained"] / fw
    out = (
        per_cell.groupby(["strategy", "backend"], dropna=False)
        .agg(
            cells=("cell", "nunique"),
            cells_passed=("passed", "sum"),
            ratio_min=("ratio", "min"),
            ratio_median=("ratio", "median"),
            ratio_max=("ratio", "max"),
            unexplained_fraction_min=("fraction", "min"),
            unexplained_fraction_median=("fraction", "median"),
            unexplained_fraction_max=("fraction", "max"),
        )
        .reset_index()
    )
    out["cells_passed"] = out["cells_passed"].astype("int64")
    return out[CROSSCHECK_SUMMARY_COLUMNS]
