"""Socket statistics: what TCP itself saw (rtt, cwnd, retransmissions) per node, from
``sockets.parquet``."""

from __future__ import annotations

import numpy as np
import pandas as pd

from commscope.cell.load import CellTraces
from commscope.contracts import PARAM_COLUMNS, with_params
from commscope.metrics._common import _shared
from commscope.metrics.window import check_window

_CONNECTION = ["node", "src", "sport", "dst", "dport"]
_SOCKET_CUMULATIVE = ("total_retrans", "bytes_retrans", "bytes_sent")
# The columns of sockets.parquet the socket metrics read (besides the cell parameters): a
# reader may leave the others out (the per-cell job does: 10 Hz per connection adds up).
SOCKET_INPUT_COLUMNS: tuple[str, ...] = (
    *_CONNECTION,
    "t_ns",
    "rtt_us",
    "cwnd",
    *_SOCKET_CUMULATIVE,
)

SOCKET_COLUMNS = [
    "node",
    "window_start_ns",
    "window_end_ns",
    "connections",
    "rtt_median_ms",
    "rtt_p99_ms",
    "cwnd_max",
    "retrans_segments",
    "bytes_retrans",
    "bytes_sent",
    "retrans_share",
]


def _remote_connections(sockets: pd.DataFrame) -> pd.DataFrame:
    """Rows of connections to another address (a connection to the node's own experiment
    address runs over loopback and never reaches the interface), numbers as float64 (the
    file's nullable UInt64 turns into NaN). Shared by socket_stats and retransmitted_bytes
    inside ``shared_results`` (read-only)."""
    return _shared("remote_connections", (sockets,), lambda: _remote_rows(sockets))


def _remote_rows(sockets: pd.DataFrame) -> pd.DataFrame:
    rows = sockets
    if {"src", "dst"} <= set(rows.columns):
        rows = rows[rows["src"].astype(str) != rows["dst"].astype(str)]
    numeric = [c for c in rows.columns if c not in _CONNECTION and c not in PARAM_COLUMNS]
    out = rows.copy()
    for col in numeric:
        out[col] = pd.to_numeric(out[col], errors="coerce").astype("float64")
    for col in _CONNECTION:
        if col not in out:
            out[col] = ""
    return out


