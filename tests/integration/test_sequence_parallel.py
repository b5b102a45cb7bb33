"""TP with Megatron sequence parallelism issues all-gathers and reduce-scatters, no all-reduce."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import torch.multiprocessing as mp

from .gloo import free_port

L, H, S, B, TP = 2, 64, 32, 4, 2
SPEC = {
    "plan": {"tp": -1, "sequence_parallel": True},
    "model": {"layers": L, "hidden": H, "heads": 4, "seq": S, "vocab": 256, "batch": B},
    "steps": 3,
}


def _rank(rank: int, port: int, out: str) -> None:
    import torch

    from commscope.workload.train import run

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(TP),
    )
    run(SPEC | {"out_dir": out, "pg_timeout_s": 60})


def test_sequence_parallel_ops(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, str(tmp_path))) for r in range(TP)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0
    ops = pd.concat(pd.read_parquet(tmp_path / f"ops_rank{r}.parquet") for r in range(TP))
    steady = ops[ops.step == 2]
    assert set(steady.op) == {"allgather", "reduce_scatter"}  # no all-reduce left
    assert set(steady.group_ranks) == {"0,1"}
    fp32 = 4
    for (_r, phase), rows in steady.groupby(["rank", "phase"]):
        ag = rows[rows.op == "allgather"]
        rs = rows[rows.op == "reduce_scatter"]
        # Each half of each block gathers the sequence before it and reduce-scatters after;
        # the stream is gathered once more on leaving the last block (forward; mirrored back).
        assert len(ag) == 2 * L + 1, phase
        assert len(rs) == 2 * L, phase
        assert set(ag.bytes) == {B * S // TP * H * fp32}  # a sequence shard
        assert set(rs.bytes) == {B * S * H * fp32}  # the full activation
