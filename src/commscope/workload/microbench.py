"""Collective microbenchmark run by torchrun on every node:
``python -m commscope.workload.microbench SPEC.json --tag T``.

For each op of the spec and each message size it runs warm-up and timed iterations, every timed
iteration preceded by a barrier so that all ranks start together, and records per rank and
iteration how long the op took on that rank (ns; on CUDA after ``torch.cuda.synchronize``).
Writes ``bench_rank{R}.parquet`` (columns :data:`BENCH_COLUMNS`) and ``bench_rank{R}.json``
into the spec's ``out_dir``.

Sizes follow nccl-tests' convention (``size`` = the bytes column of its output), float32:

============== ============================================ ==========================
op             size S is                                    per rank
============== ============================================ ==========================
allreduce      the buffer each rank reduces (in = out)      in S, out S
allgather      the gathered output                          in S/n, out S
reduce_scatter the input each rank contributes              in S, out S/n
alltoall       each rank's whole send buffer                in S (S/n per peer), out S
broadcast      the broadcast buffer (root: rank 0)          S
sendrecv       what rank 0 sends to its peer                S
============== ============================================ ==========================

``sendrecv`` is a one-way transfer from rank 0 to the first rank of the next node (so it always
crosses the network), acknowledged by a 4-byte reply that stops the sender's clock (osu_bw's
scheme: the latency term holds the ack's return trip), the P2P pattern of pipeline
parallelism; the other ranks idle during it and record nothing. nccl-tests' sendrecv exchanges
both ways at once; on gloo such an exchange was measured at half the cap per direction (the
pair serialises the two), so it would not measure the link. Every other op runs on all ranks.

Iteration count adapts to the size: one timed iteration measures the op (the maximum over
ranks, agreed by a tiny all-reduce), then ``clamp(budget_s / t, min_iters, max_iters)``
iterations are kept in total. Warm-up runs only while the expected time of one iteration is
below ``warmup_max_s``: a 64 MiB all-reduce at 50 Mbit/s takes 11 s, and what a warm-up warms
(connections, allocator) is already warm from the smaller sizes. Sizes whose expected time
(the last size's, scaled by size) exceeds ``max_op_s`` are skipped with every larger one, and
listed under ``skipped`` in the meta json: 64 MiB at 50 Mbit/s would cost 67 s for six ops.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist

from commscope.workload.entry import main, rank_device

OPS: tuple[str, ...] = (
    "allreduce",
    "allgather",
    "reduce_scatter",
    "alltoall",
    "broadcast",
    "sendrecv",
)
BENCH_COLUMNS = [
    "rank",
    "node",
    "op",
    "bytes",
    "numel",
    "group_size",
    "iteration",
    "warmup",
    "time_ns",
]
DTYPE_BYTES = 4  # float32

# Defaults of the spec keys (the config's `microbench:` block sets them in the pipeline).
SPEC_DEFAULTS: dict[str, Any] = {
    "ops": list(OPS),
    "sizes": [1024 * 4**i for i in range(9)],  # 1 KiB .. 64 MiB
    "warmup_iters": 1,
    "warmup_max_s": 1.0,
    "min_iters": 1,
    "max_iters": 20,
    "budget_s": 0.3,
    "max_op_s": 30.0,
    "pg_timeout_s": 300,
}


def size_numel(op: str, size: int, n: int) -> int:
    """Float32 elements of the buffer that defines ``size`` (see the module table), rounded
    down to a multiple of the group size ``n`` where the op splits it into n parts."""
    numel = max(int(size) // DTYPE_BYTES, 1)
    if op in ("allgather", "reduce_scatter", "alltoall"):
        numel = max(numel // n, 1) * n
    return numel


def iterations(t_first_s: float, budget_s: float, min_iters: int, max_iters: int) -> int:
    """Timed iterations for an op whose first timed iteration took ``t_first_s``."""
    if not t_first_s > 0:
        return max_iters
    # The epsilon keeps 0.3 / 0.05 (= 5.999...) at 6.
    return int(min(max(math.floor(budget_s / t_first_s + 1e-9), min_iters), max_iters))


def sendrecv_pair(world: int, ranks_per_node: int) -> tuple[int, int]:
    """The two ranks of the send/recv benchmark: rank 0 and the first rank of node 1."""
    if world <= ranks_per_node:
        raise ValueError("sendrecv across nodes needs at least 2 nodes")
    return 0, ranks_per_node


def _make_op(op: str, numel: int, n: int, peer: int, device: torch.device) -> Callable[[], None]:
    """A closure that runs one instance of ``op`` (buffers allocated once, outside the timing)."""
    if op == "allreduce":
        buf = torch.ones(numel, device=device)
        return lambda: dist.all_reduce(buf)
    if op == "allgather":
        shard = torch.ones(numel // n, device=device)
        out = torch.empty(numel, device=device)
        return lambda: dist.all_gather_single(out, shard)
    if op == "reduce_scatter":
        inp = torch.ones(numel, device=device)
        out = torch.empty(numel // n, device=device)
        return lambda: dist.reduce_scatter_tensor(out, inp)
    if op == "alltoall":
        inp = torch.ones(numel, device=device)
        out = torch.empty(numel, device=device)
        return lambda: dist.all_to_all_single(out, inp)
    if op == "broadcast":
        buf = torch.ones(numel, device=device)
        return lambda: dist.broadcast(buf, src=0)
    if op == "sendrecv":
        buf = torch.ones(numel, device=device)
        ack = torch.zeros(1, device=device)
        # One way, rank 0 to its peer, like a pipeline's activation send. (A simultaneous
        # exchange measured half the cap per direction on gloo: its pair serialises them.)
        # The receiver answers with a 4-byte ack so that the sender's clock sees the data
        # arrive: a small send returns as soon as the socket buffers it, and the receiver's
        # own clock starts whenever it leaves the barrier, after or before the data came.
        if dist.get_rank() < peer:

            def send_acked() -> None:
                dist.send(buf, peer)
                dist.recv(ack, peer)

            return send_acked

        def recv_acked() -> None:
            dist.recv(buf, peer)
            dist.send(ack, peer)

        return recv_acked
    raise ValueError(f"unknown microbenchmark op {op!r} (known: {', '.join(OPS)})")


def bench(
    spec: dict[str, Any], device: torch.device, node: int, ranks_per_node: int
) -> pd.DataFrame:
    """Run the whole benchmark on this rank (process group initialised); one row per iteration."""
    cfg = {**SPEC_DEFAULTS, **spec}
    rank, world = dist.get_rank(), dist.get_world_size()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    agree = torch.zeros(1, dtype=torch.float64, device=device)
    rows: list[tuple] = []
    skipped: list[dict[str, Any]] = []
    for op in cfg["ops"]:
        members = list(range(world))
        peer = -1
        if op == "sendrecv":
            members = list(sendrecv_pair(world, ranks_per_node))
            peer = members[1] if rank == members[0] else members[0]
        n = len(members)
        active = rank in members
        t_prev, size_prev = 0.0, 0
        for size in cfg["sizes"]:
            numel = size_numel(op, size, n)
            nbytes = numel * DTYPE_BYTES
            fn = _make_op(op, numel, n, peer, device) if active else None

            def once(iteration: int, warmup: bool, fn=fn, key=(op, nbytes, numel, n)) -> float:
                dist.barrier()
                if fn is None:
                    return 0.0
                sync()
                t0 = time.perf_counter_ns()
                fn()
                sync()
                dt = time.perf_counter_ns() - t0
                rows.append((rank, node, *key, iteration, warmup, dt))
                return dt / 1e9

            expected = t_prev * size / size_prev if size_prev else 0.0
            if expected > cfg["max_op_s"]:
                # Same decision on every rank: t_prev is the agreed (maximum) time.
                skipped.extend({"op": op, "bytes": int(sz)} for sz in cfg["sizes"] if sz >= size)
                break
            if expected <= cfg["warmup_max_s"]:
                for i in range(int(cfg["warmup_iters"])):
                    once(-1 - i, True)
            agree.fill_(once(0, False))
            # Every rank must run the same number of iterations: take the slowest rank's time.
            dist.all_reduce(agree, op=dist.ReduceOp.MAX)
            t_first = float(agree.item())
            total = iterations(
                t_first, cfg["budget_s"], int(cfg["min_iters"]), int(cfg["max_iters"])
            )
            for it in range(1, total):
                once(it, False)
            t_prev, size_prev = t_first, size
    table = pd.DataFrame(rows, columns=BENCH_COLUMNS)
    table.attrs["skipped"] = skipped
    return table


def run(spec: dict[str, Any]) -> Path:
    """Benchmark on this rank and write its results; returns the output directory."""
    out_dir = Path(spec["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    device, backend = rank_device(spec)
    timeout = timedelta(seconds=float(spec.get("pg_timeout_s", SPEC_DEFAULTS["pg_timeout_s"])))
    dist.init_process_group(backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", spec.get("ranks_per_node", 1)))
    node = int(os.environ.get("GROUP_RANK", spec.get("node", 0)))
    t0 = time.time_ns()
    table = bench(spec, device, node, ranks_per_node)
    t1 = time.time_ns()
    pd.DataFrame(table).to_parquet(out_dir / f"bench_rank{rank}.parquet", index=False)
    meta = {
        "rank": rank,
        "node": node,
        "world_size": world,
        "ranks_per_node": ranks_per_node,
        "backend": backend,
        "device": str(device),
        "hostname": socket.gethostname(),
        "torch": torch.__version__,
        "t_start_ns": t0,
        "t_end_ns": t1,
        "spec": {k: spec.get(k, v) for k, v in SPEC_DEFAULTS.items()},
        "skipped": table.attrs.get("skipped", []),
    }
    (out_dir / f"bench_rank{rank}.json").write_text(json.dumps(meta, indent=2))
    dist.barrier()
    dist.destroy_process_group()
    return out_dir


if __name__ == "__main__":
    main(run, __doc__)
