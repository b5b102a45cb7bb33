"""Analysis at scale: `python benchmarks/analysis.py [--scales 0.1,0.3,1] [--source counters,bpf]`.

Builds a synthetic cell of ``--ops`` ops (1 M) and ``--samples`` wire samples (10 M) per scale
(scale 1 is that size, 0.1 a tenth), writes its trace directory as the parse step does, then
times, each in a fresh process so that its peak memory is its own:

- ``metrics``: :func:`commscope.metrics.compute_cell_metrics` (trace files in, the twelve
  metric tables out: what the per-cell Snakemake job runs);
- ``aggregate``: :func:`commscope.metrics.aggregate_cells` over that cell's metric tables (the
  concatenated tables and the study tables of :func:`derive_study_tables`);
- ``parse-bins`` (``--parse``, BPF source only): the raw BPF bins of every node to the cell's
  ``counters`` and ``wire_flows`` tables (:mod:`commscope.cell.wire`), as the parse step does.

Prints, per source, scale and stage, the wall time, the peak resident memory of the process
(imports included) and what the imports alone took, and the row counts of the largest tables.

The cell is a data x tensor parallel run on gloo, ``--nodes`` nodes (8) x 2 ranks: TP pairs
inside a node (8 all-reduces of 64 KiB per step and rank, never on the wire), DP rings across
the nodes (3 gradient buckets of 4, 2 and 1 MB; every node sends 2(n-1)/n of them to its ring
neighbour, plus ACKs), a world barrier closing each step and a parameter broadcast before the
first. Steps are as long as it takes for the run to hold the requested samples:

- ``counters`` source: the /proc sampler at 1 kHz per node (a sample every ms, 0-200 us late),
  so 10 M samples on 8 nodes are 1,250 s of training, 5,200 steps of 0.24 s;
- ``bpf`` source: the same run as the in-kernel accounting records it (sparse 100 us bins,
  ``resolution_ns``; the wire is busy 10 % of each step, so the sparse series holds as many
  samples as the sampler's) with its ``wire_flows`` table (one row per busy 100 us bin and
  node pair: data one way, ACKs the other).

Sockets: 16 TCP connections per node sampled at 10 Hz (``sockets.parquet``).

``--profile`` runs each stage under cProfile and prints its top functions; ``--keep DIR``
keeps the cells and metric tables there (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from commscope.config import cell_id
from commscope.contracts import CELL_TABLE_FILES, WIRE_FLOW_COLUMNS
from commscope.units import NS_PER_MS, NS_PER_S

T0_NS = 1_790_000_000_000_000_000
US = 1_000
# Where a kernel counter stands when the run starts: differencing must remove it.
COUNTER_BASE = 7_000_000_000
BPF_BIN_NS = 100 * US
SAMPLER_PERIOD_NS = NS_PER_MS
SOCKET_PERIOD_NS = 100 * NS_PER_MS
SETUP_NS = 2 * NS_PER_S  # rendezvous and the parameter broadcast before the first step
TEARDOWN_NS = NS_PER_S
WARMUP_STEPS = 2
RANKS_PER_NODE = 2
TP_OPS_PER_STEP = 8
TP_BYTES = 64 * 1024
DP_BUCKETS = (4_000_000, 2_000_000, 1_000_000)
PARAM_BYTES = 7_000_000
# Share of each step the DP all-reduces keep the wire busy (BPF bins are sparse elsewhere).
WIRE_BUSY = (0.60, 0.70)
# Frame, header and ACK arithmetic of MTU frames (1514 B on the wire for 1448 B of payload).
FRAME_PAYLOAD, FRAME_BYTES, ACK_BYTES = 1448, 1514, 66
SOCKETS_PER_NODE = 16
STAGES = ("parse-bins", "metrics", "aggregate")


@dataclass(frozen=True)
class CellShape:
    """The synthetic cell's size: what ``--ops``, ``--samples`` and ``--nodes`` come to."""

    nodes: int
    steps: int
    step_ns: int
    span_ns: int

    @property
    def world(self) -> int:
        """Ranks in the cell."""
        return self.nodes * RANKS_PER_NODE

    @property
    def first_step_ns(self) -> int:
        """When step 0 starts."""
        return T0_NS + SETUP_NS

    @classmethod
    def of(cls, ops: int, samples: int, nodes: int) -> CellShape:
        """The cell with about ``ops`` op records and ``samples`` counter rows."""
        world = nodes * RANKS_PER_NODE
        ops_per_step = world * (TP_OPS_PER_STEP + len(DP_BUCKETS) + 1)
        steps = max(WARMUP_STEPS + 2, round(ops / ops_per_step))
        span_ns = max(samples // nodes, 1_000) * SAMPLER_PERIOD_NS
        step_ns = (span_ns - SETUP_NS - TEARDOWN_NS) // steps
        if step_ns < 20 * NS_PER_MS:
            raise ValueError(f"{samples} samples leave {step_ns} ns per step: give more samples")
        return cls(nodes, steps, int(step_ns), int(span_ns))


def _params(shape: CellShape) -> dict[str, Any]:
    return {
        "strategy": "dp-tp",
        "model": "gpt-tiny",
        "nodes": shape.nodes,
        "ranks_per_node": RANKS_PER_NODE,
        "bw": "none",
        "delay": "0ms",
        "jitter": "0ms",
        "loss": "0pct",
        "cc": "cubic",
        "steps": shape.steps,
        "repeat": 0,
    }


def _with_params(frame: pd.DataFrame, params: dict[str, Any]) -> pd.DataFrame:
    """The cell's axes and id after the data, as the parse step appends them."""
    for axis, value in params.items():
        frame[axis] = value
    frame["cell"] = cell_id(params)
    return frame


def synthetic_ops(shape: CellShape, seed: int = 0) -> pd.DataFrame:
    """The cell's ops.parquet rows (without the parameter columns)."""
    rng = np.random.default_rng(seed)
    world, rpn, n = shape.world, RANKS_PER_NODE, shape.nodes
    rank = np.arange(world)
    node, local = rank // rpn, rank % rpn
    tp_group = [",".join(map(str, range(v * rpn, (v + 1) * rpn))) for v in range(n)]
    dp_group = [",".join(map(str, range(j, world, rpn))) for j in range(rpn)]
    world_group = ",".join(map(str, rank))
    # One template per rank and op slot of a step; tiled over the steps below.
    slots: list[dict[str, Any]] = []
    for i in range(TP_OPS_PER_STEP):
        slots.append(
            dict(op="allreduce", kind="tp", size=TP_BYTES, at=0.05 + 0.06 * i, dur=0.004, seq=i)
        )
    for j, size in enumerate(DP_BUCKETS):
        slots.append(
            dict(op="allreduce", kind="dp", size=size, at=WIRE_BUSY[0] + 0.03 * j, dur=0.03, seq=j)
        )
    slots.append(dict(op="barrier", kind="world", size=0, at=0.95, dur=0.002, seq=0))
    per_kind = {"tp": TP_OPS_PER_STEP, "dp": len(DP_BUCKETS), "world": 1}
    k = len(slots)
    steps = np.arange(shape.steps)
    s = np.repeat(steps, world * k)
    r = np.tile(np.repeat(rank, k), shape.steps)
    slot = np.tile(np.arange(k), shape.steps * world)
    op = np.array([d["op"] for d in slots], dtype=object)[slot]
    kind = np.array([d["kind"] for d in slots], dtype=object)[slot]
    size = np.array([d["size"] for d in slots], dtype=np.int64)[slot]
    at = np.array([d["at"] for d in slots])[slot]
    dur = np.array([d["dur"] for d in slots])[slot]
    seq = np.array([d["seq"] for d in slots], dtype=np.int64)[slot]
    seq = seq + s * np.array([per_kind[str(d["kind"])] for d in slots])[slot]
    seq = np.where(kind == "world", seq + 1, seq)  # the broadcast was the world group's 0
    n_node, n_local = node[r], local[r]
    groups = np.where(
        kind == "tp",
        np.array(tp_group, dtype=object)[n_node],
        np.where(kind == "dp", np.array(dp_group, dtype=object)[n_local], world_group),
    )
    group_id = np.where(
        kind == "tp",
        (1 + n_node).astype(str).astype(object),
        np.where(kind == "dp", (1 + n + n_local).astype(str).astype(object), "0"),
    )
    start = shape.first_step_ns + s * shape.step_ns
    issue = start + (at * shape.step_ns).astype(np.int64) + r * 5 * US
    issue += rng.integers(0, 20 * US, len(issue))
    end = issue + (dur * shape.step_ns).astype(np.int64)
    steps_ops = pd.DataFrame(
        {
            "rank": r,
            "node": n_node,
            "local_rank": n_local,
            "op": op,
            "source": "c10d",
            "group": group_id,
            "group_ranks": groups,
            "group_size": np.where(kind == "tp", rpn, np.where(kind == "dp", n, world)),
            "peer": -1,
            "root": -1,
            "dtype": "float32",
            "numel": size // 4,
            "bytes": size,
            "bytes_out": size,
            "split_bytes": None,
            "seq": seq,
            "step": s,
            "phase": np.where(kind == "world", "other", np.where(at < 0.3, "fwd", "bwd")),
            "t_issue_ns": issue,
            "t_end_ns": end,
        }
    )
    bcast = pd.DataFrame(
        {
            **{c: steps_ops[c].iloc[:world].to_numpy() for c in ("source", "dtype")},
            "rank": rank,
            "node": node,
            "local_rank": local,
            "op": "broadcast",
            "group": "0",
            "group_ranks": world_group,
            "group_size": world,
            "peer": -1,
            "root": 0,
            "numel": PARAM_BYTES // 4,
            "bytes": PARAM_BYTES,
            "bytes_out": PARAM_BYTES,
            "split_bytes": None,
            "seq": 0,
            "step": -1,
            "phase": "other",
            "t_issue_ns": T0_NS + NS_PER_S + rank * 5 * US,
            "t_end_ns": T0_NS + NS_PER_S + 300 * NS_PER_MS,
        }
    )
    out = pd.concat([bcast[steps_ops.columns], steps_ops], ignore_index=True)
    out["t_end_ns"] = out["t_end_ns"].astype("Int64")
    return out


def synthetic_steps(shape: CellShape) -> pd.DataFrame:
    """The cell's steps.parquet rows: step, fwd, bwd and optim phases per rank and step."""
    world = shape.world
    s = np.repeat(np.arange(shape.steps), world)
    r = np.tile(np.arange(world), shape.steps)
    start = shape.first_step_ns + s * shape.step_ns
    enter = start + r * 10 * US
    leave = start + shape.step_ns - (world - 1 - r) * 10 * US
    cuts = {
        "step": (enter, leave),
        "fwd": (enter + US, start + int(0.3 * shape.step_ns)),
        "bwd": (start + int(0.3 * shape.step_ns), start + int(0.9 * shape.step_ns)),
        "optim": (start + int(0.9 * shape.step_ns), leave - US),
    }
    frames = [
        pd.DataFrame(
            {
                "rank": r,
                "node": r // RANKS_PER_NODE,
                "step": s,
                "phase": phase,
                "t_start_ns": a,
                "t_end_ns": b,
            }
        )
        for phase, (a, b) in cuts.items()
    ]
    return pd.concat(frames, ignore_index=True).sort_values(["step", "rank"], kind="stable")


def _step_wire_bytes(shape: CellShape) -> tuple[float, float]:
    """Bytes on one node's link per step: (data it sends to its ring neighbour, ACKs it sends
    for the data it receives), frame bytes."""
    n = shape.nodes
    payload = RANKS_PER_NODE * sum(DP_BUCKETS) * 2 * (n - 1) / n
    frames = payload / FRAME_PAYLOAD
    return frames * FRAME_BYTES, frames / 2 * ACK_BYTES


def synthetic_sampler_counters(shape: CellShape, seed: int = 1) -> pd.DataFrame:
    """counters.parquet of the ``counters`` source: every node's /proc/net/dev at 1 kHz (a
    sample every ms, up to 200 us late), tx and rx each ramping during the busy part of every
    step (rx is what the ring's other neighbour sends)."""
    rng = np.random.default_rng(seed)
    data, acks = _step_wire_bytes(shape)
    per_step = data + acks
    starts = shape.first_step_ns + np.arange(shape.steps, dtype=np.int64) * shape.step_ns
    on = starts + int(WIRE_BUSY[0] * shape.step_ns)
    off = starts + int(WIRE_BUSY[1] * shape.step_ns)
    knots_t = np.concatenate(
        [[T0_NS], np.stack([on, off], axis=1).ravel(), [T0_NS + shape.span_ns]]
    )
    # Knot values: before "on" of step k the count is k x per_step, after "off" (k+1) x.
    k = np.arange(shape.steps)
    knots_v = np.concatenate(
        [
            [0.0],
            np.stack([k * per_step, (k + 1) * per_step], axis=1).ravel(),
            [shape.steps * per_step],
        ]
    )
    n_samples = shape.span_ns // SAMPLER_PERIOD_NS
    frames = []
    for node in range(shape.nodes):
        t = T0_NS + np.arange(n_samples, dtype=np.int64) * SAMPLER_PERIOD_NS
        t += rng.integers(0, 200 * US, n_samples)
        rel = (t - T0_NS).astype(np.float64)
        value = np.interp(rel, (knots_t - T0_NS).astype(np.float64), knots_v)
        tx = COUNTER_BASE + np.rint(value).astype(np.int64)
        rx = COUNTER_BASE // 2 + np.rint(value).astype(np.int64)
        frames.append(
            pd.DataFrame(
                {
                    "node": node,
                    "iface": "exp0",
                    "t_ns": t,
                    "tx_bytes": tx,
                    "rx_bytes": rx,
                    "tx_packets": tx // FRAME_BYTES,
                    "rx_packets": rx // FRAME_BYTES,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def _busy_bins(shape: CellShape) -> np.ndarray:
    """Start of every 100 us bin the wire is busy in (the same for every node), int64 ns."""
    starts = shape.first_step_ns + np.arange(shape.steps, dtype=np.int64) * shape.step_ns
    lo = (starts + int(WIRE_BUSY[0] * shape.step_ns)) // BPF_BIN_NS
    hi = (starts + int(WIRE_BUSY[1] * shape.step_ns)) // BPF_BIN_NS
    count = hi - lo + 1
    first = np.repeat(lo - np.concatenate([[0], np.cumsum(count)[:-1]]), count)
    return (first + np.arange(count.sum())) * BPF_BIN_NS


def _per_bin(per_step: float, bins: int, frame: int) -> int:
    """Bytes per busy bin: whole frames, at least one."""
    return max(int(round(per_step / bins / frame)), 1) * frame


def synthetic_bpf_tables(shape: CellShape) -> tuple[pd.DataFrame, pd.DataFrame]:
    """counters.parquet and wire_flows.parquet of the ``bpf`` source, as
    :func:`commscope.cell.wire.counters_from_bins` and ``flows_from_bins`` write them for an
    uncapped cell: per node a sample at the end of every busy bin, one at the start of a busy
    bin after an idle one, and the accounting's span; flows per busy bin and node pair."""
    data, acks = _step_wire_bytes(shape)
    bins = _busy_bins(shape)
    per_step_bins = len(bins) // shape.steps
    data_bin, ack_bin = (
        _per_bin(data, per_step_bins, FRAME_BYTES),
        _per_bin(acks, per_step_bins, ACK_BYTES),
    )
    after_idle = np.concatenate([[True], np.diff(bins) > BPF_BIN_NS])
    span = (T0_NS // BPF_BIN_NS * BPF_BIN_NS, (T0_NS + shape.span_ns) // BPF_BIN_NS * BPF_BIN_NS)
    times = np.unique(np.concatenate([[span[0]], bins[after_idle], bins + BPF_BIN_NS, [span[1]]]))
    # Cumulative bytes at each sample: the busy bins that ended by then.
    done = np.searchsorted(bins + BPF_BIN_NS, times, side="right")
    counters, flows = [], []
    for node in range(shape.nodes):
        tx_bytes = done * (data_bin + ack_bin)
        counters.append(
            pd.DataFrame(
                {
                    "node": node,
                    "iface": "exp0",
                    "t_ns": times,
                    "tx_bytes": tx_bytes,
                    "rx_bytes": tx_bytes,
                    "tx_packets": done * (data_bin // FRAME_BYTES + ack_bin // ACK_BYTES),
                    "rx_packets": done * (data_bin // FRAME_BYTES + ack_bin // ACK_BYTES),
                    "resolution_ns": np.int64(BPF_BIN_NS),
                }
            )
        )
        # Node n's ring neighbour is n - 1: data n -> n-1, its ACKs n-1 -> n.
        prev = (node - 1) % shape.nodes
        for src, dst, nbytes, frame in (
            (node, prev, data_bin, FRAME_BYTES),
            (prev, node, ack_bin, ACK_BYTES),
        ):
            flows.append(
                pd.DataFrame(
                    {
                        "t_ns": bins,
                        "src_node": src,
                        "dst_node": dst,
                        "bytes": np.int64(nbytes),
                        "packets": np.int64(nbytes // frame),
                    }
                )
            )
    flow_table = pd.concat(flows, ignore_index=True).sort_values(
        ["t_ns", "src_node", "dst_node"], kind="stable", ignore_index=True
    )
    return pd.concat(counters, ignore_index=True), flow_table[WIRE_FLOW_COLUMNS]


def synthetic_raw_bins(shape: CellShape) -> tuple[pd.DataFrame, dict[str, int]]:
    """Every node's raw wire.parquet rows (with ``node``, one clock) whose counters and flows
    are :func:`synthetic_bpf_tables`' (ingress rows only: egress to a cell peer is not used),
    and the address -> node map."""
    data, acks = _step_wire_bytes(shape)
    bins = _busy_bins(shape)
    per_step_bins = len(bins) // shape.steps
    data_bin, ack_bin = (
        _per_bin(data, per_step_bins, FRAME_BYTES),
        _per_bin(acks, per_step_bins, ACK_BYTES),
    )
    addr = {f"198.19.0.{2 + i}": i for i in range(shape.nodes)}
    name = {i: a for a, i in addr.items()}
    frames = []
    for node in range(shape.nodes):
        nxt, prev = (node + 1) % shape.nodes, (node - 1) % shape.nodes
        for peer, nbytes, frame in ((nxt, data_bin, FRAME_BYTES), (prev, ack_bin, ACK_BYTES)):
            frames.append(
                pd.DataFrame(
                    {
                        "t_ns": bins,
                        "hook": "ingress",
                        "peer": name[peer],
                        "bytes": np.int64(nbytes),
                        "packets": np.int64(nbytes // frame),
                        "skbs": np.int64(nbytes // frame),
                        "node": node,
                    }
                )
            )
    return pd.concat(frames, ignore_index=True), addr


def synthetic_sockets(shape: CellShape, seed: int = 2) -> pd.DataFrame:
    """sockets.parquet: ``SOCKETS_PER_NODE`` connections per node at 10 Hz, most to other
    nodes' addresses, two to the node's own (loopback: left out by the metrics)."""
    rng = np.random.default_rng(seed)
    n_samples = shape.span_ns // SOCKET_PERIOD_NS
    t = T0_NS + np.arange(n_samples, dtype=np.int64) * SOCKET_PERIOD_NS
    data, _ = _step_wire_bytes(shape)
    sent_per_sample = data / SOCKETS_PER_NODE * SOCKET_PERIOD_NS / shape.step_ns
    frames = []
    for node in range(shape.nodes):
        for c in range(SOCKETS_PER_NODE):
            peer = node if c < 2 else (node + 1 + c % (shape.nodes - 1)) % shape.nodes
            sent = np.rint(np.arange(n_samples) * sent_per_sample).astype(np.int64)
            retrans = np.cumsum(rng.random(n_samples) < 0.001).astype(np.int64)
            cols = {
                "node": node,
                "t_ns": t + rng.integers(0, 5 * NS_PER_MS, n_samples),
                "src": f"198.19.0.{2 + node}",
                "sport": 40_000 + c,
                "dst": f"198.19.0.{2 + peer}",
                "dport": 50_000 + c,
                "rtt_us": rng.integers(50, 400, n_samples),
                "rttvar_us": rng.integers(5, 50, n_samples),
                "min_rtt_us": np.full(n_samples, 40),
                "cwnd": rng.integers(10, 200, n_samples),
                "ssthresh": np.full(n_samples, 2_147_483_647),
                "snd_mss": np.full(n_samples, FRAME_PAYLOAD),
                "unacked": rng.integers(0, 30, n_samples),
                "lost": np.zeros(n_samples, dtype=np.int64),
                "retrans": np.zeros(n_samples, dtype=np.int64),
                "total_retrans": retrans,
                "bytes_sent": sent + retrans * FRAME_PAYLOAD,
                "bytes_acked": sent,
                "bytes_received": sent,
                "bytes_retrans": retrans * FRAME_PAYLOAD,
                "notsent_bytes": np.zeros(n_samples, dtype=np.int64),
                "delivery_rate_Bps": rng.integers(10**6, 10**9, n_samples),
                "pacing_rate_Bps": rng.integers(10**6, 10**9, n_samples),
            }
            frames.append(pd.DataFrame(cols))
    out = pd.concat(frames, ignore_index=True)
    for col in out.columns[6:]:
        out[col] = out[col].astype("UInt64")
    return out


def write_cell(root: Path, ops: int, samples: int, nodes: int, source: str) -> Path:
    """Write the synthetic cell's trace directory (the parse step's files) under ``root``; with
    the ``bpf`` source also every node's raw bins (``raw_bins.parquet``, with ``node``) and
    ``addr.json`` for the ``parse-bins`` stage. Returns the trace directory."""
    shape = CellShape.of(ops, samples, nodes)
    params = _params(shape)
    trace = Path(root) / "trace"
    trace.mkdir(parents=True, exist_ok=True)
    if source == "bpf":
        counters, flows = synthetic_bpf_tables(shape)
        raw, addr = synthetic_raw_bins(shape)
        raw.to_parquet(Path(root) / "raw_bins.parquet", index=False)
        (Path(root) / "addr.json").write_text(json.dumps(addr))
        wire = {"source": "bpf", "bin_ns": BPF_BIN_NS, "reason": None, "requested": "bpf"}
    else:
        counters = synthetic_sampler_counters(shape)
        flows = pd.DataFrame({c: pd.Series(dtype="int64") for c in WIRE_FLOW_COLUMNS})
        wire = {"source": "counters", "reason": None, "requested": "counters"}
    tables = {
        "ops": synthetic_ops(shape),
        "steps": synthetic_steps(shape),
        "counters": counters,
        "sockets": synthetic_sockets(shape),
        "wire_flows": flows,
    }
    for name, frame in tables.items():
        _with_params(frame, params).to_parquet(trace / CELL_TABLE_FILES[name], index=False)
    meta = {
        "cell": cell_id(params),
        "params": params,
        "world_size": shape.world,
        "backend": "gloo",
        "bw_bps": None,
        "param_bytes": PARAM_BYTES,
        "grad_bytes": sum(DP_BUCKETS),
        "warmup_steps": WARMUP_STEPS,
        "t0_ns": T0_NS,
        "t1_ns": T0_NS + shape.span_ns,
        "wire": wire,
        "links": {f"node{i}": {"iface": "exp0", "mtu": 1500, "tso": False} for i in range(nodes)},
    }
    (trace / CELL_TABLE_FILES["cell"]).write_text(json.dumps(meta, indent=2))
    return trace


# --------------------------------------------------------------------------------------------
# Stages, each run in a process of its own
# --------------------------------------------------------------------------------------------


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run_stage(
    stage: str, cell_root: Path, profile: bool, throughput_bins: str | None = None
) -> dict[str, Any]:
    """Run one stage on the cell under ``cell_root`` in this process; its time and memory.
    ``throughput_bins`` ("1,10,100"): what if the throughput table had only those widths."""
    from commscope import metrics
    from commscope.cell import wire
    from commscope.metrics import io

    if throughput_bins:
        io.THROUGHPUT_BIN_MS = tuple(float(b) for b in throughput_bins.split(","))

    base_mb = _peak_rss_mb()
    trace, out = cell_root / "trace", cell_root / "metrics"
    if stage == "metrics":

        def work() -> None:
            metrics.compute_cell_metrics(trace, out)
    elif stage == "aggregate":

        def work() -> None:
            metrics.aggregate_cells([out], cell_root / "aggregate")
    elif stage == "parse-bins":

        def work() -> None:
            bins = pd.read_parquet(cell_root / "raw_bins.parquet")
            addr = json.loads((cell_root / "addr.json").read_text())
            nodes = sorted(set(addr.values()))
            span = (int(bins["t_ns"].min()) - BPF_BIN_NS, int(bins["t_ns"].max()) + BPF_BIN_NS)
            wire.counters_from_bins(
                bins, BPF_BIN_NS, addr, {n: "exp0" for n in nodes}, {n: span for n in nodes}
            ).to_parquet(cell_root / "parsed_counters.parquet", index=False)
            wire.flows_from_bins(bins, addr, BPF_BIN_NS).to_parquet(
                cell_root / "parsed_flows.parquet", index=False
            )
    else:
        raise ValueError(f"unknown stage {stage}")
    profiler = cProfile.Profile() if profile else None
    start, cpu_start = time.perf_counter(), time.process_time()
    if profiler:
        profiler.runcall(work)
    else:
        work()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if profiler:
        stats = pstats.Stats(profiler, stream=sys.stderr)
        stats.sort_stats("cumulative").print_stats(30)
        stats.sort_stats("tottime").print_stats(20)
    return {
        "stage": stage,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "peak_mb": _peak_rss_mb(),
        "imports_mb": base_mb,
        "load_avg_1min": os.getloadavg()[0],
    }


def _stage_in_child(
    stage: str, cell_root: Path, profile: bool, throughput_bins: str | None
) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "_stage", stage, str(cell_root)]
    if profile:
        cmd.append("--profile")
    if throughput_bins:
        cmd.append(f"--throughput-bins={throughput_bins}")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if profile:
        print(done.stderr, file=sys.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"stage {stage} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _write_in_child(root: Path, ops: int, samples: int, nodes: int, source: str) -> None:
    """:func:`write_cell` in a process of its own (its memory is not the stages')."""
    if root.exists():
        shutil.rmtree(root)
    cmd = [sys.executable, __file__, "_write", str(root), str(ops), str(samples), str(nodes)]
    done = subprocess.run([*cmd, source], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"writing the cell failed:\n{done.stderr[-4000:]}")


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.read_metadata(path).num_rows if path.exists() else 0


def main(argv: list[str] | None = None) -> None:
    """Build the cells and time every stage; print one line per source, scale and stage."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--scales", default="0.1,0.3,1")
    parser.add_argument("--source", default="counters,bpf")
    parser.add_argument("--stages", default="metrics,aggregate")
    parser.add_argument("--parse", action="store_true", help="also time parse-bins (bpf)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--keep", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the results here too")
    parser.add_argument("--reuse", action="store_true", help="reuse the cells kept in --keep")
    parser.add_argument(
        "--throughput-bins",
        default=None,
        help="what if: the throughput table at these widths only (ms, e.g. 1,10,100; "
        "those under 1 ms cover only the zoomed step, as the table's 0.1 ms rows do)",
    )
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="csd-analysis-"))
    stages = [s for s in args.stages.split(",") if s]
    results = []
    print(
        f"{'source':9} {'scale':>5} {'ops':>9} {'samples':>10} {'stage':11} {'time s':>7} "
        f"{'cpu s':>6} {'peak MB':>8} {'imports MB':>10} {'load':>5}  rows"
    )
    try:
        for source in args.source.split(","):
            for scale in (float(x) for x in args.scales.split(",")):
                ops, samples = int(args.ops * scale), int(args.samples * scale)
                root = work / f"{source}-{scale:g}"
                if args.reuse and (root / "trace" / CELL_TABLE_FILES["cell"]).exists():
                    for old in ("metrics", "aggregate"):
                        shutil.rmtree(root / old, ignore_errors=True)
                else:
                    _write_in_child(root, ops, samples, args.nodes, source)
                trace = root / "trace"
                rows = {
                    name: _rows(trace / CELL_TABLE_FILES[name])
                    for name in ("ops", "counters", "wire_flows", "sockets")
                }
                todo = (["parse-bins"] if args.parse and source == "bpf" else []) + stages
                for stage in todo:
                    res = _stage_in_child(stage, root, args.profile, args.throughput_bins)
                    if stage == "metrics":
                        rows["throughput"] = _rows(root / "metrics" / "throughput.parquet")
                        rows["msg_sizes"] = _rows(root / "metrics" / "msg_sizes.parquet")
                    res.update(
                        source=source, scale=scale, ops=rows["ops"], samples=rows["counters"]
                    )
                    results.append({**res, "rows": dict(rows)})
                    print(
                        f"{source:9} {scale:5g} {rows['ops']:9d} {rows['counters']:10d} "
                        f"{stage:11} {res['seconds']:7.2f} {res['cpu_seconds']:6.1f} "
                        f"{res['peak_mb']:8.0f} {res['imports_mb']:10.0f} "
                        f"{res['load_avg_1min']:5.1f}  "
                        + " ".join(f"{k}={v}" for k, v in rows.items()),
                        flush=True,
                    )
                if not args.keep:
                    shutil.rmtree(root)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_write":
        _, _, root, ops, samples, nodes, source = sys.argv
        write_cell(Path(root), int(ops), int(samples), int(nodes), source)
    elif len(sys.argv) > 1 and sys.argv[1] == "_stage":
        bins = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--throughput-bins=")]
        result = _run_stage(
            sys.argv[2], Path(sys.argv[3]), "--profile" in sys.argv, bins[0] if bins else None
        )
        print(json.dumps(result))
    else:
        main()
