"""The fidelity monitor's table from synthetic host samples: shares over the measured window,
bounds, and the cell's verdict."""

from __future__ import annotations

import math

import pandas as pd

from commscope.contracts import HOST_SAMPLE_COLUMNS
from commscope.metrics import fidelity as f

S = 1_000_000_000


def _samples(
    node: int,
    seconds: int,
    *,
    wait_per_s: float,
    steal_per_s: float = 0.0,
    host: int = 77,
    idle_per_s: float = 0.02,
) -> pd.DataFrame:
    """Two CPUs sampled every 0.5 s; per second the ranks run 1.5 CPU-seconds and wait
    ``wait_per_s`` CPU-seconds, the host is idle ``idle_per_s`` CPU-seconds and steal takes
    ``steal_per_s``; the delayer runs 10 ms and waits 1 ms."""
    rows = []
    for i in range(2 * seconds + 1):
        t = i / 2
        steal = steal_per_s * t
        idle = idle_per_s * t
        total = 2.0 * t
        rows.append(
            (
                10 * S + int(t * S), host, 2,
                int((total - idle - steal) * S), int(idle * S), int(steal * S), int(total * S),
                int(wait_per_s * t * 1e6),
                int(1.5 * t * S), int(wait_per_s * t * S), 8,
                int(0.01 * t * S), int(0.001 * t * S), 1,
            )
        )  # fmt: skip
    frame = pd.DataFrame(rows, columns=HOST_SAMPLE_COLUMNS)
    frame.insert(0, "node", node)
    # As parse_cell writes it: the cell's parameters follow as constant columns.
    return frame.assign(strategy="ddp", model="tiny", bw="none", cell="c")


def test_shares_are_differences_over_the_window() -> None:
    host = _samples(0, 10, wait_per_s=0.1, idle_per_s=0.2)
    table = f.fidelity_table(host, (12 * S, 18 * S))
    (row,) = table.to_dict("records")
    assert row["window_s"] == 6.0  # samples at exactly 12 s and 18 s bracket the window
    assert math.isclose(row["ranks_cpus"], 1.5)
    assert math.isclose(row["runnable_ranks"], 1.6)
    assert math.isclose(row["ranks_wait_share"], 0.1 / 1.6)
    assert math.isclose(row["host_busy_share"], 0.9)
    assert math.isclose(row["host_idle_min"], 0.1)
    assert math.isclose(row["cpu_pressure_share"], 0.1)
    assert math.isclose(row["delayer_wait_share"], 0.001 / 0.011)
    # Waits on a host with CPU to spare (10 % idle) are wake-up latency, not contention ...
    assert row["host_limited"] is False and row["limited_by"] == ""
    # ... on a saturated host (1 % idle) the delayer's 9 % wait is over its 5 % bound.
    (busy,) = f.fidelity_table(_samples(0, 10, wait_per_s=0.1), (12 * S, 18 * S)).to_dict("records")
    assert busy["host_busy_share"] >= f.HOST_BUSY_BOUND
    assert busy["host_limited"] is True and busy["limited_by"] == "delayer"


def test_a_node_over_the_rank_bound_makes_the_cell_host_limited() -> None:
    host = pd.concat([_samples(0, 10, wait_per_s=0.05), _samples(1, 10, wait_per_s=0.5)])
    table = f.fidelity_table(host, (11 * S, 19 * S))
    assert list(table["node"]) == [0, 1]
    assert table.loc[1, "ranks_wait_share"] > f.RANK_WAIT_BOUND
    verdict = f.cell_verdict(table)
    assert verdict["host_limited"] and "ranks" in str(verdict["limited_by"])
    # 1.55 + 2.0 runnable rank threads on one 2-CPU host: oversubscribed ...
    assert verdict["oversubscribed"] is True
    assert math.isclose(verdict["runnable_rank_threads"], 3.55) and verdict["host_cpus"] == 2
    # ... but not when each node has two CPUs of its own (another boot id).
    apart = pd.concat([_samples(0, 10, wait_per_s=0.05), _samples(1, 10, wait_per_s=0.5, host=78)])
    assert f.cell_verdict(f.fidelity_table(apart, (11 * S, 19 * S)))["oversubscribed"] is False


def test_steal_counts_against_the_cell() -> None:
    host = _samples(0, 10, wait_per_s=0.0, steal_per_s=0.3)
    (row,) = f.fidelity_table(host, (11 * S, 19 * S)).to_dict("records")
    assert math.isclose(row["steal_share"], 0.15)
    assert "steal" in row["limited_by"]


def test_no_samples_or_no_window_give_an_empty_table_and_an_unmonitored_cell() -> None:
    assert f.fidelity_table(pd.DataFrame(), (0, 1)).empty
    assert f.fidelity_table(_samples(0, 2, wait_per_s=0.0), None).empty
    verdict = f.cell_verdict(pd.DataFrame(columns=f.FIDELITY_COLUMNS))
    assert list(verdict) == f.FIDELITY_SUMMARY_COLUMNS
    assert verdict["monitored"] is False and verdict["host_limited"] is False
