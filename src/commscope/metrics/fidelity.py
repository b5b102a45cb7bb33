"""Whether the host, not the network, set a cell's step time: the fidelity monitor's table.

An emulation is faithful while every emulated part gets the CPU it needs when it needs it.
Mininet-HiFi (Handigol et al., CoNEXT'12) checks this per run: its hosts keep CPU idle every
second and its links dequeue on time. On this project's hosts the ranks train on CPUs, so the
host is rarely idle; what decides fidelity is whether a thread that could run had to wait for a
core. From each node's host statistics (``host.parquet``, :mod:`commscope.node.hoststat`),
over the cell's measured steps:

- ``ranks_wait_share``: of the time the node's rank threads were runnable, the share they
  waited on a run queue (schedstat). A rank that waits 10 % of its runnable time has its
  compute stretched by ~11 %: the order of the effects the study measures, so a cell above
  :data:`RANK_WAIT_BOUND` on any node, while the host was saturated (at least
  :data:`HOST_BUSY_BOUND` busy: below it the waits are wake-up latency, not contention), is
  host-limited.
- ``delayer_wait_share``: the same for the NFQUEUE delayer. Its waits add to every packet's
  delay; above :data:`DELAYER_WAIT_BOUND` on a saturated host the link is not the one
  configured.
- ``steal_share``: CPU time the hypervisor gave to other guests. It stretches everything,
  ranks and link alike, without any thread of ours waiting; above :data:`STEAL_BOUND`.
- ``ranks_cpus`` and ``runnable_ranks``: the cores the node's ranks used, and the average
  number of their threads that were runnable (ran or waited); summed over the nodes against
  the host's ``cpus`` this says how oversubscribed the host was.
- ``host_busy_share``, ``host_idle_min``: the host's busy share over the window and its least
  idle second; ``cpu_pressure_share``: the share of wall time some task of the host waited for
  a CPU (PSI, host-wide: the study's own tools count too).

Rows: one per node of the cell; a cell whose nodes recorded no host statistics has none.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from commscope.contracts import HOST_SAMPLE_COLUMNS

# Bounds of a faithful cell, each a share of time (justification in the module docstring and
# docs/analysis.md "Fidelity").
RANK_WAIT_BOUND = 0.10
DELAYER_WAIT_BOUND = 0.05
STEAL_BOUND = 0.05
# A thread's run-queue wait is contention only when the host had no CPU to spare: on this VM a
# thread woken from sleep waits 10-100 us for its halted vCPU, and threads that block on every
# message (gloo's) add that up to ~30 % of a rank's runnable time on an otherwise idle host (a
# 2 x 1 gpt-tiny cell, host 80 % busy). So waits count against a cell only while the host was
# at least this busy over the window.
HOST_BUSY_BOUND = 0.95

FIDELITY_COLUMNS: list[str] = [
    "node",
    "host_id",
    "window_s",
    "cpus",
    "host_busy_share",
    "host_idle_min",
    "steal_share",
    "cpu_pressure_share",
    "ranks_cpus",
    "runnable_ranks",
    "ranks_wait_share",
    "delayer_wait_share",
    "host_limited",
    "limited_by",
]


def _bracket(samples: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """The samples from the last one at or before the window's start to the first one at or
    after its end (the whole window inside a difference); fewer where the sampling began late
    or ended early."""
    t = samples["t_ns"].to_numpy()
    first = max(int(np.searchsorted(t, window[0], side="right")) - 1, 0)
    last = min(int(np.searchsorted(t, window[1], side="left")), len(t) - 1)
    return samples.iloc[first : last + 1]


def _share(part: float, whole: float) -> float:
    return float(part / whole) if whole > 0 else float("nan")


def _idle_min(span: pd.DataFrame) -> float:
    """The smallest idle share over any second of ``span`` (consecutive samples ~1 s apart;
    the whole span when it is shorter)."""
    t = span["t_ns"].to_numpy()
    if len(t) < 2:
        return float("nan")
    step = float(np.median(np.diff(t)))
    lag = max(int(round(1e9 / step)), 1) if step > 0 else 1
    lag = min(lag, len(t) - 1)
    idle = span["cpu_idle_ns"].to_numpy(dtype="float64")
    total = span["cpu_total_ns"].to_numpy(dtype="float64")
    d_total = total[lag:] - total[:-lag]
    ok = d_total > 0
    if not ok.any():
        return float("nan")
    return float(np.min((idle[lag:] - idle[:-lag])[ok] / d_total[ok]))


def node_fidelity(samples: pd.DataFrame, window: tuple[int, int]) -> dict[str, object] | None:
    """One node's row (:data:`FIDELITY_COLUMNS` without ``node``) over ``window`` (ns, the
    samples' clock), or None with fewer than two samples around it."""
    # The counters only: the trace table also carries the cell's parameters as columns.
    span = _bracket(samples.sort_values("t_ns")[HOST_SAMPLE_COLUMNS], window)
    if len(span) < 2:
        return None
    d = span.iloc[-1] - span.iloc[0]
    wall = float(d["t_ns"])
    ran, waited = float(d["ranks_run_ns"]), float(d["ranks_wait_ns"])
    delayer_runnable = float(d["delayer_run_ns"] + d["delayer_wait_ns"])
    pressure = float(d["cpu_pressure_us"]) * 1e3 if span["cpu_pressure_us"].min() >= 0 else np.nan
    row: dict[str, object] = {
        "host_id": int(span["host_id"].iloc[-1]),
        "window_s": wall / 1e9,
        "cpus": int(span["cpus"].iloc[-1]),
        "host_busy_share": _share(float(d["cpu_busy_ns"]), float(d["cpu_total_ns"])),
        "host_idle_min": _idle_min(span),
        "steal_share": _share(float(d["cpu_steal_ns"]), float(d["cpu_total_ns"])),
        "cpu_pressure_share": _share(pressure, wall),
        "ranks_cpus": _share(ran, wall),
        "runnable_ranks": _share(ran + waited, wall),
        "ranks_wait_share": _share(waited, ran + waited),
        "delayer_wait_share": _share(float(d["delayer_wait_ns"]), delayer_runnable),
    }
    saturated = float(row["host_busy_share"]) >= HOST_BUSY_BOUND  # type: ignore[arg-type]
    limits = {
        "ranks": row["ranks_wait_share"] if saturated else float("nan"),
        "delayer": row["delayer_wait_share"] if saturated else float("nan"),
        "steal": row["steal_share"],
    }
    bounds = {"ranks": RANK_WAIT_BOUND, "delayer": DELAYER_WAIT_BOUND, "steal": STEAL_BOUND}
    over = [k for k, v in limits.items() if isinstance(v, float) and v > bounds[k]]
    row["host_limited"] = bool(over)
    row["limited_by"] = ",".join(over)
    return row


