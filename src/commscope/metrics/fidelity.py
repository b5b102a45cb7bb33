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

And from the wire accounting's bins, where the cell has a cap: each node's egress port (the
tbf that shapes what it sends, docs/linkmodel.md), judged like Mininet-HiFi's dequeue check.
What the node offered its tbf (its egress hook, before the qdisc) fed to an ideal token bucket
says when the port was backlogged; what the tbf let out is what the receivers' ingress hooks
counted from the node. Over the backlogged time (:func:`port_fidelity`):

- ``achieved_over_cap``: the bytes delivered over what the cap carries, within
  [:data:`ACHIEVED_LOW_BOUND`, :data:`ACHIEVED_HIGH_BOUND`];
- ``gap_share``: the share of it with nothing delivered for longer than one frame's
  serialisation at the cap, at most :data:`GAP_BOUND`;
- ``over_share``: the share of its bins that delivered more than a token bucket can let out in
  a bin, at most :data:`OVER_BOUND`.

A port outside them makes the node host-limited by ``shaper``; a cell without a cap, or a port
backlogged less than :data:`MIN_BACKLOGGED_S`, is not judged on it (NaN).

And from the NFQUEUE delayer's own record (cell.json ``link_engine``, over the whole run), where
the cell has a delay: ``delay_late_share``, the 99th percentile of how late it released a packet
after its due time, over the configured delay (:func:`delayer_lateness`). Above
:data:`DELAY_LATE_BOUND` the node is host-limited by ``delay``: more than one packet in a
hundred crossed a link slower than the one configured by more than a tenth of its delay.

Rows: one per node of the cell with host statistics, a shaped port or a delayer; none without
any.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
# The delayer's p99 lateness over the configured delay. A bulk message completes with its last
# packet (TCP delivers in order: a late packet holds back every one behind it), so a message of
# a few hundred packets meets roughly the p99; at 10 % of the delay the extra latency is within
# the effects the delay findings compare, the same order as RANK_WAIT_BOUND. DDP's gradient
# bursts at 1 Gbit/s + 5 ms left the delayer's p99 3-11 ms late on a host below HOST_BUSY_BOUND,
# where its CPU wait does not count (2026-11-27).
DELAY_LATE_BOUND = 0.10

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
    # The node's delayer, where the cell has a delay (delayer_lateness, below).
    "delay_us",
    "delay_late_us_p99",
    "delay_late_share",
    # The node's egress port, where the cell has a cap (SHAPER_COLUMNS, below).
    "shaped_rate_bps",
    "backlogged_s",
    "achieved_over_cap",
    "gap_share",
    "over_share",
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


def delayer_lateness(link_engine: Mapping[str, Any] | None) -> dict[int, dict[str, float]]:
    """Per node index, its NFQUEUE delayer's lateness from a run's ``link_engine`` record
    (cell.json; nodes named ``node<i>``): ``delay_us`` configured (the jitter where there is no
    delay), ``delay_late_us_p99`` and their ratio ``delay_late_share``. Only delayers that
    released a packet and had a delay or jitter to keep: a delayer that released nothing
    reports a lateness of 0, no measurement; netem records none."""
    out: dict[int, dict[str, float]] = {}
    for name, node in ((link_engine or {}).get("nodes") or {}).items():
        delayer = (node or {}).get("delayer") or {}
        late = delayer.get("late_us")
        scale = float(delayer.get("delay_us") or 0) or float(delayer.get("jitter_us") or 0)
        if not late or int(delayer.get("released", 0)) <= 0 or scale <= 0:
            continue
        index = str(name).removeprefix("node")
        if not index.isdigit():
            continue
        p99 = float(late["p99"])
        out[int(index)] = {
            "delay_us": scale,
            "delay_late_us_p99": p99,
            "delay_late_share": p99 / scale,
        }
    return out


def _limit(row: dict[str, object], key: str) -> None:
    row["host_limited"] = True
    row["limited_by"] = ",".join(filter(None, [str(row["limited_by"]), key]))


