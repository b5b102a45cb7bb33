"""Framework vs wire per node: bytes each node's ranks must send to other nodes under the
traffic model (:func:`commscope.collectives.traffic.op_destinations`) against the bytes its
interface sent, over the whole run."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from commscope.cell.load import _backend_of
from commscope.collectives.matrix import Placement
from commscope.contracts import with_params
from commscope.metrics._common import _as_int_ns, _op_sends, _params_from
from commscope.metrics.counters import counted_wire_bytes

WIRE_COLUMNS = [
    "node",
    "window_start_ns",
    "window_end_ns",
    "wire_tx_bytes",
    "wire_rx_bytes",
    "framework_tx_bytes",
    "framework_tx_bytes_with_local",
    "estimated_tx_bytes",
    "wire_over_framework",
    "covered",
]


def wire_vs_framework(
    ops: pd.DataFrame,
    counters: pd.DataFrame,
    meta: dict[str, Any],
    window: tuple[int, int] | None = None,
) -> pd.DataFrame:
    """Per node: bytes its interface sent vs bytes its ranks had to send to other nodes.

    ``framework_tx_bytes`` sums the transfers of :func:`op_destinations` over the node's
    ranks, counting only those to another node (ranks on the same node talk over loopback,
    which the experiment interface never sees); ``framework_tx_bytes_with_local`` counts them
    all.
    ``estimated_tx_bytes`` is the part of ``framework_tx_bytes`` coming from rooted ops
    (broadcast/reduce/gather/scatter) whose root is not recorded: their per-node split is an
    even-share estimate. An optional ``root`` column in ``ops`` (global rank, -1 or null when
    not applicable) makes them exact. ``wire_over_framework`` = wire_tx_bytes /
    framework_tx_bytes: about 1.0-1.1 when the trace is complete (TCP/IP headers, ACKs for
    received data, rendezvous traffic add a few percent), well above 1 when ops are missing
    from the trace, below 1 when the model overstates (e.g. a tree instead of a ring).

    The window defaults to the span of the recorded ops (first issue to last completion), so
    store/rendezvous traffic before and after training does not count. ``meta`` is the
    cell.json dict; ``ranks_per_node`` places ranks missing from ``ops`` on nodes.
    ``ops`` and ``counters`` must hold a single cell.

    Columns: cell params, node, window_start_ns, window_end_ns, wire_tx_bytes,
    wire_rx_bytes, framework_tx_bytes, framework_tx_bytes_with_local, estimated_tx_bytes,
    wire_over_framework, covered.
    """
    params = _params_from(meta, ops, counters)
    if window is None:
        if ops.empty:
            return pd.DataFrame(columns=[*params, *WIRE_COLUMNS])
        ends = _as_int_ns(ops["t_end_ns"]) if "t_end_ns" in ops else np.empty(0, "int64")
        issues = _as_int_ns(ops["t_issue_ns"])
        window = (int(issues.min()), int(max(issues.max(), ends.max() if len(ends) else 0)))

    framework = _framework_tx_per_node(ops, meta)
    wire = (
        counted_wire_bytes(counters, window)
        if not counters.empty
        else pd.DataFrame(columns=["node", "wire_tx_bytes", "wire_rx_bytes", "covered"])
    )
    out = pd.merge(framework, wire, on="node", how="outer").sort_values("node")
    for col in ("framework_tx_bytes", "framework_tx_bytes_with_local", "estimated_tx_bytes"):
        out[col] = out[col].astype("float64").fillna(0.0)
    out["covered"] = out["covered"].astype("boolean").fillna(False).astype(bool)
    out["window_start_ns"], out["window_end_ns"] = window
    fw = out["framework_tx_bytes"].where(out["framework_tx_bytes"] > 0)
    out["wire_over_framework"] = out["wire_tx_bytes"].astype("float64") / fw
    out["node"] = out["node"].astype("int64")
    return with_params(params, out.reset_index(drop=True)[WIRE_COLUMNS])


def _framework_tx_per_node(ops: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """Per node, the bytes its ranks send under :func:`op_destinations`: to other nodes
    (``framework_tx_bytes``), in all (``..._with_local``), and the estimated part."""
    cols = ["node", "framework_tx_bytes", "framework_tx_bytes_with_local", "estimated_tx_bytes"]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    place = Placement.from_ops(ops, meta.get("params", {}).get("ranks_per_node"))
    sends = _op_sends(ops, _backend_of(meta))
    src = sends["rank"].map(place.node)
    # A destination that cannot be placed (-1) counts as remote, like any other node.
    remote = src != sends["dst_rank"].map(place.node)
    inter = sends["bytes"].where(remote, 0.0)
    per_node = pd.DataFrame(
        {
            "node": src,
            "framework_tx_bytes": inter,
            "framework_tx_bytes_with_local": sends["bytes"],
            "estimated_tx_bytes": inter.where(sends["estimated"].astype(bool), 0.0),
        },
        columns=cols,
    )
    # Nodes whose ranks only receive still get a row (of zeros) to sit next to their counters.
    nodes = sorted(set(place.recorded.values()))
    out = per_node.groupby("node").sum().reindex(nodes, fill_value=0.0).rename_axis("node")
    return out.astype("float64").reset_index()[cols]