def fidelity_table(host: pd.DataFrame, window: tuple[int, int] | None) -> pd.DataFrame:
    """Per node, the fidelity over ``window`` of ``host`` (``host.parquet`` with a ``node``
    column, on the window's clock). Empty (with the columns) without samples or window."""
    empty = pd.DataFrame(columns=FIDELITY_COLUMNS)
    if window is None or host.empty or "node" not in host:
        return empty
    rows = []
    for node, samples in host.groupby("node", sort=True):
        row = node_fidelity(samples, window)
        if row is not None:
            rows.append({"node": int(node), **row})
    return pd.DataFrame(rows, columns=FIDELITY_COLUMNS) if rows else empty


# The summary's fidelity columns (one row per cell, :func:`cell_verdict`).
FIDELITY_SUMMARY_COLUMNS: list[str] = [
    "monitored",
    "host_limited",
    "limited_by",
    "ranks_wait_share",
    "delayer_wait_share",
    "steal_share",
    "runnable_rank_threads",
    "host_cpus",
    "oversubscribed",
]


def cell_verdict(table: pd.DataFrame) -> dict[str, object]:
    """The cell's fidelity in one row (:data:`FIDELITY_SUMMARY_COLUMNS`): host-limited when
    any node is, and by what; the worst node's shares; and ``oversubscribed``: more rank
    threads were runnable on average than the host had CPUs. Nodes with one ``host_id`` share
    one host (the netns cluster): their runnable threads add up against its CPUs; nodes on
    hosts of their own are each held against their own."""
    nan = float("nan")
    if table.empty:
        return {
            "monitored": False, "host_limited": False, "limited_by": "",
            "ranks_wait_share": nan, "delayer_wait_share": nan, "steal_share": nan,
            "runnable_rank_threads": nan, "host_cpus": nan, "oversubscribed": False,
        }  # fmt: skip
    by = sorted({k for v in table["limited_by"] for k in str(v).split(",") if k})
    per_host = table.groupby("host_id").agg(
        runnable=("runnable_ranks", "sum"), cpus=("cpus", "max")
    )
    worst = per_host.assign(load=per_host["runnable"] / per_host["cpus"])["load"].idxmax()
    return {
        "monitored": True,
        "host_limited": bool(table["host_limited"].any()),
        "limited_by": ",".join(by),
        "ranks_wait_share": float(table["ranks_wait_share"].max()),
        "delayer_wait_share": float(table["delayer_wait_share"].max()),
        "steal_share": float(table["steal_share"].max()),
        "runnable_rank_threads": float(per_host.loc[worst, "runnable"]),
        "host_cpus": float(per_host.loc[worst, "cpus"]),
        "oversubscribed": bool((per_host["runnable"] > per_host["cpus"]).any()),
    }