def fidelity_table(
    host: pd.DataFrame,
    window: tuple[int, int] | None,
    shaper: pd.DataFrame | None = None,
    delayers: Mapping[int, Mapping[str, float]] | None = None,
) -> pd.DataFrame:
    """Per node, the fidelity over ``window`` of ``host`` (``host.parquet`` with a ``node``
    column, on the window's clock), of its shaped egress port (``shaper``, rows of
    :func:`shaper_table` over the same window; none where the cell has no cap or no wire
    bins) and of its delayer (``delayers``, :func:`delayer_lateness` of the run's record). A
    node without one of them has NaN in its columns; a node whose port is outside the
    shaper's bounds (:func:`shaper_limited`) is host-limited by ``shaper``, one whose delayer
    was late past :data:`DELAY_LATE_BOUND` by ``delay``. Empty (with the columns) without
    any."""
    rows: dict[int, dict[str, object]] = {}
    if window is not None and not host.empty and "node" in host:
        for node, samples in host.groupby("node", sort=True):
            row = node_fidelity(samples, window)
            if row is not None:
                rows[int(node)] = row
    if shaper is not None:
        for port in shaper.to_dict("records"):
            node = int(port.pop("node"))
            row = rows.setdefault(node, {"host_limited": False, "limited_by": ""})
            row.update(port)
            if shaper_limited(port):
                _limit(row, "shaper")
    for node, lateness in (delayers or {}).items():
        row = rows.setdefault(int(node), {"host_limited": False, "limited_by": ""})
        row.update(lateness)
        if lateness["delay_late_share"] > DELAY_LATE_BOUND:
            _limit(row, "delay")
    if not rows:
        return pd.DataFrame(columns=FIDELITY_COLUMNS)
    table = pd.DataFrame([{"node": n, **rows[n]} for n in sorted(rows)], columns=FIDELITY_COLUMNS)
    # A node without host samples has no host id or CPU count.
    return table.astype({"host_id": "Int64", "cpus": "Int64"})


# The summary's fidelity columns (one row per cell, :func:`cell_verdict`).
FIDELITY_SUMMARY_COLUMNS: list[str] = [
    "monitored",
    "host_limited",
    "limited_by",
    "ranks_wait_share",
    "delayer_wait_share",
    "steal_share",
    "delay_late_share",
    "runnable_rank_threads",
    "host_cpus",
    "oversubscribed",
    "shaper_checked",
    "achieved_over_cap",
    "shaper_gap_share",
    "shaper_over_share",
]


def cell_verdict(table: pd.DataFrame) -> dict[str, object]:
    """The cell's fidelity in one row (:data:`FIDELITY_SUMMARY_COLUMNS`): host-limited when
    any node is, and by what; the worst node's shares; and ``oversubscribed``: more rank
    threads were runnable on average than the host had CPUs. Nodes with one ``host_id`` share
    one host (the netns cluster): their runnable threads add up against its CPUs; nodes on
    hosts of their own are each held against their own. ``monitored``: some node has host
    samples; ``shaper_checked``: some node's port was backlogged long enough to be judged,
    with the worst port's ``achieved_over_cap`` (farthest from 1), ``shaper_gap_share`` and
    ``shaper_over_share``; ``delay_late_share``: the latest delayer's (NaN without one)."""
    nan = float("nan")
    row: dict[str, object] = {
        "monitored": False, "host_limited": False, "limited_by": "",
        "ranks_wait_share": nan, "delayer_wait_share": nan, "steal_share": nan,
        "delay_late_share": nan, "runnable_rank_threads": nan, "host_cpus": nan,
        "oversubscribed": False,
        "shaper_checked": False, "achieved_over_cap": nan, "shaper_gap_share": nan,
        "shaper_over_share": nan,
    }  # fmt: skip
    if table.empty:
        return row
    row["host_limited"] = bool(table["host_limited"].any())
    row["limited_by"] = ",".join(
        sorted({k for v in table["limited_by"] for k in str(v).split(",") if k})
    )
    monitored = table[table["host_id"].notna()]
    if not monitored.empty:
        per_host = monitored.groupby("host_id").agg(
            runnable=("runnable_ranks", "sum"), cpus=("cpus", "max")
        )
        worst = per_host.assign(load=per_host["runnable"] / per_host["cpus"])["load"].idxmax()
        row.update(
            monitored=True,
            ranks_wait_share=float(monitored["ranks_wait_share"].max()),
            delayer_wait_share=float(monitored["delayer_wait_share"].max()),
            steal_share=float(monitored["steal_share"].max()),
            runnable_rank_threads=float(per_host.loc[worst, "runnable"]),
            host_cpus=float(per_host.loc[worst, "cpus"]),
            oversubscribed=bool((per_host["runnable"] > per_host["cpus"]).any()),
        )
    late = pd.to_numeric(table["delay_late_share"], errors="coerce").dropna()
    if not late.empty:
        row["delay_late_share"] = float(late.max())
    achieved = pd.to_numeric(table["achieved_over_cap"], errors="coerce").dropna()
    if not achieved.empty:
        row.update(
            shaper_checked=True,
            achieved_over_cap=float(achieved.loc[(achieved - 1).abs().idxmax()]),
            shaper_gap_share=float(pd.to_numeric(table["gap_share"]).max()),
            shaper_over_share=float(pd.to_numeric(table["over_share"]).max()),
        )
    return row


