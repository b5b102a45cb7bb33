"""Synthetic sweep-cell directories with answers known in closed form.

The data-parallel cell built by :func:`make_ddp_cell` (``nodes`` nodes, one rank each) is:

* run start ``t0``; at t0+2 ms rank 0 broadcasts ``param_bytes`` (step -1, as DDP does), the
  broadcast is on the wire from t0+2 to t0+6 ms (the root sends to every other node);
* steps from t0+10 ms, back to back, with durations ``step_ms``; rank r enters a step r ms
  after its start and leaves (world-1-r) ms before its end, so the step spans exactly its
  duration across ranks and the ranks' start spread is (world-1) ms;
* inside every step, each rank issues two gradient all-reduce buckets (``bucket_bytes``) at
  +50 and +60 ms (ending +60 and +70 ms) and a zero-byte barrier at the step end;
* each node's interface sends exactly ``wire_factor`` times its ring share
  (2(n-1)/n of a rank's gradient bytes per step) at a constant rate during +50..+70 ms, and
  nothing else; counters are sampled every ``sample_ms`` on a grid aligned with all of the
  above, starting from a non-zero kernel counter value.

With the defaults (2 nodes, buckets 600 kB + 400 kB, wire_factor 1.05, steps 120/100/100/100/100
ms, warm-up 1) the known answers are listed in :data:`DDP_EXPECTED`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

T0_NS = 1_700_000_000_000_000_000
MS = 1_000_000
# Counters start from what a kernel has counted since boot: differencing must remove it.
COUNTER_BASE = 7_000_000_000

BW_BPS = {"none": None, "10mbit": 10e6, "100mbit": 100e6, "1gbit": 1e9}

DDP_EXPECTED: dict[str, float] = {
    "step_time_mean_s": 0.1,
    "step_time_std_s": 0.0,
    "framework_bytes_per_step": 2_000_000.0,  # 2 ranks x (600 kB + 400 kB)
    "framework_bytes_per_step_per_rank": 1_000_000.0,
    "messages_per_step": 6.0,  # 2 ranks x (2 buckets + barrier)
    "wire_tx_bytes_per_step_per_node": 1_050_000.0,
    "throughput_mean_bps": 84e6,  # 1.05 MB x 8 bits per 100 ms
    "peak_to_mean_10ms": 5.0,  # on 20 ms of every 100 ms
    "cov_10ms": 2.0,  # sqrt((1 - 0.2) / 0.2)
    "wire_over_framework": 1.05,
}


def cell_params(
    strategy: str = "ddp",
    model: str = "gpt-tiny",
    nodes: int = 2,
    ranks_per_node: int = 1,
    bw: str = "1gbit",
    delay: str = "0ms",
    jitter: str = "0ms",
    loss: str = "0pct",
    cc: str = "cubic",
    steps: int = 5,
    repeat: int = 0,
) -> dict[str, Any]:
    """Sweep-cell parameters in contract order."""
    return {
        "strategy": strategy,
        "model": model,
        "nodes": nodes,
        "ranks_per_node": ranks_per_node,
        "bw": bw,
        "delay": delay,
        "jitter": jitter,
        "loss": loss,
        "cc": cc,
        "steps": steps,
        "repeat": repeat,
    }


def cell_id(params: dict[str, Any]) -> str:
    """The cell id, one ``key~value`` level per axis."""
    return "/".join(f"{k}~{v}" for k, v in params.items())


def step_summary(*cells: tuple[dict[str, Any], float]) -> pd.DataFrame:
    """Summary rows of (cell parameters, mean step time in s), as the aggregate has them."""
    rows = [{"cell": cell_id(p), **p, "step_time_mean_s": t} for p, t in cells]
    return pd.DataFrame(rows)


def only_row(table: pd.DataFrame, **match: object) -> pd.Series:
    """The one row of ``table`` whose columns equal ``match`` (asserts there is exactly one)."""
    hit = table
    for key, value in match.items():
        hit = hit[hit[key] == value]
    assert len(hit) == 1, match
    return hit.iloc[0]


def _add_params(df: pd.DataFrame, params: dict[str, Any]) -> pd.DataFrame:
    for k, v in params.items():
        df[k] = v
    df["cell"] = cell_id(params)
    return df


def piecewise_counters(
    node: int,
    knots_ms: Sequence[tuple[float, float]],
    sample_times_ns: np.ndarray,
    t0_ns: int = T0_NS,
    rx_knots_ms: Sequence[tuple[float, float]] | None = None,
    iface: str = "exp0",
) -> pd.DataFrame:
    """Counter samples of a cumulative byte count that is piecewise linear between knots.

    ``knots_ms`` are (time in ms after ``t0_ns``, cumulative bytes) pairs; the counter is
    sampled at ``sample_times_ns`` (absolute) and rounded to whole bytes like a kernel counter.
    """
    rx_knots_ms = knots_ms if rx_knots_ms is None else rx_knots_ms
    t_rel_ms = (np.asarray(sample_times_ns, dtype="int64") - t0_ns) / MS

    def sample(knots: Sequence[tuple[float, float]]) -> np.ndarray:
        kt, kv = zip(*knots, strict=True)
        return COUNTER_BASE + np.rint(np.interp(t_rel_ms, kt, kv)).astype("int64")

    tx, rx = sample(knots_ms), sample(rx_knots_ms)
    return pd.DataFrame(
        {
            "node": node,
            "iface": iface,
            "t_ns": np.asarray(sample_times_ns, dtype="int64"),
            "tx_bytes": tx,
            "rx_bytes": rx,
            # ~1500-byte packets: packet counters are not used by the metrics under test.
            "tx_packets": tx // 1500,
            "rx_packets": rx // 1500,
        }
    )


def constant_rate_counters(
    rate_bps: float,
    duration_ms: float,
    sample_times_ns: np.ndarray | None = None,
    sample_ms: float = 1.0,
    node: int = 0,
) -> pd.DataFrame:
    """Counters of one node sending (and receiving) at a constant rate from t0."""
    if sample_times_ns is None:
        sample_times_ns = T0_NS + np.arange(0, int(duration_ms / sample_ms) + 1) * int(
            sample_ms * MS
        )
    bytes_per_ms = rate_bps / 8 / 1000
    knots = [(0.0, 0.0), (duration_ms, bytes_per_ms * duration_ms)]
    return piecewise_counters(node, knots, sample_times_ns)


def on_off_counters(
    on_bps: float,
    period_ms: float,
    on_ms: float,
    periods: int,
    sample_ms: float = 1.0,
    node: int = 0,
) -> pd.DataFrame:
    """Counters of a node sending at ``on_bps`` for the first ``on_ms`` of every period."""
    bytes_per_ms = on_bps / 8 / 1000
    knots, total = [], 0.0
    for p in range(periods):
        start = p * period_ms
        knots += [(start, total), (start + on_ms, total + bytes_per_ms * on_ms)]
        total += bytes_per_ms * on_ms
    knots.append((periods * period_ms, total))
    times = T0_NS + np.arange(0, int(periods * period_ms / sample_ms) + 1) * int(sample_ms * MS)
    return piecewise_counters(node, knots, times)


def make_ddp_cell(
    root: Path,
    *,
    strategy: str = "ddp",
    bw: str = "1gbit",
    repeat: int = 0,
    nodes: int = 2,
    step_ms: Sequence[float] = (120, 100, 100, 100, 100),
    bucket_bytes: Sequence[int] = (600_000, 400_000),
    param_bytes: int = 400_000,
    wire_factor: float = 1.05,
    warmup_steps: int = 1,
    sample_ms: float = 1.0,
    model: str = "gpt-tiny",
) -> Path:
    """Write a synthetic data-parallel cell directory under ``root``; return its path."""
    params = cell_params(
        strategy=strategy, model=model, nodes=nodes, bw=bw, steps=len(step_ms), repeat=repeat
    )
    world = nodes  # one rank per node
    cell_dir = Path(root) / cell_id(params)
    cell_dir.mkdir(parents=True, exist_ok=True)
    grad_bytes = int(sum(bucket_bytes))
    meta = {
        "cell": cell_id(params),
        "params": params,
        "world_size": world,
        "bw_bps": BW_BPS[bw],
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "warmup_steps": warmup_steps,
        "t0_ns": T0_NS,
    }
    (cell_dir / "cell.json").write_text(json.dumps(meta, indent=2))

    group = ",".join(str(r) for r in range(world))
    step_starts = 10 + np.concatenate([[0], np.cumsum(step_ms)[:-1]])
    ops, steps = [], []
    seq = {r: 0 for r in range(world)}

    def op_row(rank: int, step: int, phase: str, op: str, nbytes: int, t0: float, t1: float):
        seq[rank] += 1
        ops.append(
            {
                "rank": rank,
                "node": rank,
                "local_rank": 0,
                "step": step,
                "phase": phase,
                "op": op,
                "source": "c10d",
                "group": "default",
                "group_ranks": group,
                "group_size": world,
                "peer": -1,
                "dtype": "float32",
                "numel": nbytes // 4,
                "bytes": nbytes,
                "seq": seq[rank],
                "t_issue_ns": T0_NS + int(t0 * MS),
                "t_end_ns": T0_NS + int(t1 * MS),
            }
        )

    for rank in range(world):
        op_row(rank, -1, "other", "broadcast", param_bytes, 2, 6)
    for step, (start, dur) in enumerate(zip(step_starts, step_ms, strict=True)):
        for rank in range(world):
            enter, leave = start + rank, start + dur - (world - 1 - rank)
            steps.append((rank, step, "step", enter, leave))
            steps.append((rank, step, "fwd", enter + 1, start + 40))
            steps.append((rank, step, "bwd", start + 40, start + 75))
            steps.append((rank, step, "optim", start + 75, leave - 1))
            t = start + 50
            for b in bucket_bytes:
                op_row(rank, step, "bwd", "allreduce", b, t, t + 10)
                t += 10
            op_row(rank, step, "other", "barrier", 0, leave - 1, leave)

    ops_df = _add_params(pd.DataFrame(ops), params)
    steps_df = _add_params(
        pd.DataFrame(
            [
                {
                    "rank": r,
                    "node": r,
                    "step": s,
                    "phase": ph,
                    "t_start_ns": T0_NS + int(a * MS),
                    "t_end_ns": T0_NS + int(b * MS),
                }
                for r, s, ph, a, b in steps
            ]
        ),
        params,
    )

    # Wire: each node sends wire_factor x its ring share during +50..+70 ms of every step;
    # the broadcast root (node 0) sends the parameters to every other node at t0+2..6 ms.
    ring_share = 2 * (world - 1) / world * grad_bytes * wire_factor
    end_ms = float(step_starts[-1] + step_ms[-1] + 10)
    times = T0_NS + np.arange(-5 * MS, int(end_ms * MS) + 1, int(sample_ms * MS), dtype="int64")
    counters = []
    for node in range(world):
        tx_knots: list[tuple[float, float]] = [(-5, 0.0)]
        rx_knots: list[tuple[float, float]] = [(-5, 0.0)]
        bcast = param_bytes * wire_factor
        tx_bc = bcast * (world - 1) if node == 0 else 0.0
        rx_bc = 0.0 if node == 0 else bcast
        tx_knots += [(2, 0.0), (6, tx_bc)]
        rx_knots += [(2, 0.0), (6, rx_bc)]
        tx_total, rx_total = tx_bc, rx_bc
        for start in step_starts:
            tx_knots += [(start + 50, tx_total), (start + 70, tx_total + ring_share)]
            rx_knots += [(start + 50, rx_total), (start + 70, rx_total + ring_share)]
            tx_total += ring_share
            rx_total += ring_share
        tx_knots.append((end_ms, tx_total))
        rx_knots.append((end_ms, rx_total))
        counters.append(piecewise_counters(node, tx_knots, times, rx_knots_ms=rx_knots))
    counters_df = _add_params(pd.concat(counters, ignore_index=True), params)

    ops_df.to_parquet(cell_dir / "ops.parquet", index=False)
    steps_df.to_parquet(cell_dir / "steps.parquet", index=False)
    counters_df.to_parquet(cell_dir / "counters.parquet", index=False)
    return cell_dir


# --------------------------------------------------------------------------------------------
# Hybrid data x tensor parallel cells: the node mapping decides where the TP bytes go
# --------------------------------------------------------------------------------------------

# 2 nodes x 2 ranks (ranks 0, 1 on node 0; 2, 3 on node 1), dp=2 x tp=2. With TP innermost
# (mapping dp-tp) the TP groups sit inside a node; with DP innermost (tp-dp) they straddle it.
HYBRID_GROUPS: dict[bool, dict[str, list[list[int]]]] = {
    True: {"tp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]]},
    False: {"tp": [[0, 2], [1, 3]], "dp": [[0, 1], [2, 3]]},
}


def make_hybrid_cell(
    root: Path,
    *,
    tp_inside_node: bool = True,
    strategy: str | None = None,
    tp_bytes: int = 1_000_000,
    dp_bytes: int = 250_000,
    step_ms: Sequence[float] = (100, 100, 100, 100),
    warmup_steps: int = 1,
    bw: str = "1gbit",
    repeat: int = 0,
    with_group_kind: bool = True,
    warmup_extra_bytes: int = 5_000_000,
) -> Path:
    """Write a dp=2 x tp=2 cell on 2 nodes x 2 ranks under ``root``; return its directory.

    Every step, every rank all-reduces ``tp_bytes`` twice in its TP group (forward and
    backward) and ``dp_bytes`` once in its DP group (gradients). Before the steps (step -1)
    rank 0 broadcasts 3 MB to the world with its root recorded, and the warm-up steps carry an
    extra all-reduce of ``warmup_extra_bytes`` in the world group: neither may reach a
    per-step matrix. No counters are written (the matrix is a framework-level model).

    In a group of two a ring all-reduce sends the whole payload to the other member, so per
    step each node sends 2 x 2 x ``tp_bytes`` through its TP groups and 2 x ``dp_bytes``
    through its DP groups: on the node diagonal for the groups inside a node, off it for the
    groups across nodes.
    """
    strategy = strategy or ("dpxtp-tp-inside" if tp_inside_node else "dpxtp-tp-across")
    params = cell_params(
        strategy=strategy, nodes=2, ranks_per_node=2, bw=bw, steps=len(step_ms), repeat=repeat
    )
    world, rpn = 4, 2
    cell_dir = Path(root) / cell_id(params)
    cell_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "cell": cell_id(params),
        "params": params,
        "world_size": world,
        "bw_bps": BW_BPS[bw],
        "warmup_steps": warmup_steps,
        "t0_ns": T0_NS,
    }
    (cell_dir / "cell.json").write_text(json.dumps(meta, indent=2))

    groups = HYBRID_GROUPS[tp_inside_node]
    group_of = {(kind, r): g for kind, gs in groups.items() for g in gs for r in g}
    starts = 10 + np.concatenate([[0], np.cumsum(step_ms)[:-1]])
    ops: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []

    def op_row(
        rank: int,
        step: int,
        phase: str,
        op: str,
        nbytes: int,
        members: list[int],
        kind: str,
        t: float,
        root: int = -1,
    ) -> None:
        ops.append(
            {
                "rank": rank,
                "node": rank // rpn,
                "local_rank": rank % rpn,
                "step": step,
                "phase": phase,
                "op": op,
                "source": "c10d",
                "group": kind,
                "group_ranks": ",".join(map(str, members)),
                "group_size": len(members),
                "peer": -1,
                "root": root,
                "dtype": "float32",
                "numel": nbytes // 4,
                "bytes": nbytes,
                "bytes_out": nbytes,
                "seq": len(ops),
                "t_issue_ns": T0_NS + int(t * MS),
                "t_end_ns": T0_NS + int((t + 5) * MS),
                "group_kind": kind,
            }
        )

    world_group = list(range(world))
    for rank in range(world):
        op_row(rank, -1, "other", "broadcast", 3_000_000, world_group, "world", 2, root=0)
    for step, (start, dur) in enumerate(zip(starts, step_ms, strict=True)):
        for rank in range(world):
            steps.append(
                {
                    "rank": rank,
                    "node": rank // rpn,
                    "step": step,
                    "phase": "step",
                    "t_start_ns": T0_NS + int(start * MS),
                    "t_end_ns": T0_NS + int((start + dur) * MS),
                }
            )
            tp, dp = group_of[("tp", rank)], group_of[("dp", rank)]
            op_row(rank, step, "fwd", "allreduce", tp_bytes, tp, "tp", start + 10)
            op_row(rank, step, "bwd", "allreduce", tp_bytes, tp, "tp", start + 30)
            op_row(rank, step, "bwd", "allreduce", dp_bytes, dp, "dp", start + 50)
            if step < warmup_steps:
                op_row(
                    rank,
                    step,
                    "bwd",
                    "allreduce",
                    warmup_extra_bytes,
                    world_group,
                    "world",
                    start + 60,
                )
    ops_df = _add_params(pd.DataFrame(ops), params)
    if not with_group_kind:
        ops_df = ops_df.drop(columns="group_kind")
    ops_df.to_parquet(cell_dir / "ops.parquet", index=False)
    _add_params(pd.DataFrame(steps), params).to_parquet(cell_dir / "steps.parquet", index=False)
    return cell_dir