def _connection_increase(rows: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """:func:`_grown` over ``window``, shared inside ``shared_results`` (read-only)."""
    key = ("connection_increase", int(window[0]), int(window[1]))
    return _shared(key, (rows,), lambda: _grown(rows, window))


def _grown(rows: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """Per connection, how much each cumulative counter of :data:`_SOCKET_CUMULATIVE` grew
    over ``window``: max - min over the samples from the last one at or before the window's
    start to the first one at or after its end (the samples bracketing the window, so a
    counter that moved inside it is never missed at a sampling rate of a few Hz).

    Columns: node, src, sport, dst, dport, in_window (a sample inside the window), and one
    per cumulative counter present.
    """
    present = [c for c in _SOCKET_CUMULATIVE if c in rows.columns]
    records = []
    for key, conn in rows.groupby(_CONNECTION, sort=True, dropna=False):
        t = conn["t_ns"].to_numpy(dtype="int64")
        order = np.argsort(t, kind="stable")
        t = t[order]
        first = max(int(np.searchsorted(t, window[0], side="right")) - 1, 0)
        last = min(int(np.searchsorted(t, window[1], side="left")), len(t) - 1)
        rec = dict(zip(_CONNECTION, key, strict=True))
        rec["in_window"] = bool(((t >= window[0]) & (t <= window[1])).any())
        for col in present:
            values = conn[col].to_numpy(dtype="float64")[order][first : last + 1]
            finite = values[np.isfinite(values)]
            rec[col] = float(finite.max() - finite.min()) if len(finite) else float("nan")
        records.append(rec)
    return pd.DataFrame(records, columns=[*_CONNECTION, "in_window", *present])


def socket_stats(traces: CellTraces) -> pd.DataFrame:
    """TCP's own view of each node's training traffic, one row per node, over the
    cross-validation window (:func:`check_window`).

    From ``sockets.parquet`` (``struct tcp_info`` per node and connection at ~10 Hz), over the
    node's connections to other nodes (its own experiment address excluded: that is
    loopback):

    * ``connections``: connections with a sample inside the window;
    * ``rtt_median_ms``, ``rtt_p99_ms``: smoothed RTT (``rtt_us``) over those samples;
    * ``cwnd_max``: largest congestion window (segments);
    * ``retrans_segments``, ``bytes_retrans``, ``bytes_sent``: growth of ``total_retrans``,
      ``bytes_retrans`` and ``bytes_sent`` (which includes retransmissions) per connection
      over the window (max - min over the samples bracketing it), summed over connections;
    * ``retrans_share`` = bytes_retrans / bytes_sent (NaN when nothing was sent).

    Runs without socket statistics (no file, an empty one, no steps) give an empty table
    with these columns.

    Columns: cell params, node, window_start_ns, window_end_ns, connections, rtt_median_ms,
    rtt_p99_ms, cwnd_max, retrans_segments, bytes_retrans, bytes_sent, retrans_share.
    """
    params = traces.params
    empty = pd.DataFrame(columns=[*params, *SOCKET_COLUMNS])
    checked = check_window(traces)
    sockets = traces.sockets
    if checked is None or sockets.empty or not {"node", "t_ns"} <= set(sockets.columns):
        return empty
    window = checked[0]
    rows = _remote_connections(sockets)
    nodes = sorted(int(n) for n in pd.unique(sockets["node"]))
    inside = rows[(rows["t_ns"] >= window[0]) & (rows["t_ns"] <= window[1])]
    grown = _connection_increase(rows, window)
    records = []
    for node in nodes:
        here = inside[inside["node"] == node]
        conns = grown[(grown["node"] == node) & grown["in_window"]]
        rtt_ms = here["rtt_us"].dropna() / 1000.0 if "rtt_us" in here else pd.Series([], "f8")
        cwnd = here["cwnd"].dropna() if "cwnd" in here else pd.Series([], dtype="float64")
        sums = {
            c: float(conns[c].sum(min_count=1)) if c in conns else np.nan
            for c in _SOCKET_CUMULATIVE
        }
        sent = sums["bytes_sent"]
        records.append(
            {
                "node": node,
                "window_start_ns": window[0],
                "window_end_ns": window[1],
                "connections": len(conns),
                "rtt_median_ms": float(rtt_ms.median()) if len(rtt_ms) else np.nan,
                "rtt_p99_ms": float(rtt_ms.quantile(0.99)) if len(rtt_ms) else np.nan,
                "cwnd_max": float(cwnd.max()) if len(cwnd) else np.nan,
                "retrans_segments": sums["total_retrans"],
                "bytes_retrans": sums["bytes_retrans"],
                "bytes_sent": sent,
                "retrans_share": sums["bytes_retrans"] / sent if sent > 0 else np.nan,
            }
        )
    out = pd.DataFrame(records, columns=SOCKET_COLUMNS)
    return with_params(params, out)


def retransmitted_pair_bytes(sockets: pd.DataFrame, window: tuple[int, int]) -> pd.Series:
    """TCP payload retransmitted over ``window`` per ordered node pair (``src_node``,
    ``dst_node``: the sending node's connections to the receiving node's address), as
    :func:`retransmitted_bytes` counts it per node; empty without socket statistics."""
    index = pd.MultiIndex.from_arrays([[], []], names=["src_node", "dst_node"])
    empty = pd.Series([], index=index, dtype="float64", name="retrans_bytes")
    if sockets.empty or not {"node", "t_ns", "bytes_retrans", "src"} <= set(sockets.columns):
        return empty
    grown = _connection_increase(_remote_connections(sockets), window)
    node_of = {
        str(a): int(n)
        for n, a in sockets[["node", "src"]].drop_duplicates().itertuples(index=False)
    }
    grown = grown.assign(dst_node=grown["dst"].astype(str).map(node_of)).dropna(subset=["dst_node"])
    if grown.empty:
        return empty
    out = grown.groupby([grown["node"].astype("int64"), grown["dst_node"].astype("int64")])[
        "bytes_retrans"
    ].sum()
    out.index.names = ["src_node", "dst_node"]
    return out.astype("float64").rename("retrans_bytes")


def retransmitted_bytes(sockets: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """Per node, the TCP payload retransmitted over ``window`` on connections between nodes:
    ``retrans_tx_bytes`` by the node's own connections, ``retrans_rx_bytes`` by other nodes'
    connections to the node's address (each node's address is the ``src`` of its rows).
    Growth of ``bytes_retrans`` per connection as in :func:`socket_stats`. Without socket
    statistics the table is empty (and :func:`crosscheck` shows NaN).

    Columns: node, retrans_tx_bytes, retrans_rx_bytes.
    """
    cols = ["node", "retrans_tx_bytes", "retrans_rx_bytes"]
    if sockets.empty or not {"node", "t_ns", "bytes_retrans"} <= set(sockets.columns):
        return pd.DataFrame(columns=cols).astype({"node": "int64"})
    rows = _remote_connections(sockets)
    grown = _connection_increase(rows, window)
    node_of = (
        {
            str(a): int(n)
            for n, a in sockets[["node", "src"]].drop_duplicates().itertuples(index=False)
        }
        if "src" in sockets
        else {}
    )
    tx = grown.groupby("node")["bytes_retrans"].sum()
    rx = grown.assign(dst_node=grown["dst"].astype(str).map(node_of)).dropna(subset=["dst_node"])
    rx = rx.groupby(rx["dst_node"].astype("int64"))["bytes_retrans"].sum()
    nodes = sorted(int(n) for n in pd.unique(sockets["node"]))
    return pd.DataFrame(
        {
            "node": nodes,
            "retrans_tx_bytes": tx.reindex(nodes, fill_value=0.0).to_numpy(dtype="float64"),
            "retrans_rx_bytes": rx.reindex(nodes, fill_value=0.0).to_numpy(dtype="float64"),
        }
    )