# --------------------------------------------------------------------------------------------
# The shaper: does each capped port dequeue at its rate while it has something to send?
# --------------------------------------------------------------------------------------------

# The shaper columns of the fidelity table (the node's egress port, docs/fidelity.md).
SHAPER_COLUMNS: list[str] = [
    "shaped_rate_bps",
    "backlogged_s",
    "achieved_over_cap",
    "gap_share",
    "over_share",
]
# Bounds of a faithful shaper (justification in docs/fidelity.md "The shaper"): what it
# delivered while backlogged, over its cap; the share of backlogged time it sent nothing for
# longer than a frame's serialisation; the share of backlogged bins it delivered more than its
# bucket and a bin of tokens allow.
ACHIEVED_LOW_BOUND = 0.95
ACHIEVED_HIGH_BOUND = 1.02
GAP_BOUND = 0.05
OVER_BOUND = 0.01
# A gap is a run of empty bins longer than this or a frame's serialisation, whichever is
# longer: the receivers' ingress, where the dequeues are seen, takes frames off the veth in
# softirq batches (NAPI, up to 64 frames a poll: 0.8 ms of frames at 1 Gbit/s), so at high caps
# a faithful port shows empty 100 us bins between batches. In the default study of 2026-11-27
# the 1 Gbit/s ports delivered 0.998-1.008 of the cap while backlogged with 69-71 % of those
# bins empty; a hole longer than a batch is a shaper (or receiver) that did not run.
GAP_MIN_S = 1e-3
# Below this much backlogged time the port is not judged: too few dequeues to tell a late
# shaper from the bucket's start-up burst and the bins' quantisation.
MIN_BACKLOGGED_S = 0.1
# How long after a backlog begins its bins start to count (see :func:`port_fidelity`).
SETTLE_S = 200e-6


def ideal_output(offered: np.ndarray, rate_per_bin: float, burst_bytes: float) -> np.ndarray:
    """What a token bucket of ``burst_bytes`` filling at ``rate_per_bin`` bytes a bin lets out
    by the end of each bin, cumulatively, of the bytes ``offered`` to it per bin (starting
    with a full bucket and an empty queue, dropping nothing): the greedy shaper's output
    Y(t) = min(O(t), min over s < t of O(s) + burst + rate (t - s)), O the cumulative input
    (network calculus: the min-plus convolution of the input with the bucket's arrival curve).
    A faithful tbf dequeues this, to within a frame and a bin."""
    cum = np.cumsum(offered, dtype="float64")
    bins = np.arange(len(cum), dtype="float64")
    # O(j) - rate j for j = -1 (nothing offered yet, a full bucket at time 0) .. i - 1.
    earlier = np.minimum.accumulate(
        np.concatenate([[rate_per_bin], (cum - rate_per_bin * bins)[:-1]])
    )
    return np.minimum(cum, burst_bytes + rate_per_bin * bins + earlier)


