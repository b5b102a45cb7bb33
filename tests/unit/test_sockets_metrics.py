"""The ``sockets`` metric table (TCP's rtt, cwnd and retransmissions per node) on hand-built
socket samples whose answers are known exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from commscope import metrics as m
from commscope.contracts import METRIC_TABLES, SOCKETS_FILE

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
STEP_NS = 100 * MS
ADDR = {0: "198.18.0.1", 1: "198.18.0.2"}


def _steps(steps: int = 4) -> pd.DataFrame:
    """Two ranks (one per node), ``steps`` steps of 100 ms from T0; step 0 is warm-up."""
    return pd.DataFrame(
        [
            {
                "rank": rank,
                "node": rank,
                "step": step,
                "phase": "step",
                "t_start_ns": T0 + step * STEP_NS,
                "t_end_ns": T0 + (step + 1) * STEP_NS,
            }
            for step in range(steps)
            for rank in (0, 1)
        ]
    )


def _sample(node: int, dst: str, sport: int, t_ms: float, **values: float | None) -> dict:
    """One sockets.parquet row: ``node``'s connection from ``sport`` to ``dst`` at ``t_ms``."""
    return {
        "node": node,
        "t_ns": T0 + int(t_ms * MS),
        "src": ADDR[node],
        "sport": sport,
        "dst": dst,
        "dport": 29500,
        **values,
    }


def _sockets() -> pd.DataFrame:
    """Samples every 50 ms from 0 to 400 ms (the window is 100-400 ms).

    node 0: a connection to node 1 whose cumulative counters grow linearly (rtt 1 ms up to
    the window, then 2 ms; cwnd 10 + k), and a loopback connection to its own address with a
    huge rtt and retransmissions that must not count; node 1: one connection to node 0 with
    no retransmissions and one sample whose tcp_info fields are null.
    """
    rows = []
    for k in range(9):
        t = 50.0 * k
        rtt = 1000 if t < 100 else 2000
        rows.append(
            _sample(
                0,
                ADDR[1],
                40000,
                t,
                rtt_us=rtt,
                cwnd=10 + k,
                total_retrans=2 * k,
                bytes_retrans=1000 * k,
                bytes_sent=100_000 * k,
            )
        )
        rows.append(
            _sample(
                0,
                ADDR[0],
                40001,
                t,
                rtt_us=50_000,
                cwnd=500,
                total_retrans=100 * k,
                bytes_retrans=10**6 * k,
                bytes_sent=10**7 * k,
            )
        )
        null = k == 4
        rows.append(
            _sample(
                1,
                ADDR[0],
                40002,
                t,
                rtt_us=None if null else 3000,
                cwnd=None if null else 20,
                total_retrans=None if null else 0,
                bytes_retrans=None if null else 0,
                bytes_sent=None if null else 50_000 * k,
            )
        )
    frame = pd.DataFrame(rows)
    cols = ["rtt_us", "cwnd", "total_retrans", "bytes_retrans", "bytes_sent"]
    return frame.astype({c: "UInt64" for c in cols})  # as sockets.parquet stores them


def _traces(sockets: pd.DataFrame) -> m.CellTraces:
    meta = {
        "cell": "strategy~ddp/nodes~2",
        "params": {"strategy": "ddp", "nodes": 2, "ranks_per_node": 1},
        "backend": "gloo",
        "warmup_steps": 1,
    }
    return m.CellTraces(
        ops=pd.DataFrame(), steps=_steps(), counters=pd.DataFrame(), meta=meta, sockets=sockets
    )


def test_socket_stats_per_node_over_the_training_window() -> None:
    table = m.socket_stats(_traces(_sockets()))
    assert list(table.columns) == ["cell", "strategy", "nodes", "ranks_per_node", *m.SOCKET_COLUMNS]
    rows = table.set_index("node")
    assert rows.loc[0, "window_start_ns"] == T0 + STEP_NS
    assert rows.loc[0, "window_end_ns"] == T0 + 4 * STEP_NS
    # Node 0: only its connection to node 1 counts (the loopback one never hits the wire).
    assert rows.loc[0, "connections"] == 1
    assert rows.loc[0, "rtt_median_ms"] == pytest.approx(2.0)  # samples inside the window
    assert rows.loc[0, "rtt_p99_ms"] == pytest.approx(2.0)
    assert rows.loc[0, "cwnd_max"] == 18  # the last sample, k = 8 at 400 ms
    # Bracketing samples are k = 2 (100 ms) and k = 8 (400 ms): 6 intervals of growth.
    assert rows.loc[0, "retrans_segments"] == 12
    assert rows.loc[0, "bytes_retrans"] == 6000
    assert rows.loc[0, "bytes_sent"] == 600_000
    assert rows.loc[0, "retrans_share"] == pytest.approx(0.01)
    # Node 1: the null sample is skipped, not read as zero.
    assert rows.loc[1, "connections"] == 1
    assert rows.loc[1, "rtt_median_ms"] == pytest.approx(3.0)
    assert rows.loc[1, "retrans_segments"] == 0
    assert rows.loc[1, "bytes_sent"] == 300_000
    assert rows.loc[1, "retrans_share"] == 0.0


def test_retransmitted_bytes_per_node_and_direction() -> None:
    window = (T0 + STEP_NS, T0 + 4 * STEP_NS)
    table = m.retransmitted_bytes(_sockets(), window).set_index("node")
    # Node 0 resent 6000 B to node 1 (tx of node 0, rx of node 1); loopback excluded.
    assert table.loc[0, "retrans_tx_bytes"] == 6000 and table.loc[1, "retrans_rx_bytes"] == 6000
    assert table.loc[1, "retrans_tx_bytes"] == 0 and table.loc[0, "retrans_rx_bytes"] == 0


def test_retransmitted_bytes_per_node_pair() -> None:
    from commscope.metrics.sockets import retransmitted_pair_bytes

    window = (T0 + STEP_NS, T0 + 4 * STEP_NS)
    pairs = retransmitted_pair_bytes(_sockets(), window)
    # The same 6000 B, on the pair they crossed (node 0 to node 1), for matrix_check.
    assert pairs.to_dict() == {(0, 1): 6000.0, (1, 0): 0.0}
    assert retransmitted_pair_bytes(pd.DataFrame(), window).empty


def test_socket_stats_of_old_runs_is_an_empty_table_with_the_columns() -> None:
    for sockets in (pd.DataFrame(), pd.DataFrame(columns=["node", "t_ns", "src", "rtt_us"])):
        table = m.socket_stats(_traces(sockets))
        assert table.empty
        assert list(table.columns)[-len(m.SOCKET_COLUMNS) :] == m.SOCKET_COLUMNS
    assert m.retransmitted_bytes(pd.DataFrame(), (0, 1)).empty


def test_compute_cell_metrics_writes_the_sockets_table(tmp_path: Path) -> None:
    traces = _traces(_sockets())
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "cell.json").write_text(json.dumps(traces.meta))
    traces.steps.to_parquet(trace / "steps.parquet")
    m.compute_cell_metrics(trace, tmp_path / "old")  # a run from before socket statistics
    assert pd.read_parquet(tmp_path / "old" / "sockets.parquet").empty
    traces.sockets.to_parquet(trace / SOCKETS_FILE)
    m.compute_cell_metrics(trace, tmp_path / "new")
    table = pd.read_parquet(tmp_path / "new" / "sockets.parquet")
    assert table["node"].tolist() == [0, 1]
    assert table["bytes_retrans"].tolist() == [6000, 0]
    assert "sockets" in METRIC_TABLES