def port_fidelity(
    offered: np.ndarray,
    delivered: np.ndarray,
    *,
    rate_bps: float,
    bin_ns: int,
    burst_bytes: float,
    frame_bytes: float,
) -> dict[str, float]:
    """One shaped port's columns (:data:`SHAPER_COLUMNS` but ``shaped_rate_bps``) from its
    bytes per bin of width ``bin_ns`` on one grid: ``offered`` to the shaper (the sender's
    egress hook, before the qdisc) and ``delivered`` by it (the receivers' ingress hooks).

    The yardstick is the ideal shaper fed the same bytes (:func:`ideal_output`): a bin is
    *backlogged* when the ideal shaper held more than a frame at its start (it had a frame
    waiting for tokens, so a faithful one dequeues at the cap throughout). Over the
    backlogged bins:

    - ``achieved_over_cap``: the bytes delivered over what the cap carries in that time;
    - ``gap_share``: the time in runs of backlogged bins with nothing delivered, beyond one
      frame's serialisation at the cap each or a receive batch (:data:`GAP_MIN_S`), whichever
      is longer (a run of k empty bins says two dequeues were at least k bins apart, where a
      faithful shaper spaces them by one frame's time), over the backlogged time;
    - ``over_share``: the share of backlogged bins that delivered more than ``burst_bytes``
      plus a bin's worth of tokens, more than a token bucket can ever let out in a bin (a
      shaper or a receiver catching up after a stall);

    NaN with less than :data:`MIN_BACKLOGGED_S` of backlogged time."""
    nan = float("nan")
    bin_s = bin_ns / 1e9
    per_bin = rate_bps / 8 * bin_s
    ideal = ideal_output(np.asarray(offered, dtype="float64"), per_bin, burst_bytes)
    waiting = np.cumsum(offered, dtype="float64") - ideal
    backlogged = np.concatenate([[0.0], waiting[:-1]]) > frame_bytes
    # The bucket's burst leaves at line rate just before a backlog begins and reaches the
    # receivers' ingress up to a bin or two later: from a run's first bins it would count as
    # delivered above the cap. So each run counts from SETTLE_S on.
    settle = int(np.ceil(SETTLE_S * 1e9 / bin_ns))
    starts = np.flatnonzero(np.diff(np.concatenate([[0], backlogged.astype(np.int8)])) == 1)
    for k in range(settle):
        backlogged[starts[starts + k < len(backlogged)] + k] = False
    n = int(backlogged.sum())
    row = {"backlogged_s": n * bin_s}
    row.update(dict.fromkeys(("achieved_over_cap", "gap_share", "over_share"), nan))
    if n * bin_s < MIN_BACKLOGGED_S:
        return row
    delivered = np.asarray(delivered, dtype="float64")
    sent = delivered[backlogged]
    row["achieved_over_cap"] = float(sent.sum() / (per_bin * n))
    row["over_share"] = float(np.mean(sent > per_bin + burst_bytes))
    # Runs of backlogged empty bins: what each lasts beyond a frame's serialisation (or a
    # receive batch, GAP_MIN_S) is a gap.
    empty = backlogged & (delivered == 0)
    edges = np.diff(np.concatenate([[0], empty.astype(np.int8), [0]]))
    lengths = (np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)) * bin_s
    allowed_s = max(frame_bytes * 8 / rate_bps, GAP_MIN_S)
    row["gap_share"] = float(np.clip(lengths - allowed_s, 0, None).sum() / (n * bin_s))
    return row


def shaper_limited(port: dict[str, object]) -> bool:
    """Whether a port's row (:data:`SHAPER_COLUMNS`) is outside the shaper's bounds: what it
    delivered while backlogged off the cap by more than :data:`ACHIEVED_LOW_BOUND` /
    :data:`ACHIEVED_HIGH_BOUND`, gaps over :data:`GAP_BOUND` of the backlogged time, or bins
    over the bucket's reach more than :data:`OVER_BOUND` of them. A port too little
    backlogged to be judged (NaN) is not limited."""
    achieved, gaps, over = (
        pd.to_numeric(port[c]) for c in ("achieved_over_cap", "gap_share", "over_share")
    )
    return bool(
        achieved < ACHIEVED_LOW_BOUND
        or achieved > ACHIEVED_HIGH_BOUND
        or gaps > GAP_BOUND
        or over > OVER_BOUND
    )


def shaper_table(
    offered: pd.DataFrame,
    delivered: pd.DataFrame,
    window: tuple[int, int] | None,
    *,
    rate_bps: float | None,
    bin_ns: int,
    burst_bytes: float,
    frame_bytes: float,
) -> pd.DataFrame:
    """Per sending node, its shaped egress port over ``window`` (:data:`SHAPER_COLUMNS` after
    ``node``, :func:`port_fidelity`): ``offered`` the node's egress bins (columns ``node``,
    ``t_ns``, ``bytes``: what it handed its shaper, to any peer) and ``delivered`` the
    receivers' ingress bins by sender (``wire_flows``: ``src_node``, ``t_ns``, ``bytes``),
    both at ``bin_ns`` on the window's clock. Empty (with the columns) without a cap
    (``rate_bps`` None: nothing to check), a window or bins."""
    columns = ["node", *SHAPER_COLUMNS]
    if not rate_bps or window is None or offered.empty:
        return pd.DataFrame(columns=columns)
    start = window[0] // bin_ns * bin_ns
    n_bins = (window[1] - start) // bin_ns + 1

    def per_bin(frame: pd.DataFrame) -> np.ndarray:
        k = (frame["t_ns"].to_numpy(np.int64) - start) // bin_ns
        inside = (k >= 0) & (k < n_bins)
        return np.bincount(
            k[inside], weights=frame["bytes"].to_numpy("float64")[inside], minlength=n_bins
        )

    rows = []
    for node, sent in offered.groupby("node", sort=True):
        port = port_fidelity(
            per_bin(sent),
            per_bin(delivered[delivered["src_node"] == node]),
            rate_bps=float(rate_bps),
            bin_ns=bin_ns,
            burst_bytes=burst_bytes,
            frame_bytes=frame_bytes,
        )
        rows.append({"node": int(node), "shaped_rate_bps": float(rate_bps), **port})
    return pd.DataFrame(rows, columns=columns)
